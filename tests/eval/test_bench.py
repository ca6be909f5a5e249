"""The benchmark harness on tiny models: every method runs, the JSON has every field, and the greedy identity
check fires on a deliberately corrupted output."""

import json
import subprocess
import sys
from pathlib import Path

import torch

from hf_dspark import DSparkDrafter
from hf_dspark.eval.bench import Method, markdown_table, plot, run_bench
from tests.conftest import tiny_target


class Tok:
    """The least a tokenizer must do for the harness (no chat template: plain encoding)."""

    chat_template = None

    def __call__(self, text):
        return {"input_ids": [ord(c) % 60 for c in text]}


PROMPTS = [("set-a", "hello world"), ("set-a", "abc def"), ("set-b", "the quick brown")]


def methods(model):
    torch.manual_seed(0)
    d = DSparkDrafter.from_target(model, block_size=3, target_layer_ids=[0, 2])
    ablation = DSparkDrafter.from_target(model, block_size=3, target_layer_ids=[0, 2], head_type="none")
    return [Method("plain"), Method("prompt-lookup-3", {"prompt_lookup_num_tokens": 3}),
            Method("dflash-ablation", drafter=ablation), Method("dspark", drafter=d),
            Method("dspark-k2", drafter=d, policy=2), Method("dspark+ngram", drafter=d, policy="auto", ngram=True)]


def test_every_method_every_field(tmp_path):
    model = tiny_target()
    res = run_bench(model, Tok(), methods(model), PROMPTS, max_new_tokens=12, warmup=1)
    assert set(res["methods"]) == {"plain", "prompt-lookup-3", "dflash-ablation", "dspark", "dspark-k2", "dspark+ngram"}
    for name, entry in res["methods"].items():
        assert set(entry) == {"all", "set-a", "set-b"}
        e = entry["all"]
        assert {"tokens_per_s", "speedup_median", "speedup_p25", "speedup_p75", "speedup_p10", "speedup_worst",
                "speedup_pooled", "mismatches"} <= set(e)
        assert e["mismatches"] == []
        per = e["speedup_per_prompt"]  # one ratio per prompt, against plain on the same prompt
        assert len(per) == len(PROMPTS) and e["speedup_worst"] == min(per) <= e["speedup_p10"] <= e["speedup_median"]
        if name not in ("plain", "prompt-lookup-3"):
            assert {"tau", "conditional_acceptance", "verify_lengths", "draft_time_s", "rounds", "drafted_rounds",
                    "ngram_rounds"} <= set(e)
            assert (e["ngram_rounds"] > 0) == (name == "dspark+ngram"), (name, e["ngram_rounds"])
            assert 0 < e["drafted_rounds"] <= e["rounds"]
    assert max(res["methods"]["dspark-k2"]["all"]["verify_lengths"]) <= 2
    # the profile the scheduler decoded with, its verification products included
    assert set(res["profiles"]) == {"dflash-ablation", "dspark", "dspark-k2", "dspark+ngram"}
    assert res["profiles"]["dspark+ngram"]["linear"] in ("stock", "weight_major")
    assert len(res["profiles"]["dspark+ngram"]["verify_time"]) == 4
    assert {"cpu", "cpu_id", "load", "threads", "torch", "transformers", "dtype"} <= set(res["environment"])
    assert set(res["environment"]["cpu_id"]) == {"vendor", "family", "model", "flags"}
    json.dumps(res, default=str)
    assert "dspark" in markdown_table(res)
    plot(res, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000

    # research/bench_docs.py: what docs/ keeps of a run (one row per prompt and method) and the merged plot
    (tmp_path / "results.json").write_text(json.dumps(res, default=str))
    subprocess.run([sys.executable, str(Path(__file__).parents[2] / "research" / "bench_docs.py"), str(tmp_path / "results.json"), "--compact",
                    str(tmp_path / "c_{}.json"), "--plot", str(tmp_path / "merged.png")], check=True)
    small = json.loads((tmp_path / "c_set-a_set-b.json").read_text())
    assert small["methods"] == json.loads(json.dumps(res["methods"], default=str))
    assert len(small["rows"]) == len(res["rows"]) and all("rounds" not in r for r in small["rows"] if r["method"] == "plain")
    d = next(r for r in small["rows"] if r["method"] == "dspark")
    orig = next(r for r in res["rows"] if r["method"] == "dspark" and r["prompt"] == d["prompt"])
    assert d["rounds"] == len(orig["rounds"]) and d["accepted"] == sum(x["accepted"] for x in orig["rounds"])
    assert (tmp_path / "merged.png").stat().st_size > 1000


def test_identity_check_fires_on_a_corrupted_output():
    model = tiny_target()

    def corrupt(m, i, out):
        if m.name == "dspark" and i == 1:
            out = out.clone()
            out[0, -1] = (out[0, -1] + 1) % 64
        return out

    res = run_bench(model, Tok(), methods(model), PROMPTS, max_new_tokens=8, warmup=0, check=corrupt)
    assert res["methods"]["dspark"]["all"]["mismatches"] == [1]
    assert "**NO: 1**" in markdown_table(res)


def test_sampled_runs_have_no_identity_claim():
    model = tiny_target()
    res = run_bench(model, Tok(), methods(model)[:4], PROMPTS[:2], max_new_tokens=8, do_sample=True, warmup=0)
    assert "mismatches" not in res["methods"]["dspark"]["all"]


def test_policy_names():
    from hf_dspark.eval.bench import policy_name
    from hf_dspark import DecodingOptions

    assert [policy_name(DecodingOptions.parse(t).verify_policy) for t in "all,scheduler,3,threshold:0.5,auto".split(",")] == [
        "dspark", "dspark+scheduler", "dspark-k3", "dspark-threshold-0.5", "dspark+auto"]
    from hf_dspark.eval.bench import dspark_methods

    ms = dspark_methods("scheduler, 2+ngram,all", drafter=None)
    assert [(m.name, m.policy, m.ngram) for m in ms] == [
        ("dspark+scheduler", "scheduler", False), ("dspark-k2+ngram", 2, True), ("dspark", "all", False)]



def test_referee_judges_mismatches_and_loads_lazily():
    """bf16/fp16 runs: a mismatch the referee calls a near-tie is not a failure, a far token is; the referee is
    loaded at the first mismatch only (referee.py is tested on its own in test_referee.py)."""
    from hf_dspark.eval.bench import identity_failures

    model = tiny_target(logit_scale=4.0)
    ms = methods(model)[:4:3]  # plain, dspark
    loads = []

    def corrupt(rank):
        def check(m, i, out):
            if m.name == "dspark" and i == 1:
                with torch.no_grad():
                    order = model(out[:, :-1]).logits[0, -1].argsort(descending=True)
                out = out.clone()
                out[0, -1] = order[rank]
            return out
        return check

    def loader():
        loads.append(1)
        return model

    clean = run_bench(model, Tok(), ms, PROMPTS, max_new_tokens=8, warmup=0, referee=loader)
    assert loads == [] and clean["methods"]["dspark"]["all"]["mismatches"] == []
    tie = run_bench(model, Tok(), ms, PROMPTS, max_new_tokens=8, warmup=0, check=corrupt(1), referee=loader,
                    tie_tolerance=100.0)
    e = tie["methods"]["dspark"]["all"]
    assert loads == [1] and e["mismatches"] == [1] and e["near_ties"] == [1] and identity_failures(e) == []
    assert e["off_argmax"] == 1 and "| 1 near-tie |" in markdown_table(tie) and "**NO" not in markdown_table(tie)
    assert tie["settings"]["identity"]["referee"] == "float32"
    far = run_bench(model, Tok(), ms, PROMPTS, max_new_tokens=8, warmup=0, check=corrupt(-1), referee=lambda: model,
                    tie_tolerance=0.0)
    assert identity_failures(far["methods"]["dspark"]["all"]) == [1] and "**NO: 1**" in markdown_table(far)


def test_holdout_prompts_are_the_ones_training_never_answers(tmp_path):
    from hf_dspark.eval.bench import load_prompts
    from hf_dspark.training.data import is_holdout, plan

    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"turns": [f"prompt {i}"]}) + "\n" for i in range(200)))
    held = load_prompts([str(path)], None, holdout=True)
    assert held and len(held) < 30
    assert [t for _, t in held] == [f"prompt {i}" for i in range(200) if is_holdout(f"chat:{i}")]
    trained = {p["prompt"] for _, p, _ in plan([str(path)])}
    assert not trained & {t for _, t in held}


def test_a_prompt_past_the_context_is_refused_before_any_method_runs():
    import pytest

    model = tiny_target()  # context 256
    calls = []
    real = model.generate
    model.generate = lambda *a, **k: calls.append(1) or real(*a, **k)
    with pytest.raises(ValueError, match=r"a set-a prompt is 300 tokens: with --max-new-tokens 12 it exceeds"):
        run_bench(model, Tok(), methods(model), [("set-a", "x" * 300)] + PROMPTS, max_new_tokens=12)
    assert calls == []


def test_the_static_compiled_peer_runs_and_matches_plain(tmp_path):
    """Plain generate with a static cache and torch.compile: same greedy tokens as plain; its first call (the
    compile) is reported apart from the timed runs."""
    from hf_dspark.eval.bench import static_cache

    model = tiny_target(layers=1, hidden=16, heads=2, kv_heads=1)
    res = run_bench(model, Tok(), [Method("plain"), static_cache(model)], PROMPTS[:2], max_new_tokens=6, warmup=1)
    assert res["methods"]["plain-static-compiled"]["all"]["mismatches"] == []
    assert set(res["warmup_seconds"]) == {"plain", "plain-static-compiled"}
    assert res["warmup_seconds"]["plain-static-compiled"] > res["warmup_seconds"]["plain"]  # it compiled there


def test_dspark_on_a_static_cache_runs_and_matches_plain():
    """`--static-cache`: the first DSpark policy on a static cache, eager: same greedy tokens as plain."""
    from hf_dspark import DSparkDrafter
    from hf_dspark.eval.bench import dspark_methods, static_cache

    model = tiny_target(layers=2, hidden=16, heads=2, kv_heads=1)
    drafter = DSparkDrafter.from_target(model, block_size=3, target_layer_ids=[0])
    method = static_cache(model, dspark_methods("all", drafter)[0], compiled=False)
    assert method.name == "dspark-static" and method.drafter is drafter and method.extra == {"disable_compile": True}
    res = run_bench(model, Tok(), [Method("plain"), method], PROMPTS[:2], max_new_tokens=6, warmup=1)
    assert res["methods"]["dspark-static"]["all"]["mismatches"] == []


def test_dspark_on_its_own_loop_runs_and_matches_plain(monkeypatch):
    """`--loops static`: the first DSpark policy on DSpark's own loop: same greedy tokens as plain."""
    from transformers import StaticCache

    from hf_dspark import DSparkDrafter
    from hf_dspark.decoding import loop
    from hf_dspark.eval import bench
    from hf_dspark.eval.bench import dspark_methods, on_loop

    model = tiny_target(layers=2, hidden=16, heads=2, kv_heads=1)
    drafter = DSparkDrafter.from_target(model, block_size=3, target_layer_ids=[0])
    method = on_loop(dspark_methods("all", drafter)[0], "static")
    assert (method.name, method.loop) == ("dspark@static", "static")
    made, reserved = [], []
    monkeypatch.setattr(loop, "StaticCache", lambda **kw: made.append(kw["max_cache_len"]) or StaticCache(**kw))
    monkeypatch.setattr(bench, "reserve", lambda m, n: reserved.append(n) or loop.reserve(m, n))
    res = run_bench(model, Tok(), [Method("plain"), method], PROMPTS[:2], max_new_tokens=6, warmup=1)
    assert res["methods"]["dspark@static"]["all"]["mismatches"] == []
    # one cache for the whole run, sized for its longest call before the warm-up, as the static-cache peers get
    assert reserved == [256] and len(made) == 1
