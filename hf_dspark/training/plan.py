"""What a training run sees, and in which order: the records of an answer stream, their validation split, the
epochs over a stream that grows between runs (`DataPlan`), the padded batches, the per-sequence generators that
draw anchors, a draft vocabulary, and another run's plan to train on the same data (`same_data`)."""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from pathlib import Path

import torch
from transformers.utils import logging

from ..model.files import weight_files
from ..model.initialisation import differences
from . import checkpoint
from .data import prompt_of, read_answers, source_of

logger = logging.get_logger(__name__)


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
    """Validation = the first `val_size` records of each source (prompt file) in stream order, so that τ can be
    read per source; training = every record whose prompt is not one of theirs (all answers to a prompt on one
    side). A stream that only grows keeps the same split."""
    seen: dict[str, int] = {}
    val = []
    for r in records:
        source = source_of(r["id"])
        if seen.get(source, 0) < val_size:
            seen[source] = seen.get(source, 0) + 1
            val.append(r)
    held = {prompt_of(r["id"]) for r in val}
    return [r for r in records if prompt_of(r["id"]) not in held], val


class DataPlan:
    """Epochs over a training stream that grows between runs (an answer job still appending shards).

    Epoch e shuffles the first `size_e` records, `size_e` being the stream's length when the epoch began, so
    a resumed run sees the batches the uninterrupted one saw; the next epoch takes in whatever the stream holds
    by then. `mix` {source: weight} reweights the sources of the epochs it opens: a source's records appear
    `weight` times per epoch (whole copies, then a seeded sample for the fraction; 0 drops it; sources it does
    not name keep weight 1). `epochs` [{"start": step, "size": n, "last_id": id, "digest": sha1 of the n ids,
    "mix": the weights, if any; "steps": its length, when a new mixture cut it short}] is saved in progress.json.
    """

    def __init__(self, records: list[dict], batch_size: int, seed: int, epochs: list[dict] | None = None,
                 mix: dict[str, float] | None = None):
        self.records, self.batch_size, self.seed = records, batch_size, seed
        self.epochs = list(epochs or [])
        self.mix = {s: float(w) for s, w in (mix or {}).items()}
        counts = Counter(source_of(r["id"]) for r in records)
        sources = set(counts)
        unknown = sorted(set(self.mix) - sources)
        if unknown:
            raise ValueError(f"mix names {', '.join(map(repr, unknown))}, which no training answer comes from "
                             f"(sources: {', '.join(sorted(sources))})")
        if any(w < 0 for w in self.mix.values()):
            raise ValueError(f"mix weights must be >= 0, got {self.mix}")
        if self.mix and sum(n * self.mix.get(s, 1.0) for s, n in counts.items()) < batch_size:
            raise ValueError(f"mix {self.mix} leaves fewer records than one batch of {batch_size} "
                             "(every source with answers dropped or nearly)")
        for e in self.epochs:
            if len(records) < e["size"] or _digest(records[: e["size"]]) != e["digest"]:
                raise ValueError(f"the training data no longer starts with the {e['size']} records an earlier epoch "
                                 f"used (its last was {e['last_id']!r}): the stream was rewritten, not appended to")
        self._orders: dict[int, list[int]] = {}

    def _open(self, start: int) -> dict:
        e = {"start": start, "size": len(self.records), "last_id": self.records[-1]["id"],
             "digest": _digest(self.records), **({"mix": dict(self.mix)} if self.mix else {})}
        self.epochs.append(e)
        return e

    def replan(self, step: int) -> bool:
        """Start the mixture given now at `step` (a resume under another `mix`): the running epoch ends there and
        the next one opens on the stream as it is. → whether it did (False: the mixture is the running one's)."""
        if not self.epochs or self.epochs[-1].get("mix", {}) == self.mix:
            return False
        if step == self.epochs[-1]["start"]:  # the epoch has not taken a step yet: reopen it
            self.epochs.pop()
            self._orders.pop(len(self.epochs), None)
        else:
            self.epochs[-1]["steps"] = step - self.epochs[-1]["start"]
        self._open(step)
        return True

    def _order(self, i: int) -> list[int]:
        """Epoch i's record indices in training order (with a mix: each repeated by its source's weight)."""
        if i not in self._orders:
            e, rng = self.epochs[i], random.Random(self.seed * 1000 + i)
            mix = e.get("mix")
            if not mix:
                order = list(range(e["size"]))
            else:
                by_source: dict[str, list[int]] = {}
                for j in range(e["size"]):
                    by_source.setdefault(source_of(self.records[j]["id"]), []).append(j)
                order = []
                for source, idx in by_source.items():
                    w = mix.get(source, 1.0)
                    order += idx * int(w) + sorted(rng.sample(idx, round((w - int(w)) * len(idx))))
            rng.shuffle(order)
            self._orders[i] = order
        return self._orders[i]

    def steps(self, i: int) -> int:
        """Optimizer steps in epoch i."""
        e = self.epochs[i]
        return e["steps"] if "steps" in e else max(1, len(self._order(i)) // self.batch_size)

    def batch(self, step: int) -> tuple[int, list[dict]]:
        """→ (epoch index, the global batch of records for optimizer step `step`)."""
        if not self.epochs:
            self._open(0)
        while step >= self.epochs[-1]["start"] + self.steps(len(self.epochs) - 1):
            self._open(self.epochs[-1]["start"] + self.steps(len(self.epochs) - 1))
        i = next(j for j in range(len(self.epochs) - 1, -1, -1) if step >= self.epochs[j]["start"])
        order, k = self._order(i), step - self.epochs[i]["start"]
        return i, [self.records[j] for j in order[k * self.batch_size : (k + 1) * self.batch_size]]


def _digest(records: list[dict]) -> str:
    return hashlib.sha1("\n".join(r["id"] for r in records).encode()).hexdigest()


def frequent_tokens(records: list[dict], n: int, always: list[int] = ()) -> list[int]:
    """The `n` most frequent response tokens of `records` (ties by id), plus `always` (EOS): a draft vocabulary."""
    return sorted(set(_by_frequency(records)[:n]) | {int(t) for t in always})


def grown_vocabulary(ids: list[int], records: list[dict], n: int) -> list[int]:
    """`ids` (a trained drafter's draft vocabulary) plus the most frequent response tokens of `records` it lacks
    (ties by id), up to `n` ids in all: a next stage drafts everything the last one did, and more."""
    have = {int(t) for t in ids}
    extra = [t for t in _by_frequency(records) if t not in have][: max(n - len(have), 0)]
    return sorted(have | set(extra))


def _by_frequency(records: list[dict]) -> list[int]:
    """Token ids up to the largest response token of `records`, most frequent first (stable: equal counts keep id
    order)."""
    counts = torch.bincount(torch.tensor([t for r in records for t in r["ids"][r["n_prompt"]:]]))
    return torch.sort(-counts, stable=True).indices.tolist()


def collate(recs: list[dict], pad_id: int):
    """→ ids, loss_mask [B, n] right padded (mask = response tokens), lengths [B], keys."""
    n = max(len(r["ids"]) for r in recs)
    ids = torch.full((len(recs), n), pad_id, dtype=torch.long)
    mask = torch.zeros(len(recs), n, dtype=torch.long)
    for b, r in enumerate(recs):
        ids[b, : len(r["ids"])] = torch.tensor(r["ids"])
        mask[b, r["n_prompt"] : len(r["ids"])] = 1
    return ids, mask, torch.tensor([len(r["ids"]) for r in recs]), [r["id"] for r in recs]


def anchor_generators(keys: list[str], seed: int, epoch: int) -> list[torch.Generator]:
    """One generator per sequence, seeded by (seed, epoch, id): anchors do not depend on the process split."""
    return [torch.Generator().manual_seed(_hash_id(k) * 1_000_003 + seed * 7919 + epoch) for k in keys]


def _hash_id(key: str) -> int:
    h = 0
    for ch in key:
        h = (h * 131 + ord(ch)) % (2**31 - 1)
    return h


# what same_data_as must share: the records and their order, the anchors drawn from them, the vocabulary
_DATA_KEYS = ("data", "target", "batch_size", "num_anchors", "block_size", "mask_token_id", "seed", "val_size",
              "max_length", "draft_vocab")


def same_data(cfg) -> dict:
    """What run `cfg.same_data_as` (`cfg` a TrainConfig) trained on → {"epochs": its data plan so far,
    "draft_vocab": ids or None}.

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
    differ = differences(checkpoint.config_of(state), cfg, _DATA_KEYS)
    if differ:
        raise ValueError(f"same_data_as={ref} was trained with other data settings (theirs vs ours): {differ}")
    vocab = None
    if cfg.draft_vocab:
        for path in weight_files(state / "drafter"):
            with safe_open(str(path), "pt") as f:
                vocab = f.get_tensor("draft_vocab") if "draft_vocab" in f.keys() else vocab
    if progress["step"] < progress.get("total", progress["step"]):
        logger.warning("same_data_as=%s is at step %d of %d: epochs it has not opened yet may differ from this "
                       "run's", ref, progress["step"], progress["total"])
    return {"epochs": progress.get("epochs"), "draft_vocab": vocab}
