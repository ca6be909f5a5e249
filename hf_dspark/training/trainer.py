"""`hf-dspark train`: train a DSpark drafter for a frozen target on target-regenerated data.

Built on `accelerate`: the same command runs single-process or under `accelerate launch` (each process takes
its share of every global batch; loss denominators are all-reduced, so gradients equal the single-process
ones on the same global batch). AdamW, linear warmup + cosine, global-norm clipping, safetensors drafter
checkpoints, resumable from `<out>` (safetensors and JSON only) over a training stream that may grow between
resumes (`DataPlan`), and simulated τ on a held-out validation split.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers.utils import logging

from ..io.loading import load_target
from ..model import deepspec
from ..model.drafter import DSparkDrafter
from ..model.initialisation import differences, init_from, warm_start
from . import checkpoint
from .anchors import sample_blocks
from .data import eos_ids, prompt_of, read_answers
from .features import FeatureSource, base_model
from .losses import LossWeights, combine, weighted_sums
from .objective import DraftObjective, simulated_tau
from .signals import StopSignal

logger = logging.get_logger(__name__)


# ---- data ----------------------------------------------------------------------------------------------
def load_records(path: str | Path, max_length: int = 512, min_response: int = 2) -> list[dict]:
    """`hf-dspark data` answers (shard folder or JSONL) → [{"id", "ids": prompt+response ids, "n_prompt"}],
    truncated to max_length."""
    if not Path(path).exists():
        raise FileNotFoundError(f"answers {path}: no such file or folder")
    recs = []
    for r in read_answers(path):
        ids = (r["prompt_ids"] + r["response_ids"])[:max_length]
        if len(ids) - len(r["prompt_ids"]) >= min_response:
            recs.append({"id": r["id"], "ids": ids, "n_prompt": len(r["prompt_ids"])})
    return recs


def split(records: list[dict], val_size: int) -> tuple[list[dict], list[dict]]:
    """Validation = the first `val_size` records in stream order; training = every record whose prompt is not
    one of theirs (all answers to a prompt on one side). A stream that only grows keeps the same split."""
    val = records[:val_size]
    held = {prompt_of(r["id"]) for r in val}
    return [r for r in records[val_size:] if prompt_of(r["id"]) not in held], val


class DataPlan:
    """Epochs over a training stream that grows between runs (an answer job still appending shards).

    Epoch e shuffles the first `size_e` records, `size_e` being the stream's length when the epoch began, so
    a resumed run sees the batches the uninterrupted one saw; the next epoch takes in whatever the stream holds
    by then. `epochs` [{"start": step, "size": n, "last_id": id, "digest": sha1 of the n ids}] is saved in
    progress.json.
    """

    def __init__(self, records: list[dict], batch_size: int, seed: int, epochs: list[dict] | None = None):
        self.records, self.batch_size, self.seed = records, batch_size, seed
        self.epochs = list(epochs or [])
        for e in self.epochs:
            if len(records) < e["size"] or _digest(records[: e["size"]]) != e["digest"]:
                raise ValueError(f"the training data no longer starts with the {e['size']} records an earlier epoch "
                                 f"used (its last was {e['last_id']!r}): the stream was rewritten, not appended to")

    def _open(self, start: int) -> dict:
        e = {"start": start, "size": len(self.records), "last_id": self.records[-1]["id"],
             "digest": _digest(self.records)}
        self.epochs.append(e)
        return e

    def steps(self, e: dict) -> int:
        return max(1, e["size"] // self.batch_size)

    def batch(self, step: int) -> tuple[int, list[dict]]:
        """→ (epoch index, the global batch of records for optimizer step `step`)."""
        if not self.epochs:
            self._open(0)
        while step >= self.epochs[-1]["start"] + self.steps(self.epochs[-1]):
            self._open(self.epochs[-1]["start"] + self.steps(self.epochs[-1]))
        i = next(j for j in range(len(self.epochs) - 1, -1, -1) if step >= self.epochs[j]["start"])
        e = self.epochs[i]
        order = list(range(e["size"]))
        random.Random(self.seed * 1000 + i).shuffle(order)
        k = step - e["start"]
        return i, [self.records[j] for j in order[k * self.batch_size : (k + 1) * self.batch_size]]


def _digest(records: list[dict]) -> str:
    return hashlib.sha1("\n".join(r["id"] for r in records).encode()).hexdigest()


def frequent_tokens(records: list[dict], n: int, always: list[int] = ()) -> list[int]:
    """The `n` most frequent response tokens of `records` (ties by id), plus `always` (EOS): a draft vocabulary."""
    counts = torch.bincount(torch.tensor([t for r in records for t in r["ids"][r["n_prompt"]:]]))
    top = torch.sort(-counts, stable=True).indices[:n].tolist()  # stable: equal counts keep id order
    return sorted(set(top) | {int(t) for t in always})


def collate(recs: list[dict], pad_id: int):
    """→ ids, loss_mask [B, n] right padded (mask = response tokens), lengths [B], keys."""
    n = max(len(r["ids"]) for r in recs)
    ids = torch.full((len(recs), n), pad_id, dtype=torch.long)
    mask = torch.zeros(len(recs), n, dtype=torch.long)
    for b, r in enumerate(recs):
        ids[b, : len(r["ids"])] = torch.tensor(r["ids"])
        mask[b, r["n_prompt"] : len(r["ids"])] = 1
    return ids, mask, torch.tensor([len(r["ids"]) for r in recs]), [r["id"] for r in recs]


def _generators(keys: list[str], seed: int, epoch: int) -> list[torch.Generator]:
    """One generator per sequence, seeded by (seed, epoch, id): anchors do not depend on the process split."""
    return [torch.Generator().manual_seed(hash_id(k) * 1_000_003 + seed * 7919 + epoch) for k in keys]


def hash_id(key: str) -> int:
    h = 0
    for ch in key:
        h = (h * 131 + ord(ch)) % (2**31 - 1)
    return h


# ---- schedule --------------------------------------------------------------------------------------------
def lr_lambda(total: int, warmup_frac: float = 0.04, replans: list[dict] = ()):
    """Linear warmup, then cosine to 0 at `total`. Each re-plan {"at": step, "total": new total} (a resumed run
    given another --max-steps) continues from the factor it had reached at `at`, cosine to 0 at its new total: no
    jump in the learning rate, and the steps before `at` keep the schedule they were trained under."""
    warmup = max(1, round(warmup_frac * total))

    def f(t: int) -> float:
        if t < warmup:
            return (t + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (t - warmup) / max(1, total - warmup))))

    for r in replans:
        f = _replanned(f, r["at"], r["total"])
    f.total = replans[-1]["total"] if replans else total  # the planned length, saved with the run
    f.replans = list(replans)
    return f


def _replanned(before, at: int, total: int):
    start = before(at)

    def f(t: int) -> float:
        if t < at:
            return before(t)
        return start * 0.5 * (1 + math.cos(math.pi * min(1.0, (t - at) / max(1, total - at))))

    return f


def _plan(saved: dict | None, cfg_steps: int | None, default: int, log) -> tuple[int, list[dict]]:
    """(first planned total, re-plans) for a run: a new run plans `cfg_steps` or `default`; a resume keeps the
    saved plan (so a stream that grew since does not re-plan an epoch-based run), or re-plans from the saved step
    when --max-steps names another total."""
    if saved is None:
        return cfg_steps or default, []
    replans = list(saved.get("replans", []))
    first = replans[0]["from"] if replans else saved["total"]
    if cfg_steps and cfg_steps != saved["total"]:
        if cfg_steps <= saved["step"]:
            raise ValueError(f"--max-steps {cfg_steps} is not past the saved step {saved['step']} "
                             f"(planned total {saved['total']}); give a larger total or omit --max-steps")
        replans.append({"at": saved["step"], "from": saved["total"], "total": cfg_steps})
        log(f"re-planned at step {saved['step']}: {saved['total']} → {cfg_steps} steps (cosine from the current "
            "learning rate to 0 at the new total)")
    return first, replans


# ---- training --------------------------------------------------------------------------------------------
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
    seed: int = 0
    threads: int | None = None
    log_every: int = 1
    time_limit: float | None = None  # minutes; stop (and save) once the next step would exceed it
    precision: str = "fp32"  # "bf16": target features in bf16 and the drafter's step under bf16 autocast
    warm_start: list[int] | None = None  # target layers copied into the drafter's layers (None: random init)
    draft_vocab: int | None = None  # train (and draft) on the N most frequent response tokens (+ EOS) only
    same_data_as: str | None = None  # another run's folder: train on its batches and draft vocabulary (ablations)
    init_from: str | None = None  # a drafter folder to start from (its weights and draft vocabulary): a next stage


# What fixes a run's trajectory: a resumed run must agree on these, or its schedule and data order are another run's.
_SCHEDULE_KEYS = ("data", "head", "num_layers", "taps", "markov_rank", "block_size", "batch_size", "num_anchors",
                  "lr", "weight_decay", "warmup", "epochs", "max_length", "val_size", "seed", "warm_start",
                  "draft_vocab", "same_data_as", "init_from")
# (not precision: a run that is resumed elsewhere may land on a CPU without native bf16; not max_steps: another total on
# a resume re-plans the rest of the schedule, `_plan`)


# what same_data_as must share: the records and their order, the anchors drawn from them, the vocabulary
_DATA_KEYS = ("data", "target", "batch_size", "num_anchors", "block_size", "mask_token_id", "seed", "val_size",
              "max_length", "draft_vocab")


def same_data(cfg: TrainConfig) -> dict:
    """What run `cfg.same_data_as` trained on → {"epochs": its data plan so far, "draft_vocab": ids or None}.

    A fresh run that starts from them draws exactly that run's batches (DataPlan checks the records by digest)
    and anchors (seeded by seed, epoch and id), so a head ablation differs from it in the head alone, even when
    the reference run's epochs took in fewer answers than the stream holds now. Past the reference's recorded
    epochs the plan opens its own from the stream, as any run does."""
    from safetensors import safe_open

    ref = Path(cfg.same_data_as)
    state = checkpoint.latest(ref)
    if state is None:
        raise ValueError(f"same_data_as={ref}: not a training run's folder (no {checkpoint.PREFIX}<step>/)")
    progress = checkpoint.verify(state)
    theirs = checkpoint.config_of(state)
    differ = differences(theirs, cfg, _DATA_KEYS)
    if differ:
        raise ValueError(f"same_data_as={ref} was trained with other data settings (theirs vs ours): {differ}")
    vocab = None
    if cfg.draft_vocab:
        for path in deepspec.weight_files(state / "drafter"):
            with safe_open(str(path), "pt") as f:
                vocab = f.get_tensor("draft_vocab") if "draft_vocab" in f.keys() else vocab
    if progress["step"] < progress.get("total", progress["step"]):
        logger.warning("same_data_as=%s is at step %d of %d: epochs it has not opened yet may differ from this "
                       "run's", ref, progress["step"], progress["total"])
    return {"epochs": progress.get("epochs"), "draft_vocab": vocab}


def build_drafter(target, cfg: TrainConfig) -> DSparkDrafter:
    over = {"block_size": cfg.block_size, "num_hidden_layers": cfg.num_layers, "head_type": cfg.head,
                "markov_rank": cfg.markov_rank, "confidence_head": cfg.head != "none"}
    if cfg.taps:
        over["target_layer_ids"] = list(cfg.taps)
    if cfg.mask_token_id is not None:
        over["mask_token_id"] = cfg.mask_token_id
    drafter = DSparkDrafter.from_target(target, **over)
    if cfg.warm_start is not None and cfg.init_from is not None:
        raise ValueError("warm_start and init_from both initialise the drafter: give one")
    if cfg.warm_start is not None:
        warm_start(drafter, base_model(target), cfg.warm_start)
    if cfg.init_from is not None:
        init_from(drafter, cfg.init_from)
    return drafter


def train(cfg: TrainConfig, target=None, records: list[dict] | None = None, accelerator=None) -> dict:
    """Train a drafter; returns {"drafter", "history", "final_val"}. `target`/`records` may be passed in
    (tests) instead of loaded from cfg.target / cfg.data."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be 'fp32' or 'bf16', got {cfg.precision!r}")
    bf16 = cfg.precision == "bf16"
    acc = accelerator or Accelerator(cpu=not torch.cuda.is_available())
    # torch.autocast, not accelerate's mixed_precision: that is fixed per process by its AcceleratorState.
    autocast = lambda: torch.autocast(acc.device.type, dtype=torch.bfloat16, enabled=bf16)  # noqa: E731
    set_seed(cfg.seed)
    if target is None:
        target, _ = load_target(cfg.target, torch.float32, "cpu")
    target.requires_grad_(False)
    target_dtype = target.dtype
    target.to(acc.device)
    pad_id = target.generation_config.pad_token_id or 0
    records = records if records is not None else load_records(cfg.data, cfg.max_length)
    train_recs, val_recs = split(records, cfg.val_size)
    if not train_recs:
        raise ValueError(f"no training sequences in {cfg.data or 'the records given'}: {len(records)} answers, of which "
                         f"--val-size {cfg.val_size} (and every answer to their prompts) went to validation; give more "
                         "answers or a smaller --val-size" if records else f"no answers in {cfg.data}")
    drafter = build_drafter(target, cfg).float().train()  # warm start copies the target's weights as they are
    out = Path(cfg.output_dir)
    state = checkpoint.latest(out)
    saved = checkpoint.verify(state) if state is not None else None
    resuming = saved is not None
    logged = _logged_steps(out)
    if not resuming and any(s > 0 for s in logged):  # a committed record of a run, without its state
        raise ValueError(f"{out} holds a run's metrics up to step {max(logged)} but no {checkpoint.PREFIX}<step>/ "
                         "state: it cannot be resumed, and starting afresh would overwrite its record; train into "
                         "another --output-dir (to continue from a drafter: --init-from)")
    same = same_data(cfg) if cfg.same_data_as and not resuming else None  # a resume has its own plan and vocab
    if cfg.init_from is not None and bool(cfg.draft_vocab) != (drafter.draft_vocab is not None):
        raise ValueError(f"init_from={cfg.init_from} {'has' if drafter.draft_vocab is not None else 'has no'} draft "
                         f"vocabulary but draft_vocab={cfg.draft_vocab}: give the setting it was trained with")
    if same and same["draft_vocab"] is not None and drafter.draft_vocab is not None \
            and not torch.equal(same["draft_vocab"], drafter.draft_vocab.cpu()):
        raise ValueError(f"init_from={cfg.init_from} and same_data_as={cfg.same_data_as} have other draft vocabularies")
    if cfg.draft_vocab and drafter.draft_vocab is None:  # fixed at the run's start (init_from: that drafter's);
        # a resume loads the saved one (the data may have grown since)
        drafter.set_draft_vocab(same["draft_vocab"] if same else
                                frequent_tokens(train_recs, cfg.draft_vocab, eos_ids(target)))
    if bf16:  # features (and the frozen shared LM head) in bf16; the drafter keeps float32 master weights
        target.to(torch.bfloat16)
    weights = LossWeights.dflash() if cfg.head == "none" else LossWeights()
    feats = FeatureSource(target, drafter.config.target_layer_ids, cfg.cache_dir)
    objective = DraftObjective(drafter)
    # The schedule is planned once, for the whole run (a resume over grown data keeps it; --max-steps re-plans it).
    first_total, replans = _plan(saved, cfg.max_steps,
                                 max(1, int(cfg.epochs * max(1, len(train_recs) // cfg.batch_size))), acc.print)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=cfg.lr,
                            weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(first_total, cfg.warmup, replans))
    total = sched.lr_lambdas[0].total
    # The scheduler is NOT prepared: accelerate would step it once per process, but our steps are global.
    objective, opt = acc.prepare(objective, opt)
    step, epochs = 0, (same["epochs"] if same else None)
    if resuming:
        _check_same_run(state, cfg)
        init_from(acc.unwrap_model(objective).drafter, state / "drafter")
        checkpoint.load(state, opt, sched)
        step, epochs = saved["step"], saved.get("epochs")
        acc.print(f"resumed from {state} at step {step}/{total}")
    plan = DataPlan(train_recs, cfg.batch_size, cfg.seed, epochs)
    history: list[dict] = []
    if acc.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / "train_config.json").write_text(json.dumps(cfg.__dict__, indent=2))  # the run's record, for people
        _keep_metrics(out, step)  # steps logged after the checkpoint by a killed run are redone, not doubled
    bar = tqdm(total=total, initial=step, desc="train", disable=not acc.is_main_process)
    t0 = time.perf_counter()
    if step == 0 and cfg.eval_every:
        with autocast():
            history.append({"step": 0, **evaluate(acc.unwrap_model(objective), feats, val_recs, cfg, pad_id)})
        _log(acc, out, history[-1], bar)
    start = step
    with StopSignal() as stop:  # `kill <pid>`: finish the step, save, return
        while step < total:
            if step > 0 and _must_stop(acc, t0, step - start, cfg.time_limit, stop.received):
                why = "a stop signal" if stop.received else f"the time limit of {cfg.time_limit} min"
                acc.print(f"{why} reached at step {step}/{total}; saving")
                _save(acc, objective, opt, sched, out, step, plan, cfg)
                break
            epoch, batch = plan.batch(step)
            mine = batch[acc.process_index :: acc.num_processes]  # this process's share of the global batch
            ids, mask, lengths, keys = collate(mine, pad_id)
            ids, mask, lengths = ids.to(acc.device), mask.to(acc.device), lengths.to(acc.device)
            f, last = feats(keys, ids, lengths)
            blocks = sample_blocks(ids, mask, lengths, cfg.num_anchors, cfg.block_size,
                                   drafter.config.mask_token_id, _generators(keys, cfg.seed, epoch))
            with autocast():
                terms = objective(f, last, blocks)
            sums, denom = weighted_sums(terms, terms["valid"], weights.decay)
            global_denom = acc.reduce(denom.detach(), "sum").clamp(min=1e-8)
            # DDP averages gradients over processes: scale by their number so the result is Σ/Σ over the global batch.
            loss = combine({k_: v / global_denom for k_, v in sums.items()}, weights) * acc.num_processes
            opt.zero_grad(set_to_none=True)
            acc.backward(loss)
            gnorm = acc.clip_grad_norm_(objective.parameters(), cfg.clip)
            opt.step()
            sched.step()
            step += 1
            bar.update(1)
            rec = {"step": step, "loss": float(acc.reduce(loss.detach(), "sum")) / acc.num_processes,
                   **{k_: float(acc.reduce(v.detach(), "sum") / global_denom) for k_, v in sums.items()},
                   "grad_norm": float(gnorm), "lr": sched.get_last_lr()[0], "elapsed_s": time.perf_counter() - t0,
                   "precision": cfg.precision}
            if cfg.eval_every and (step % cfg.eval_every == 0 or step == total):
                with autocast():
                    rec.update(evaluate(acc.unwrap_model(objective), feats, val_recs, cfg, pad_id))
            history.append(rec)
            if step % cfg.log_every == 0 or "tau_t1" in rec:
                _log(acc, out, rec, bar)
            if step == total or (cfg.save_every and step % cfg.save_every == 0):
                _save(acc, objective, opt, sched, out, step, plan, cfg)
    bar.close()
    target.to(target_dtype)
    final = next((h for h in reversed(history) if "tau_t1" in h), {})
    return {"drafter": acc.unwrap_model(objective).drafter, "history": history, "final_val": final}


@torch.no_grad()
def evaluate(objective: DraftObjective, feats: FeatureSource, val_recs: list[dict], cfg: TrainConfig, pad_id: int,
             batch_size: int = 8) -> dict:
    """Simulated τ (temperature 1 and greedy) on the validation split, anchors fixed by the seed."""
    if not val_recs:
        return {}
    objective.eval()
    collected: dict[str, list] = {}
    for i in range(0, len(val_recs), batch_size):
        ids, mask, lengths, keys = collate(val_recs[i : i + batch_size], pad_id)
        dev = next(objective.parameters()).device
        ids, mask, lengths = ids.to(dev), mask.to(dev), lengths.to(dev)
        f, last = feats(keys, ids, lengths)
        blocks = sample_blocks(ids, mask, lengths, cfg.num_anchors, cfg.block_size,
                               objective.drafter.config.mask_token_id, _generators(keys, cfg.seed, -1))
        terms = objective(f, last, blocks)
        for k in ("valid", "conf_label", "draft_top", "target_top"):
            collected.setdefault(k, []).append(terms[k])
    objective.train()
    return {f"val_{k}" if k == "blocks" else k: v for k, v in
            simulated_tau({k: torch.cat(v) for k, v in collected.items()}).items()}


def validation_tau(drafter: DSparkDrafter, records: list[dict], cfg: TrainConfig) -> dict:
    """Simulated τ of any drafter (bound to its target) on the validation split a run with `cfg` uses: the
    shipped drafter's bar on the same anchors as the run's own evaluations."""
    _, val = split(records, cfg.val_size)
    pad_id = drafter.target.generation_config.pad_token_id or 0
    return evaluate(DraftObjective(drafter), FeatureSource(drafter.target, drafter.config.target_layer_ids), val, cfg,
                    pad_id)


def _check_same_run(state: Path, cfg: TrainConfig) -> None:
    """Refuse to resume a run under another schedule (lr plan, data order, model shape)."""
    diff = differences(checkpoint.config_of(state), cfg, _SCHEDULE_KEYS)
    if diff:
        raise ValueError(f"{state.parent} holds another run (saved vs now: {diff}); resume with the same settings "
                         "or use a new --output-dir")


def _metric_lines(out: Path) -> list[tuple[int, str]]:
    """(step, line) of each readable record in `<out>/metrics.jsonl` (a line cut by a kill is skipped)."""
    path = out / "metrics.jsonl"
    records = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            records.append((int(json.loads(line)["step"]), line))
        except (ValueError, KeyError, TypeError):
            pass
    return records


def _logged_steps(out: Path) -> list[int]:
    return [step for step, _ in _metric_lines(out)]


def _keep_metrics(out: Path, step: int) -> None:
    """Rewrite metrics.jsonl with the records up to `step` only (0 for a fresh run)."""
    path = out / "metrics.jsonl"
    if path.is_file():
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for s, line in _metric_lines(out) if s <= step))
        os.replace(tmp, path)


def _must_stop(acc, t0: float, steps_done: int, limit_min: float | None, signalled: bool) -> bool:
    """Before the next step: a stop signal arrived, or the next step would pass the time limit (every process
    agrees, so all of them save the same step)."""
    elapsed = time.perf_counter() - t0
    late = bool(limit_min) and elapsed + elapsed / max(1, steps_done) > 60 * limit_min
    if acc.num_processes == 1:
        return signalled or late
    # a signal may reach one process only; one scalar all-reduce a step is small beside the gradients' own
    return bool(acc.reduce(torch.tensor(float(signalled or late), device=acc.device), "max") > 0)


def _log(acc, out: Path, rec: dict, bar) -> None:
    if not acc.is_main_process:
        return
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")
    show = {k: f"{v:.3f}" for k, v in rec.items() if k in ("loss", "ce", "l1", "conf", "tau_t1", "tau_greedy")}
    bar.set_postfix(show)
    if "tau_t1" in rec:
        bar.write(f"step {rec['step']}: simulated τ (T=1) {rec['tau_t1']:.3f}, τ (greedy) {rec['tau_greedy']:.3f}")


def _save(acc, objective, opt, sched, out: Path, step: int, plan: DataPlan, cfg: TrainConfig) -> None:
    acc.wait_for_everyone()
    if not acc.is_main_process:
        return
    f = sched.lr_lambdas[0]
    progress = {"total": f.total, "epochs": plan.epochs, **({"replans": f.replans} if f.replans else {})}
    checkpoint.save(out, step, acc.unwrap_model(objective).drafter, opt, sched, progress, cfg.__dict__)
