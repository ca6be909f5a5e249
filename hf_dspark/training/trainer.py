"""`hf-dspark train`: the training loop of a DSpark drafter for a frozen target on target-regenerated data.

Built on `accelerate`: the same command runs single-process or under `accelerate launch` (each process takes
its share of every global batch; loss denominators are all-reduced, so gradients equal the single-process
ones on the same global batch). AdamW, linear warmup + cosine (`schedule`), global-norm clipping, safetensors
checkpoints (`checkpoint`), resumable from `<out>` over a training stream that may grow between resumes
(`plan.DataPlan`), a record of every logged step (`metrics`), and simulated τ on a held-out validation split.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..io.loading import load_target
from ..decoding.assistant import DSparkDrafter
from ..model.initialisation import differences, init_from, warm_start
from . import checkpoint, metrics
from .anchors import sample_blocks
from .data import eos_ids, source_of
from .features import FeatureSource, base_model
from .losses import LossWeights, combine, weighted_sums
from .objective import DraftObjective, simulated_tau
from .plan import (DataPlan, anchor_generators, collate, frequent_tokens, grown_vocabulary, load_records,
                   same_data, split)
from .schedule import lr_lambda, plan_schedule
from .signals import StopSignal, must_stop


@dataclass
class TrainConfig:
    data: str
    output_dir: str
    target: str | None = None
    head: str = "markov"
    num_layers: int = 2
    taps: list[int] | None = None
    markov_rank: int = 64
    block_size: int = 7
    mask_token_id: int | None = None
    batch_size: int = 8  # sequences per optimizer step (global)
    num_anchors: int = 64  # blocks per sequence per step: the target's features are paid once per sequence
    lr: float = 6e-4
    weight_decay: float = 0.0
    warmup: float = 0.04
    clip: float = 1.0
    epochs: float = 1.0
    max_steps: int | None = None
    max_length: int = 512
    val_size: int = 32
    eval_every: int = 50
    save_every: int = 100
    cache_dir: str | None = None
    max_shard_size: str | None = None  # split saved weight files at this size (None: transformers' default)
    seed: int = 0
    threads: int | None = None
    log_every: int = 1
    time_limit: float | None = None  # minutes; stop (and save) once the next step would exceed it
    precision: str = "fp32"  # "bf16": target features in bf16 and the drafter's step under bf16 autocast
    warm_start: list[int] | None = None  # target layers copied into the drafter's layers (None: random init)
    draft_vocab: int | None = None  # train (and draft) on the N most frequent response tokens (+ EOS) only
    same_data_as: str | None = None  # another run's folder: train on its batches and draft vocabulary (ablations)
    init_from: str | None = None  # a drafter folder to start from (its weights and draft vocabulary): a next stage
    mix: dict[str, float] | None = None  # {source: weight} of the epochs it opens (plan.DataPlan); None: the stream's own


# What fixes a run's trajectory: a resumed run must agree on these, or its schedule and data order are another run's.
_SCHEDULE_KEYS = ("data", "head", "num_layers", "taps", "markov_rank", "block_size", "batch_size", "num_anchors",
                  "lr", "weight_decay", "warmup", "epochs", "max_length", "val_size", "seed", "warm_start",
                  "draft_vocab", "same_data_as", "init_from")
# (not precision: a run that is resumed elsewhere may land on a CPU without native bf16; not max_steps: another total on
# a resume re-plans the rest of the schedule, `schedule.plan_schedule`; not mix: another mixture on a resume opens a
# new epoch at the resume step, `plan.DataPlan.replan`)


def build_drafter(target, cfg: TrainConfig, initialise: bool = True) -> DSparkDrafter:
    """The drafter a run with `cfg` starts from: the target's shape with cfg's overrides, initialised at random,
    from the target's layers (warm_start) or from a trained drafter (init_from); only the shape if not `initialise`
    (a resume, whose checkpoint holds the weights)."""
    over = {"block_size": cfg.block_size, "num_hidden_layers": cfg.num_layers, "head_type": cfg.head,
            "markov_rank": cfg.markov_rank, "confidence_head": cfg.head != "none"}
    if cfg.taps:
        over["target_layer_ids"] = list(cfg.taps)
    if cfg.mask_token_id is not None:
        over["mask_token_id"] = cfg.mask_token_id
    drafter = DSparkDrafter.from_target(target, **over)
    if cfg.warm_start is not None and cfg.init_from is not None:
        raise ValueError("warm_start and init_from both initialise the drafter: give one")
    if initialise and cfg.warm_start is not None:
        warm_start(drafter, base_model(target), cfg.warm_start)
    if initialise and cfg.init_from is not None:
        init_from(drafter, cfg.init_from)
    return drafter


@dataclass
class _Run:
    """What the loop works on: one run's accelerator, prepared objective and optimiser, data and record."""

    cfg: TrainConfig
    acc: object
    objective: DraftObjective  # prepared by `acc`
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    feats: FeatureSource
    plan: DataPlan
    val_recs: list[dict]
    weights: LossWeights
    pad_id: int
    out: Path
    history: list[dict] = field(default_factory=list)

    @property
    def drafter(self) -> DSparkDrafter:
        return self.acc.unwrap_model(self.objective).drafter

    def autocast(self):
        # torch.autocast, not accelerate's mixed_precision: that is fixed per process by its AcceleratorState.
        return torch.autocast(self.acc.device.type, dtype=torch.bfloat16, enabled=self.cfg.precision == "bf16")


def train(cfg: TrainConfig, target=None, records: list[dict] | None = None, accelerator=None) -> dict:
    """Train a drafter; returns {"drafter", "history", "final_val"}. `target`/`records` may be passed in
    (tests) instead of loaded from cfg.target / cfg.data."""
    acc = _accelerator(cfg, accelerator)
    target = _frozen_target(cfg, target, acc)
    target_dtype, pad_id = target.dtype, target.generation_config.pad_token_id or 0
    train_recs, val_recs = _split_records(cfg, records)
    out = Path(cfg.output_dir)
    state, saved = _saved_state(out)
    # a resume takes its weights and draft vocabulary from its checkpoint (_resume): the drafter folder the run began
    # from (init_from) need not exist any more. float(): a warm start copies the target's weights in their dtype
    drafter = build_drafter(target, cfg, initialise=saved is None).float().train()
    same = same_data(cfg) if cfg.same_data_as and saved is None else None  # a resume has its own plan and vocab
    if saved is None:
        _fix_draft_vocab(cfg, drafter, same, train_recs, target)
    if cfg.precision == "bf16":  # features (and the frozen shared LM head) in bf16; the drafter keeps float32 weights
        target.to(torch.bfloat16)
    feats = FeatureSource(target, drafter.config.target_layer_ids, cfg.cache_dir)
    objective, opt, sched = _optimisation(cfg, acc, drafter, saved, len(train_recs))
    step, epochs = 0, (same["epochs"] if same else None)
    if saved is not None:
        step, epochs = _resume(cfg, acc, state, saved, objective, opt, sched)
    plan = DataPlan(train_recs, cfg.batch_size, cfg.seed, epochs, cfg.mix)
    if saved is not None and plan.replan(step):
        acc.print(f"the mixture changed: epoch {len(plan.epochs) - 1} opens at step {step} on {len(train_recs)} "
                  f"records with weights {cfg.mix or 'of the stream'}")
    run = _Run(cfg, acc, objective, opt, sched, feats, plan, val_recs, LossWeights.dflash() if cfg.head == "none" else LossWeights(), pad_id, out)
    _open_record(run, step)
    _loop(run, step)
    target.to(target_dtype)
    final = next((h for h in reversed(run.history) if "tau_t1" in h), {})
    return {"drafter": run.drafter, "history": run.history, "final_val": final}


# ---- the run's steps, in order ---------------------------------------------------------------------------
def _accelerator(cfg: TrainConfig, accelerator):
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be 'fp32' or 'bf16', got {cfg.precision!r}")
    acc = accelerator or Accelerator(cpu=not torch.cuda.is_available())
    set_seed(cfg.seed)
    return acc


def _frozen_target(cfg: TrainConfig, target, acc):
    if target is None:
        target, _ = load_target(cfg.target, torch.float32, "cpu")
    target.requires_grad_(False)
    return target.to(acc.device)


def _split_records(cfg: TrainConfig, records: list[dict] | None) -> tuple[list[dict], list[dict]]:
    records = records if records is not None else load_records(cfg.data, cfg.max_length)
    train_recs, val_recs = split(records, cfg.val_size)
    if not train_recs:
        raise ValueError(f"no training sequences in {cfg.data or 'the records given'}: {len(records)} answers, of which "
                         f"--val-size {cfg.val_size} (and every answer to their prompts) went to validation; give more "
                         "answers or a smaller --val-size" if records else f"no answers in {cfg.data}")
    return train_recs, val_recs


def _saved_state(out: Path) -> tuple[Path | None, dict | None]:
    """(the newest checkpoint of `out`, its verified progress), or (None, None) for a new run."""
    state = checkpoint.latest(out)
    saved = checkpoint.verify(state) if state is not None else None
    logged = metrics.logged_steps(out)
    if saved is None and any(s > 0 for s in logged):  # a committed record of a run, without its state
        raise ValueError(f"{out} holds a run's metrics up to step {max(logged)} but no {checkpoint.PREFIX}<step>/ "
                         "state: it cannot be resumed, and starting afresh would overwrite its record; train into "
                         "another --output-dir (to continue from a drafter: --init-from)")
    return state, saved


def _fix_draft_vocab(cfg: TrainConfig, drafter: DSparkDrafter, same: dict | None, train_recs: list[dict],
                     target) -> None:
    """The draft vocabulary is fixed at the run's start: init_from's (grown to cfg.draft_vocab ids with the training
    records' most frequent others, if that is more), same_data_as's, or the training records' most frequent tokens
    (a resume loads the saved one: the data may have grown since)."""
    if cfg.init_from is not None and bool(cfg.draft_vocab) != (drafter.draft_vocab is not None):
        raise ValueError(f"init_from={cfg.init_from} {'has' if drafter.draft_vocab is not None else 'has no'} draft "
                         f"vocabulary but draft_vocab={cfg.draft_vocab}: give the setting it was trained with")
    if same and same["draft_vocab"] is not None and drafter.draft_vocab is not None \
            and not torch.equal(same["draft_vocab"], drafter.draft_vocab.cpu()):
        raise ValueError(f"init_from={cfg.init_from} and same_data_as={cfg.same_data_as} have other draft vocabularies")
    if cfg.draft_vocab and drafter.draft_vocab is None:
        drafter.set_draft_vocab(same["draft_vocab"] if same else
                                frequent_tokens(train_recs, cfg.draft_vocab, eos_ids(target)))
    elif cfg.init_from is not None and cfg.draft_vocab:
        have = drafter.draft_vocab.numel()
        if have > cfg.draft_vocab + 1:  # a vocabulary of N is the N most frequent tokens, + EOS where it was not one
            raise ValueError(f"init_from={cfg.init_from} drafts from {have} tokens; draft_vocab={cfg.draft_vocab} "
                             f"would drop tokens it was trained on: give {have} or more (more adds the training "
                             "data's most frequent other tokens)")
        if have < cfg.draft_vocab:
            drafter.set_draft_vocab(grown_vocabulary(drafter.draft_vocab.tolist(), train_recs, cfg.draft_vocab))


def _optimisation(cfg: TrainConfig, acc, drafter: DSparkDrafter, saved: dict | None, n_train: int):
    """→ (objective, AdamW, lr scheduler), the first two prepared by `acc`. The schedule is planned once, for the
    whole run (a resume over grown data keeps it; --max-steps re-plans it)."""
    objective = DraftObjective(drafter)
    first_total, replans = plan_schedule(saved, cfg.max_steps,
                                         max(1, int(cfg.epochs * max(1, n_train // cfg.batch_size))), acc.print)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=cfg.lr,
                            weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(first_total, cfg.warmup, replans))
    # The scheduler is NOT prepared: accelerate would step it once per process, but our steps are global.
    objective, opt = acc.prepare(objective, opt)
    return objective, opt, sched


def _resume(cfg: TrainConfig, acc, state: Path, saved: dict, objective, opt, sched) -> tuple[int, list | None]:
    """Load a verified checkpoint of the same run → (its step, its data plan's epochs)."""
    _check_same_run(state, cfg)
    init_from(acc.unwrap_model(objective).drafter, state / "drafter")
    checkpoint.load(state, opt, sched)
    acc.print(f"resumed from {state} at step {saved['step']}/{sched.lr_lambdas[0].total}"
              + (" (a slim checkpoint: AdamW's moments restart from zero)" if checkpoint.is_slim(state) else ""))
    return saved["step"], saved.get("epochs")


def _check_same_run(state: Path, cfg: TrainConfig) -> None:
    """Refuse to resume a run under another schedule (lr plan, data order, model shape)."""
    diff = differences(checkpoint.config_of(state), cfg, _SCHEDULE_KEYS)
    if diff:
        raise ValueError(f"{state.parent} holds another run (saved vs now: {diff}); resume with the same settings "
                         "or use a new --output-dir")


def _open_record(run: _Run, step: int) -> None:
    if run.acc.is_main_process:
        run.out.mkdir(parents=True, exist_ok=True)
        (run.out / "train_config.json").write_text(json.dumps(run.cfg.__dict__, indent=2))  # the run's record
        metrics.keep_until(run.out, step)  # steps logged after the checkpoint by a killed run are redone, not doubled


# ---- the loop --------------------------------------------------------------------------------------------
def _loop(run: _Run, step: int) -> None:
    """Optimizer steps from `step` to the planned total: evaluate, log and save on their schedules; stop (and save)
    on a stop signal or before the time limit."""
    cfg, acc = run.cfg, run.acc
    total = run.sched.lr_lambdas[0].total
    bar = tqdm(total=total, initial=step, desc="train", disable=not acc.is_main_process)
    t0 = time.perf_counter()
    if step == 0 and cfg.eval_every:
        with run.autocast():
            run.history.append({"step": 0, **evaluate(acc.unwrap_model(run.objective), run.feats, run.val_recs, cfg,
                                                      run.pad_id)})
        _log(run, run.history[-1], bar)
    start = step
    with StopSignal() as stop:  # `kill <pid>`: finish the step, save, return
        while step < total:
            if step > 0 and must_stop(acc, t0, step - start, cfg.time_limit, stop.received):
                why = "a stop signal" if stop.received else f"the time limit of {cfg.time_limit} min"
                acc.print(f"{why} reached at step {step}/{total}; saving")
                _save(run, step)
                break
            rec = _step(run, step, t0)
            step += 1
            bar.update(1)
            if cfg.eval_every and (step % cfg.eval_every == 0 or step == total):
                with run.autocast():
                    rec.update(evaluate(acc.unwrap_model(run.objective), run.feats, run.val_recs, cfg, run.pad_id))
            run.history.append(rec)
            if step % cfg.log_every == 0 or "tau_t1" in rec:
                _log(run, rec, bar)
            if step == total or (cfg.save_every and step % cfg.save_every == 0):
                _save(run, step)
    bar.close()


def _step(run: _Run, step: int, t0: float) -> dict:
    """One optimizer step on this process's share of global batch `step` → its record."""
    cfg, acc = run.cfg, run.acc
    epoch, batch = run.plan.batch(step)
    mine = batch[acc.process_index :: acc.num_processes]  # this process's share of the global batch
    f, last, blocks = _inputs(mine, run.pad_id, acc.device, run.feats, cfg, run.drafter.config.mask_token_id, epoch)
    with run.autocast():
        terms = run.objective(f, last, blocks)
    sums, denom = weighted_sums(terms, terms["valid"], run.weights.decay)
    global_denom = acc.reduce(denom.detach(), "sum").clamp(min=1e-8)
    # DDP averages gradients over processes: scale by their number so the result is Σ/Σ over the global batch.
    loss = combine({k_: v / global_denom for k_, v in sums.items()}, run.weights) * acc.num_processes
    run.opt.zero_grad(set_to_none=True)
    acc.backward(loss)
    gnorm = acc.clip_grad_norm_(run.objective.parameters(), cfg.clip)
    run.opt.step()
    run.sched.step()
    return {"step": step + 1, "loss": float(acc.reduce(loss.detach(), "sum")) / acc.num_processes,
            **{k_: float(acc.reduce(v.detach(), "sum") / global_denom) for k_, v in sums.items()},
            "grad_norm": float(gnorm), "lr": run.sched.get_last_lr()[0], "elapsed_s": time.perf_counter() - t0,
            "precision": cfg.precision}


def _inputs(recs: list[dict], pad_id: int, device, feats: FeatureSource, cfg: TrainConfig, mask_token_id: int,
            epoch: int):
    """Records → (the target's features, its last hidden state, the sampled blocks) on `device`."""
    ids, mask, lengths, keys = collate(recs, pad_id)
    ids, mask, lengths = ids.to(device), mask.to(device), lengths.to(device)
    f, last = feats(keys, ids, lengths)
    blocks = sample_blocks(ids, mask, lengths, cfg.num_anchors, cfg.block_size, mask_token_id,
                           anchor_generators(keys, cfg.seed, epoch))
    return f, last, blocks


def _log(run: _Run, rec: dict, bar) -> None:
    if not run.acc.is_main_process:
        return
    metrics.append(run.out, rec)
    show = {k: f"{v:.3f}" for k, v in rec.items() if k in ("loss", "ce", "l1", "conf", "tau_t1", "tau_greedy")}
    bar.set_postfix(show)
    if "tau_t1" in rec:
        per_source = "".join(f"; {k.split('/', 1)[1]} {v:.2f}/{rec['tau_greedy/' + k.split('/', 1)[1]]:.2f}"
                             for k, v in rec.items() if k.startswith("tau_t1/"))
        bar.write(f"step {rec['step']}: simulated τ (T=1) {rec['tau_t1']:.3f}, τ (greedy) {rec['tau_greedy']:.3f}"
                  + (f" (per source, T=1/greedy{per_source})" if per_source else ""))


def _save(run: _Run, step: int) -> None:
    run.acc.wait_for_everyone()
    if run.acc.is_main_process:
        checkpoint.save(run.out, step, run.drafter, run.opt, run.sched, run.plan.epochs, run.cfg.__dict__,
                        run.cfg.max_shard_size)


# ---- evaluation ------------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(objective: DraftObjective, feats: FeatureSource, val_recs: list[dict], cfg: TrainConfig, pad_id: int,
             batch_size: int = 8) -> dict:
    """Simulated τ (temperature 1 and greedy) on the validation split, anchors fixed by the seed: pooled
    ("tau_t1", "tau_greedy", "val_blocks") and, when the split holds several sources, per source
    ("tau_t1/<source>", ...)."""
    if not val_recs:
        return {}
    objective.eval()
    by_source: dict[str, dict[str, list]] = {}
    for source in dict.fromkeys(source_of(r["id"]) for r in val_recs):  # stream order
        recs = [r for r in val_recs if source_of(r["id"]) == source]
        collected = by_source.setdefault(source, {})
        for i in range(0, len(recs), batch_size):
            f, last, blocks = _inputs(recs[i : i + batch_size], pad_id, next(objective.parameters()).device, feats,
                                      cfg, objective.drafter.config.mask_token_id, -1)
            terms = objective(f, last, blocks)
            for k in ("valid", "conf_label", "draft_top", "target_top"):
                collected.setdefault(k, []).append(terms[k])
    objective.train()

    def tau(parts: list[dict[str, list]]) -> dict:
        return simulated_tau({k: torch.cat([t for p in parts for t in p[k]]) for k in parts[0]})

    out = {f"val_{k}" if k == "blocks" else k: v for k, v in tau(list(by_source.values())).items()}
    if len(by_source) > 1:
        for source, collected in by_source.items():
            out.update({f"{'val_blocks' if k == 'blocks' else k}/{source}": v for k, v in tau([collected]).items()})
    return out


def validation_tau(drafter: DSparkDrafter, records: list[dict], cfg: TrainConfig) -> dict:
    """Simulated τ of any drafter (bound to its target) on the validation split a run with `cfg` uses: the
    shipped drafter's bar on the same anchors as the run's own evaluations."""
    _, val = split(records, cfg.val_size)
    pad_id = drafter.target.generation_config.pad_token_id or 0
    return evaluate(DraftObjective(drafter), FeatureSource(drafter.target, drafter.config.target_layer_ids), val, cfg,
                    pad_id)
