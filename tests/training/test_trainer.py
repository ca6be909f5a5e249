"""training/trainer.py: end-to-end τ gain, resumes (after a stop, a time limit, a grown stream, another total),
ablations on the same data, next stages, bf16, draft vocabularies and a 2-process accelerate run."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests._tiny import target_records, tiny_target

torch.set_num_threads(1)


# ---- end to end ------------------------------------------------------------------------------------------
def state(run) -> Path:
    """The run's newest checkpoint folder (checkpoint.py)."""
    from hf_dspark.training import checkpoint

    return checkpoint.latest(run)


def progress(run) -> dict:
    return json.loads((state(run) / "progress.json").read_text())


def test_tiny_training_raises_simulated_tau(tmp_path):
    from hf_dspark.training.trainer import TrainConfig, train

    t = tiny_target()
    recs = target_records(t, 48)
    cfg = TrainConfig(data="", output_dir=str(tmp_path / "run"), num_layers=1, markov_rank=16, batch_size=8,
                      num_anchors=8, max_steps=150, val_size=16, eval_every=150, save_every=150, lr=3e-3)
    res = train(cfg, target=t, records=recs)
    before, after = res["history"][0]["tau_greedy"], res["final_val"]["tau_greedy"]
    assert after > before + 1.0, (before, after)
    # checkpoint: a safetensors drafter that loads strictly and binds to the target
    from hf_dspark import DSparkDrafter

    d = DSparkDrafter.from_pretrained(state(tmp_path / "run") / "drafter", target=t)
    assert (tmp_path / "run" / "checkpoint-150" / "drafter" / "model.safetensors").exists()
    out = t.generate(torch.tensor([recs[0]["ids"][:6]]), assistant_model=d, max_new_tokens=12, do_sample=False)
    assert out.shape[1] == 18


def test_validation_reports_tau_per_source_and_pooled(tmp_path):
    from hf_dspark.training.trainer import TrainConfig, train

    t = tiny_target()
    recs = target_records(t, 24)
    for i, r in enumerate(recs):
        r["id"] = f"{'math' if i % 3 else 'chat'}:{i}#0"
    cfg = TrainConfig(data="", output_dir=str(tmp_path / "run"), num_layers=1, markov_rank=16, batch_size=4,
                      num_anchors=8, max_steps=2, val_size=3, eval_every=2, save_every=2)
    rec = train(cfg, target=t, records=recs)["final_val"]
    assert rec["val_blocks/math"] + rec["val_blocks/chat"] == rec["val_blocks"] > 0
    for law in ("tau_t1", "tau_greedy"):
        lo, hi = sorted((rec[f"{law}/math"], rec[f"{law}/chat"]))
        assert lo - 1e-6 <= rec[law] <= hi + 1e-6  # pooled τ is a blocks-weighted mean of the sources'


def test_resume_continues_from_saved_step(tmp_path):
    from hf_dspark.training.trainer import TrainConfig, train

    t = tiny_target()
    recs = target_records(t, 16, resp_len=16)
    kw = {"data": "", "output_dir": str(tmp_path / "run"), "num_layers": 1, "markov_rank": 8, "batch_size": 4, "num_anchors": 4,
              "val_size": 0, "eval_every": 0, "save_every": 3, "lr": 3e-3}
    train(TrainConfig(max_steps=6, time_limit=1e-9, **kw), target=t, records=recs)  # stops (and saves) at step 1
    resumed = train(TrainConfig(max_steps=6, **kw), target=t, records=recs)
    assert [h["step"] for h in resumed["history"]] == [2, 3, 4, 5, 6]


def test_accelerate_two_processes_match_single_process(tmp_path):
    script = Path(__file__).parents[1] / "_dist_train.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    single, multi = tmp_path / "single.json", tmp_path / "multi.json"
    subprocess.run([sys.executable, str(script), str(single)], check=True, env=env, capture_output=True, timeout=120)
    launcher = Path(sys.executable).parent / "accelerate"
    # `--cpu` makes accelerate launch ONE process; `--multi_gpu` starts 2 torchrun workers, which pick gloo on CPU.
    r = subprocess.run([str(launcher), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                        "--mixed_precision", "no", "--dynamo_backend", "no", str(script), str(multi)],
                       check=False, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = json.loads(single.read_text()), json.loads(multi.read_text())
    assert (a["processes"], b["processes"]) == (1, 2)
    assert len(a["loss"]) == len(b["loss"]) == 4
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-5)


def test_build_drafter_warm_starts_from_the_named_target_layers():
    """--warm-start reaches model/initialisation.warm_start (its own tests are there); without it, a random init."""
    from hf_dspark.training.features import base_model
    from hf_dspark.training.trainer import TrainConfig, build_drafter

    t = tiny_target()
    layers = base_model(t).layers
    d = build_drafter(t, TrainConfig(data="", output_dir="", num_layers=2, warm_start=[-1, 1]))
    assert torch.equal(d.layers[0].self_attn.q_proj.weight, layers[-1].self_attn.q_proj.weight)
    assert torch.equal(d.layers[1].mlp.up_proj.weight, layers[1].mlp.up_proj.weight)
    random_init = build_drafter(t, TrainConfig(data="", output_dir="", num_layers=2))
    assert not torch.equal(random_init.layers[0].self_attn.q_proj.weight, layers[-1].self_attn.q_proj.weight)
    with pytest.raises(ValueError, match="outside the target"):
        build_drafter(t, TrainConfig(data="", output_dir="", num_layers=1, warm_start=[9]))


def test_resume_gives_the_weights_of_an_uninterrupted_run(tmp_path):
    from hf_dspark.training.trainer import TrainConfig, train

    t = tiny_target()
    recs = target_records(t, 16, resp_len=16)
    kw = {"data": "", "num_layers": 1, "markov_rank": 8, "batch_size": 4, "num_anchors": 4, "val_size": 4,
          "eval_every": 2, "save_every": 3, "lr": 3e-3, "max_steps": 6}
    whole = train(TrainConfig(output_dir=str(tmp_path / "whole"), **kw), target=t, records=recs)["drafter"]
    train(TrainConfig(output_dir=str(tmp_path / "cut"), time_limit=1e-9, **kw), target=t, records=recs)  # stops at 1
    assert progress(tmp_path / "cut")["step"] == 1
    resumed = train(TrainConfig(output_dir=str(tmp_path / "cut"), **kw), target=t, records=recs)["drafter"]
    a, b = whole.state_dict(), resumed.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    steps = [json.loads(line)["step"] for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4, 5, 6]  # the curve spans both sessions
    with pytest.raises(ValueError, match="another run"):
        train(TrainConfig(output_dir=str(tmp_path / "cut"), **{**kw, "lr": 1e-3}), target=t, records=recs)


def test_stop_signal_saves_the_step_and_resume_matches(tmp_path, monkeypatch):
    """`kill <pid>` (SIGTERM) mid-run: the step in flight finishes, the run saves it and returns; resuming gives
    the uninterrupted run's weights. Handlers are restored afterwards."""
    import os
    import signal

    from hf_dspark.training import trainer
    from hf_dspark.training.trainer import TrainConfig, train

    t = tiny_target()
    recs = target_records(t, 16, resp_len=16)
    kw = {"data": "", "num_layers": 1, "markov_rank": 8, "batch_size": 4, "num_anchors": 4, "val_size": 4,
          "eval_every": 0, "save_every": 0, "lr": 3e-3, "max_steps": 5}
    whole = train(TrainConfig(output_dir=str(tmp_path / "whole"), **kw), target=t, records=recs)["drafter"]
    calls, blocks = [], trainer.sample_blocks

    def signalled(*a, **k):  # the signal arrives during the third step
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return blocks(*a, **k)

    monkeypatch.setattr(trainer, "sample_blocks", signalled)
    before = signal.getsignal(signal.SIGTERM)
    res = train(TrainConfig(output_dir=str(tmp_path / "cut"), **kw), target=t, records=recs)
    assert [h["step"] for h in res["history"]] == [1, 2, 3] and len(calls) == 3
    assert progress(tmp_path / "cut")["step"] == 3
    assert signal.getsignal(signal.SIGTERM) is before
    monkeypatch.setattr(trainer, "sample_blocks", blocks)
    resumed = train(TrainConfig(output_dir=str(tmp_path / "cut"), **kw), target=t, records=recs)["drafter"]
    a, b = whole.state_dict(), resumed.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_bf16_training_runs_and_restores_the_target_dtype(tmp_path):
    from hf_dspark.training.trainer import TrainConfig, train

    t = tiny_target()
    recs = target_records(t, 48)
    cfg = TrainConfig(data="", output_dir=str(tmp_path / "run"), num_layers=1, markov_rank=16, batch_size=8,
                      num_anchors=8, max_steps=150, val_size=16, eval_every=150, save_every=150, lr=3e-3,
                      precision="bf16")
    res = train(cfg, target=t, records=recs)
    assert res["final_val"]["tau_greedy"] > res["history"][0]["tau_greedy"] + 1.0
    assert t.dtype == torch.float32 and res["drafter"].dtype == torch.float32


# ---- runs that span sessions: a growing stream, safetensors-only state ---------------------------------------
def test_resume_over_a_grown_stream_matches_and_keeps_the_plan(tmp_path):
    from hf_dspark.training.trainer import TrainConfig, train

    t = tiny_target()
    recs = target_records(t, 24, resp_len=16)
    kw = {"data": "", "num_layers": 1, "markov_rank": 8, "batch_size": 4, "num_anchors": 4, "val_size": 4,
          "eval_every": 0, "save_every": 0, "lr": 3e-3, "epochs": 1.0}
    out = tmp_path / "run"
    train(TrainConfig(output_dir=str(out), time_limit=1e-9, **kw), target=t, records=recs[:12])  # session 1: 12 records
    saved = progress(out)
    assert saved["step"] == 1 and saved["total"] == 2  # planned on what session 1 had: 8 training records / 4
    res = train(TrainConfig(output_dir=str(out), **kw), target=t, records=recs)  # session 2: the stream grew
    assert [h["step"] for h in res["history"]] == [2]  # the plan (2 steps) is kept, not re-planned to 5
    # the state is safetensors and JSON only: no pickles, so it can be committed and resumed on a fresh machine
    files = [p for p in out.rglob("*") if p.is_file()]
    assert files and all(p.suffix in (".safetensors", ".json", ".jsonl") for p in files), files


def test_resume_under_another_mix_opens_an_epoch_at_the_resume_step(tmp_path):
    from hf_dspark.training.trainer import TrainConfig, train

    t = tiny_target()
    recs = target_records(t, 24, resp_len=16)
    for i, r in enumerate(recs):
        r["id"] = f"{'chat' if i % 3 == 0 else 'math'}:{i}"
    kw = {"data": "", "num_layers": 1, "markov_rank": 8, "batch_size": 4, "num_anchors": 4, "val_size": 2,
          "eval_every": 0, "save_every": 0, "lr": 3e-3, "max_steps": 4}
    out = tmp_path / "run"
    train(TrainConfig(output_dir=str(out), time_limit=1e-9, **kw), target=t, records=recs)
    assert [e.get("mix") for e in progress(out)["epochs"]] == [None]
    res = train(TrainConfig(output_dir=str(out), mix={"chat": 3}, **kw), target=t, records=recs)
    epochs = progress(out)["epochs"]
    assert [h["step"] for h in res["history"]] == [2, 3, 4]  # the schedule is the run's own: only the data changed
    assert epochs[0]["steps"] == 1 and (epochs[1]["start"], epochs[1]["mix"]) == (1, {"chat": 3.0})


def test_resume_with_another_max_steps_replans_from_the_saved_step(tmp_path):
    from hf_dspark.training.trainer import TrainConfig, lr_lambda, train

    t = tiny_target()
    recs = target_records(t, 24, resp_len=16)
    kw = {"data": "", "num_layers": 1, "markov_rank": 8, "batch_size": 4, "num_anchors": 4, "val_size": 4,
          "eval_every": 0, "save_every": 0, "lr": 3e-3}
    out = tmp_path / "run"
    first = train(TrainConfig(output_dir=str(out), max_steps=6, time_limit=1e-9, **kw), target=t, records=recs)
    assert progress(out)["step"] == 1
    with pytest.raises(ValueError, match="not past the saved step 1"):
        train(TrainConfig(output_dir=str(out), max_steps=1, **kw), target=t, records=recs)
    res = train(TrainConfig(output_dir=str(out), max_steps=4, **kw), target=t, records=recs)
    saved = progress(out)
    assert saved["step"] == saved["total"] == 4 and saved["replans"] == [{"at": 1, "from": 6, "total": 4}]
    assert [p.name for p in out.iterdir() if p.is_dir()] == ["checkpoint-4"]  # a save leaves only its own state
    f = lr_lambda(6, 0.04, saved["replans"])
    assert [h["lr"] for h in first["history"] + res["history"]] == pytest.approx([3e-3 * f(s) for s in (1, 2, 3, 4)])
    assert res["history"][-1]["lr"] == 0.0
    saved["step"] = 3  # a progress file from another save than optimizer/ (step 4): refused, not resumed from
    (state(out) / "progress.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="progress.json is damaged"):
        train(TrainConfig(output_dir=str(out), max_steps=4, **kw), target=t, records=recs)


def test_an_ablation_trains_on_the_reference_runs_batches_and_vocabulary(tmp_path):
    """same_data_as: a head ablation started after the stream grew still takes the reference run's epochs (its
    record counts, checked by digest) and draft vocabulary, not the grown stream's; other data settings are
    refused."""
    from safetensors.torch import load_file

    from hf_dspark.training.trainer import TrainConfig, train

    t = tiny_target()
    recs = target_records(t, 24, resp_len=16)
    kw = {"data": "", "num_layers": 1, "markov_rank": 8, "batch_size": 4, "num_anchors": 4, "val_size": 4,
          "eval_every": 0, "save_every": 0, "lr": 3e-3, "max_steps": 3, "draft_vocab": 12}
    ref, abl = tmp_path / "markov", tmp_path / "dflash"
    train(TrainConfig(output_dir=str(ref), **kw), target=t, records=recs[:12])  # 8 training records then
    train(TrainConfig(output_dir=str(abl), head="none", same_data_as=str(ref), **kw), target=t, records=recs)
    theirs, ours = (progress(d) for d in (ref, abl))
    assert ours["epochs"] == theirs["epochs"] and theirs["epochs"][0]["size"] == 8  # not the 20 records of now
    vocab = [load_file(state(d) / "drafter" / "model.safetensors")["draft_vocab"] for d in (ref, abl)]
    assert torch.equal(*vocab)
    alone = tmp_path / "alone"
    train(TrainConfig(output_dir=str(alone), head="none", **kw), target=t, records=recs)  # the control
    assert progress(alone)["epochs"][0]["size"] == 20
    control = load_file(state(alone) / "drafter" / "model.safetensors")["draft_vocab"]
    assert not torch.equal(control, vocab[0])  # the grown stream's vocabulary is another one
    with pytest.raises(ValueError, match="other data settings.*seed"):
        train(TrainConfig(output_dir=str(tmp_path / "x"), head="none", same_data_as=str(ref), **{**kw, "seed": 1}),
              target=t, records=recs)
    with pytest.raises(ValueError, match="not a training run"):
        train(TrainConfig(output_dir=str(tmp_path / "y"), same_data_as=str(tmp_path), **kw), target=t, records=recs)
    shutil.rmtree(ref)  # a resume has its own plan and vocabulary: the reference is not read again
    train(TrainConfig(output_dir=str(abl), head="none", same_data_as=str(ref), **{**kw, "max_steps": 3}), target=t,
          records=recs)


def test_init_from_starts_a_new_stage_where_the_last_one_ended(tmp_path):
    """init_from: a run that continues a finished one (new schedule, more data) starts from its weights and draft
    vocabulary, not from the grown data's; a drafter of another shape, or init_from with warm_start, is refused."""
    from hf_dspark import DSparkDrafter
    from hf_dspark.training.trainer import TrainConfig, build_drafter, train

    t = tiny_target()
    recs = target_records(t, 24, resp_len=16)
    kw = {"data": "", "num_layers": 1, "markov_rank": 8, "batch_size": 4, "num_anchors": 4, "val_size": 4,
          "eval_every": 3, "save_every": 0, "lr": 3e-3, "max_steps": 3, "draft_vocab": 12}
    first = train(TrainConfig(output_dir=str(tmp_path / "stage1"), **kw), target=t, records=recs[:12])
    done = DSparkDrafter.from_pretrained(state(tmp_path / "stage1") / "drafter", target=t)
    cfg = TrainConfig(output_dir=str(tmp_path / "stage2"), init_from=str(state(tmp_path / "stage1") / "drafter"), **kw)
    start = build_drafter(t, cfg)
    a, b = done.state_dict(), start.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # incl. the draft vocabulary
    second = train(cfg, target=t, records=recs)
    for k in ("tau_t1", "tau_greedy"):  # validation picks up where stage 1 ended
        assert second["history"][0][k] == pytest.approx(first["final_val"][k])
    with pytest.raises(ValueError, match="does not fit"):
        build_drafter(t, TrainConfig(**{**cfg.__dict__, "markov_rank": 4}))
    with pytest.raises(ValueError, match="give one"):
        build_drafter(t, TrainConfig(**{**cfg.__dict__, "warm_start": [0]}))
    with pytest.raises(ValueError, match="does not fit.*mask_token_id"):
        build_drafter(t, TrainConfig(**{**cfg.__dict__, "mask_token_id": 3}))
    with pytest.raises(ValueError, match="has draft vocabulary but draft_vocab=None"):
        train(TrainConfig(**{**cfg.__dict__, "output_dir": str(tmp_path / "v"), "draft_vocab": None}), target=t,
              records=recs)


def test_init_from_grows_the_draft_vocabulary_and_never_shrinks_it(tmp_path):
    """A next stage with a larger draft_vocab drafts everything init_from did plus the new data's most frequent other
    tokens; a resume keeps the vocabulary it saved (the data may grow; init_from's folder need not exist any more);
    fewer ids than init_from's are refused."""
    from collections import Counter

    from safetensors.torch import load_file

    from hf_dspark.training.plan import split
    from hf_dspark.training.trainer import TrainConfig, train

    t = tiny_target()
    recs = target_records(t, 24, resp_len=16)
    kw = {"data": "", "num_layers": 1, "markov_rank": 8, "batch_size": 4, "num_anchors": 4, "val_size": 4,
          "eval_every": 0, "save_every": 0, "lr": 3e-3, "max_steps": 2, "draft_vocab": 12}
    train(TrainConfig(output_dir=str(tmp_path / "stage1"), **kw), target=t, records=recs[:12])
    old = load_file(state(tmp_path / "stage1") / "drafter" / "model.safetensors")["draft_vocab"].tolist()
    init = str(state(tmp_path / "stage1") / "drafter")
    cfg = TrainConfig(output_dir=str(tmp_path / "stage2"), init_from=init, **{**kw, "draft_vocab": 20})
    out = train(cfg, target=t, records=recs)
    vocab = out["drafter"].draft_vocab.tolist()
    assert len(vocab) == 20 and set(old) <= set(vocab)
    # the ids added are the most frequent response tokens of stage 2's training records that stage 1 lacked
    train_recs, _ = split(recs, 4)
    counts = Counter(tok for r in train_recs for tok in r["ids"][r["n_prompt"]:] if tok not in old)
    added = sorted(set(vocab) - set(old))
    assert min(counts[a] for a in added) >= max((c for k, c in counts.items() if k not in added), default=0)
    assert load_file(state(tmp_path / "stage2") / "drafter" / "model.safetensors")["draft_vocab"].tolist() == vocab
    more = recs + [{**r, "id": f"more:{i}"} for i, r in enumerate(target_records(t, 8, resp_len=16, seed=5))]
    with pytest.raises(ValueError, match="drafts from 1[23] tokens; draft_vocab=6 would drop"):
        train(TrainConfig(**{**cfg.__dict__, "output_dir": str(tmp_path / "s"), "draft_vocab": 6}), target=t,
              records=recs)
    shutil.rmtree(tmp_path / "stage1")  # a resume reads its own checkpoint: the folder it began from may be gone
    again = train(TrainConfig(**{**cfg.__dict__, "max_steps": 3}), target=t, records=more)  # a resume
    assert again["drafter"].draft_vocab.tolist() == vocab


def test_a_run_record_without_its_state_is_not_overwritten(tmp_path):
    """A finished run committed without its state (metrics and config only) must not be restarted from scratch in
    place by rerunning its command: refused, pointing at --init-from."""
    from hf_dspark.training.trainer import TrainConfig, train

    t = tiny_target()
    recs = target_records(t, 12, resp_len=16)
    cfg = TrainConfig(data="", output_dir=str(tmp_path / "run"), num_layers=1, markov_rank=8, batch_size=4,
                      num_anchors=4, val_size=4, eval_every=0, save_every=0, max_steps=2)
    train(cfg, target=t, records=recs)
    shutil.rmtree(state(tmp_path / "run"))
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    with pytest.raises(ValueError, match="cannot be resumed.*--init-from"):
        train(cfg, target=t, records=recs)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before


def test_training_on_a_draft_vocabulary_raises_tau_and_drafts_losslessly(tmp_path):
    from hf_dspark import DSparkDrafter
    from hf_dspark.training.trainer import TrainConfig, train

    t = tiny_target()
    recs = target_records(t, 48)
    cfg = TrainConfig(data="", output_dir=str(tmp_path / "run"), num_layers=1, markov_rank=16, batch_size=8,
                      num_anchors=8, max_steps=150, val_size=16, eval_every=150, save_every=150, lr=3e-3,
                      draft_vocab=40)
    res = train(cfg, target=t, records=recs)
    assert res["final_val"]["tau_greedy"] > res["history"][0]["tau_greedy"] + 1.0
    d = DSparkDrafter.from_pretrained(state(tmp_path / "run") / "drafter", target=t)
    assert d.draft_vocab is not None and 40 <= d.draft_vocab.numel() <= 41  # + EOS
    prompt = torch.tensor([recs[0]["ids"][:6]])
    plain = t.generate(prompt, max_new_tokens=24, do_sample=False)
    assert torch.equal(t.generate(prompt, assistant_model=d, max_new_tokens=24, do_sample=False), plain)
