"""`hf-dspark train`: train a DSpark drafter for a frozen target on target-regenerated data (§5).

Built on `accelerate`: the same command runs single-process or under `accelerate launch` (each process takes
its share of every global batch; loss denominators are all-reduced, so gradients equal the single-process
ones on the same global batch). AdamW, linear warmup + cosine, global-norm clipping, safetensors drafter
checkpoints, resumable from `<out>/state`, and simulated τ on a held-out validation split.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..decoding.routing import enable
from ..io.loading import load_default_target
from ..model.drafter import DSparkDrafter
from .anchors import sample_blocks
from .data import prompt_of, read_answers
from .features import FeatureSource, base_model
from .losses import LossWeights, combine, weighted_sums
from .objective import DraftObjective, simulated_tau


# ---- data ----------------------------------------------------------------------------------------------
def load_records(path: str | Path, max_length: int = 512, min_response: int = 2) -> list[dict]:
    """`hf-dspark data` answers (shard folder or JSONL) → [{"id", "ids": prompt+response ids, "n_prompt"}],
    truncated to max_length."""
    recs = []
    for r in read_answers(path):
        ids = (r["prompt_ids"] + r["response_ids"])[:max_length]
        if len(ids) - len(r["prompt_ids"]) >= min_response:
            recs.append({"id": r["id"], "ids": ids, "n_prompt": len(r["prompt_ids"])})
    return recs


def split(records: list[dict], val_size: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Seeded train/validation split by prompt (all answers to a prompt on one side), ≈ val_size validation."""
    by_prompt: dict[str, list[dict]] = {}
    for r in sorted(records, key=lambda r: r["id"]):
        by_prompt.setdefault(prompt_of(r["id"]), []).append(r)
    groups = list(by_prompt.values())
    random.Random(seed).shuffle(groups)
    val, train = [], []
    for g in groups:
        (val if len(val) < val_size else train).extend(g)
    return train, val


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
def lr_lambda(total: int, warmup_frac: float = 0.04):
    warmup = max(1, round(warmup_frac * total))

    def f(t: int) -> float:
        if t < warmup:
            return (t + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (t - warmup) / max(1, total - warmup))))

    return f


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


# What fixes a run's trajectory: a resumed run must agree on these, or its schedule and data order are another run's.
_SCHEDULE_KEYS = ("data", "head", "num_layers", "taps", "markov_rank", "block_size", "batch_size", "num_anchors",
                  "lr", "weight_decay", "warmup", "epochs", "max_steps", "max_length", "val_size", "seed", "precision",
                  "warm_start")


def build_drafter(target, cfg: TrainConfig) -> DSparkDrafter:
    over = {"block_size": cfg.block_size, "num_hidden_layers": cfg.num_layers, "head_type": cfg.head,
                "markov_rank": cfg.markov_rank, "confidence_head": cfg.head != "none"}
    if cfg.taps:
        over["target_layer_ids"] = list(cfg.taps)
    if cfg.mask_token_id is not None:
        over["mask_token_id"] = cfg.mask_token_id
    drafter = DSparkDrafter.from_target(target, **over)
    if cfg.warm_start is not None:
        warm_start(drafter, target, cfg.warm_start)
    return drafter


_OWN_KEYS = {"self_attn.q_norm.weight", "self_attn.k_norm.weight", "layer_scalar"}  # a target layer may lack them


def warm_start(drafter: DSparkDrafter, target, layers: list[int]) -> None:
    """Copy target decoder layers `layers[i]` into drafter layer i (same module names and shapes: norms,
    q/k/v/o projections, MLP) and the target's final norm into the drafter's. The drafter's fc/heads stay random,
    and so do the q/k norms (at 1) where the target has none."""
    if len(layers) != len(drafter.layers):
        raise ValueError(f"warm_start names {len(layers)} target layers for a drafter with {len(drafter.layers)}")
    decoder = base_model(target)
    n = len(decoder.layers)
    for i, li in enumerate(layers):
        if not -n <= li < n:
            raise ValueError(f"warm_start layer {li} is outside the target's {n} layers")
        missing, unexpected = drafter.layers[i].load_state_dict(decoder.layers[li].state_dict(), strict=False)
        if unexpected or set(missing) - _OWN_KEYS:
            raise ValueError(f"target layer {li} does not fit drafter layer {i}: missing {missing}, unexpected {unexpected}")
    drafter.norm.load_state_dict(decoder.norm.state_dict())


def load_target(path: str | None):
    if path is None:
        return load_default_target(dtype=torch.float32)
    return enable(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()), AutoTokenizer.from_pretrained(path)


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
        target, _ = load_target(cfg.target)
    target.requires_grad_(False)
    target_dtype = target.dtype
    target.to(acc.device)
    pad_id = target.generation_config.pad_token_id or 0
    records = records if records is not None else load_records(cfg.data, cfg.max_length)
    train_recs, val_recs = split(records, cfg.val_size, cfg.seed)
    if not train_recs:
        raise ValueError(f"no training sequences in {cfg.data}")
    drafter = build_drafter(target, cfg).float().train()  # warm start copies the target's weights as they are
    if bf16:  # features (and the frozen shared LM head) in bf16; the drafter keeps float32 master weights
        target.to(torch.bfloat16)
    weights = LossWeights.dflash() if cfg.head == "none" else LossWeights()
    feats = FeatureSource(target, drafter.config.target_layer_ids, cfg.cache_dir)
    objective = DraftObjective(drafter)
    steps_per_epoch = max(1, len(train_recs) // cfg.batch_size)
    total = cfg.max_steps or max(1, int(cfg.epochs * steps_per_epoch))
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=cfg.lr,
                            weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(total, cfg.warmup))
    # The scheduler is NOT prepared: accelerate would step it once per process, but our steps are global.
    objective, opt = acc.prepare(objective, opt)
    acc.register_for_checkpointing(sched)
    out = Path(cfg.output_dir)
    state_dir, progress = out / "state", out / "progress.json"
    step = 0
    if progress.exists() and (state_dir / "model.safetensors").exists():
        _check_same_run(out / "train_config.json", cfg)
        acc.load_state(str(state_dir))
        step = json.loads(progress.read_text())["step"]
        acc.print(f"resumed from {state_dir} at step {step}/{total}")
    history: list[dict] = []
    if acc.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / "train_config.json").write_text(json.dumps(cfg.__dict__, indent=2))
    bar = tqdm(total=total, initial=step, desc="train", disable=not acc.is_main_process)
    t0 = time.perf_counter()
    if step == 0 and cfg.eval_every:
        with autocast():
            history.append({"step": 0, **evaluate(acc.unwrap_model(objective), feats, val_recs, cfg, pad_id)})
        _log(acc, out, history[-1], bar)
    start = step
    while step < total:
        if cfg.time_limit and step > 0 and _over_time(acc, t0, step - start, cfg.time_limit):
            acc.print(f"time limit of {cfg.time_limit} min reached at step {step}/{total}; saving")
            _save(acc, objective, out, step)
            break
        epoch, k = divmod(step, steps_per_epoch)
        order = list(range(len(train_recs)))
        random.Random(cfg.seed * 1000 + epoch).shuffle(order)
        batch = [train_recs[i] for i in order[k * cfg.batch_size : (k + 1) * cfg.batch_size]]
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
               "grad_norm": float(gnorm), "lr": sched.get_last_lr()[0], "elapsed_s": time.perf_counter() - t0}
        if cfg.eval_every and (step % cfg.eval_every == 0 or step == total):
            with autocast():
                rec.update(evaluate(acc.unwrap_model(objective), feats, val_recs, cfg, pad_id))
        history.append(rec)
        if step % cfg.log_every == 0 or "tau_t1" in rec:
            _log(acc, out, rec, bar)
        if step == total or (cfg.save_every and step % cfg.save_every == 0):
            _save(acc, objective, out, step)
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


def _check_same_run(saved: Path, cfg: TrainConfig) -> None:
    """Refuse to resume a run under another schedule (lr plan, data order, model shape)."""
    old = json.loads(saved.read_text()) if saved.exists() else {}
    diff = {k: (old.get(k), getattr(cfg, k)) for k in _SCHEDULE_KEYS if k in old and old[k] != getattr(cfg, k)}
    if diff:
        raise ValueError(f"{saved.parent} holds another run (saved vs now: {diff}); resume with the same settings "
                         "or use a new --output-dir")


def _over_time(acc, t0: float, steps_done: int, limit_min: float) -> bool:
    elapsed = time.perf_counter() - t0
    per_step = elapsed / max(1, steps_done)
    over = torch.tensor(float(elapsed + per_step > 60 * limit_min))
    return bool(acc.reduce(over, "max") > 0)  # every process stops at the same step


def _log(acc, out: Path, rec: dict, bar) -> None:
    if not acc.is_main_process:
        return
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")
    show = {k: f"{v:.3f}" for k, v in rec.items() if k in ("loss", "ce", "l1", "conf", "tau_t1", "tau_greedy")}
    bar.set_postfix(show)
    if "tau_t1" in rec:
        bar.write(f"step {rec['step']}: simulated τ (T=1) {rec['tau_t1']:.3f}, τ (greedy) {rec['tau_greedy']:.3f}")


def _save(acc, objective, out: Path, step: int) -> None:
    acc.wait_for_everyone()
    acc.save_state(str(out / "state"))
    if acc.is_main_process:
        acc.unwrap_model(objective).drafter.save_pretrained(out / "drafter")  # safetensors
        (out / "progress.json").write_text(json.dumps({"step": step}))
