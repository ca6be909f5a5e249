"""Continuous-batching sampler: answer many prompts with the target, one decode step for all live rows.

`model.generate` on a padded batch keeps stepping every row until the longest answer ends, and its
DynamicCache re-concatenates every layer's keys and values at every step. Here a fixed number of *slots*
share one preallocated KV buffer `[slots, kv_heads, capacity, head_dim]` per layer: a row that ends (EOS or
`max_new_tokens`) frees its slot, new prompts are prefilled in a small batch and written into free slots
right-aligned at the current column, and each row attends only to its own columns (a 2-D mask). Columns no
live row uses any more are dropped from the left. Each row follows exactly the law `generate` would give it
(temperature, then transformers' top-p nucleus; `temperature == 0` is greedy), only the batching differs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

ATTENTION = "dspark_grouped_decode"
BUCKET = 64  # attention widths and prefill widths are rounded up to multiples of this


def grouped_decode_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """One-query attention as two batched matmuls over the KV-head groups (no `repeat_kv` copy).

    query [B, H, 1, D]; key, value [B, Hkv, L, D]; attention_mask [B, 1, 1, L] bool (True: attend) or None
    → ([B, 1, H, D], None). On CPU, SDPA's flash kernel spends ~84 % of a batch-64 SmolLM2 decode step on a
    single query; this is the same function in two bmm calls. Prefill (more than one query) goes to SDPA.
    """
    b, h, q, d = query.shape
    if q > 1 or dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    hkv = key.shape[1]
    scores = torch.matmul(query.view(b, hkv, h // hkv, d), key.transpose(-1, -2)).float()  # [B, Hkv, G, L]
    scores = scores * (scaling if scaling is not None else d ** -0.5)
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask.view(b, 1, 1, -1), float("-inf"))
    out = torch.matmul(scores.softmax(-1).to(value.dtype), value)  # [B, Hkv, G, D]
    return out.view(b, 1, h, d), None


AttentionInterface.register(ATTENTION, grouped_decode_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


@dataclass
class Job:
    """One answer to produce: templated prompt ids and its sampling law (`temperature == 0`: greedy)."""

    key: str
    prompt_ids: list[int]
    temperature: float = 0.7
    top_p: float = 0.9


class _SlotLayer(DynamicLayer):
    """One layer's view into its `_SlotCache` buffer (writes at the shared column, returns `[:, :, :n + q]`)."""

    def __init__(self, owner: "_SlotCache", index: int):
        super().__init__()
        self.owner, self.index, self.is_initialized = owner, index, True

    def update(self, key_states, value_states, *args, **kwargs):
        o = self.owner
        n, q = o.n, key_states.shape[-2]
        o.k[self.index][:, :, n : n + q] = key_states
        o.v[self.index][:, :, n : n + q] = value_states
        width = o.width(q)
        return o.k[self.index][:, :, :width], o.v[self.index][:, :, :width]

    def get_seq_length(self) -> int:
        return self.owner.n

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.width(query_length), 0


def _buffer(slots, kv_heads, capacity, head_dim, dtype, device, keys: bool) -> torch.Tensor:
    """A zero `[slots, kv_heads, capacity, head_dim]` tensor; keys are stored transposed (`[..., head_dim,
    capacity]` in memory) so `q @ k[:, :, :n].mT` reads a strided matrix instead of copying the slice."""
    if keys:
        return torch.zeros(slots, kv_heads, head_dim, capacity, dtype=dtype, device=device).transpose(-1, -2)
    return torch.zeros(slots, kv_heads, capacity, head_dim, dtype=dtype, device=device)


class _SlotCache(DynamicCache):
    """KV buffers `[slots, kv_heads, capacity, head_dim]` per layer with one shared write column `n`."""

    def __init__(self, n_layers: int, slots: int, kv_heads: int, head_dim: int, capacity: int, dtype, device):
        super().__init__()
        shape = (slots, kv_heads, capacity, head_dim, dtype, device)
        self.k = [_buffer(*shape, keys=True) for _ in range(n_layers)]
        self.v = [_buffer(*shape, keys=False) for _ in range(n_layers)]
        self.layers = [_SlotLayer(self, i) for i in range(n_layers)]
        self.layer_class_to_replicate = None
        self.n = 0

    def width(self, query_length: int) -> int:
        """Columns attended this step: `n + q` rounded up to a multiple of `BUCKET` (the extra ones are masked).

        Fixed widths keep the set of matmul shapes small: with a new width every step, oneDNN's primitive cache
        and the allocator grew the process by ~1 MB a step (an OOM after ~4 minutes at 64 slots)."""
        return min(self.capacity, -(-(self.n + query_length) // BUCKET) * BUCKET)

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    def shift(self, drop: int, pad: int = 0, room: int = 0) -> None:
        """Drop `drop` columns on the left, add `pad` empty ones there, and leave `room` free on the right."""
        cap = max(self.capacity, -(-(self.n - drop + pad + room) // BUCKET) * BUCKET)
        for buf, keys in ((self.k, True), (self.v, False)):
            for i, b in enumerate(buf):
                new = _buffer(b.shape[0], b.shape[1], cap, b.shape[3], b.dtype, b.device, keys)
                new[:, :, pad : pad + self.n - drop] = b[:, :, drop : self.n]
                buf[i] = new
        self.n = self.n - drop + pad


def _kv_shape(config) -> tuple[int, int, int]:
    text = config.get_text_config(decoder=True)
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return text.num_hidden_layers, getattr(text, "num_key_value_heads", None) or heads, head_dim


def sample(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator,
           head: int = 256) -> torch.Tensor:
    """logits [rows, vocab] → one token per row from softmax(logits / temperature) cut to its top-p nucleus.

    The nucleus is transformers' `TopPLogitsWarper`'s: a token is kept iff the mass strictly above it is
    < `top_p`. That warper sorts the whole vocabulary (~110 ms a step for 64 rows at V = 49k); the nucleus
    almost always lies in the `head` most likely tokens, so those are found with `topk` and only rows whose
    head holds less than `top_p` of the mass take the full sort.
    """
    probs = (logits.float() / temperature).softmax(-1)
    if top_p >= 1.0:  # no nucleus: the warper keeps every token, so no sort is needed
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)
    k = min(head, probs.shape[-1])
    top, idx = probs.topk(k, dim=-1)  # descending
    short = top.sum(-1) < top_p
    if short.any():
        top_full, idx_full = probs[short].sort(-1, descending=True)
        picked = _draw_nucleus(top_full, top_p, generator)
        out = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
        out[short] = idx_full.gather(-1, picked[:, None]).squeeze(1)
        out[~short] = idx[~short].gather(-1, _draw_nucleus(top[~short], top_p, generator)[:, None]).squeeze(1)
        return out
    return idx.gather(-1, _draw_nucleus(top, top_p, generator)[:, None]).squeeze(1)


def _draw_nucleus(top: torch.Tensor, top_p: float, generator: torch.Generator) -> torch.Tensor:
    """top [rows, k] descending probabilities → the drawn rank per row, among ranks whose mass above < top_p."""
    above = top.cumsum(-1) - top
    kept = torch.where(above < top_p, top, torch.zeros_like(top))
    kept[:, 0] = top[:, 0]  # the warper always keeps the most likely token
    return torch.multinomial(kept, 1, generator=generator).squeeze(1)


def by_length_in_windows(jobs: list[Job], window: int) -> list[Job]:
    """`jobs` with each consecutive run of `window` jobs sorted by prompt length (stable; 0 or 1: unchanged).

    Rows decoded together attend over as many columns as the longest of them holds, and a prefill batch pads
    to its longest prompt: neighbours of similar length waste less of both. Windows keep the order's mix at
    any stopping point, to within a window."""
    if window <= 1:
        return list(jobs)
    return [j for i in range(0, len(jobs), window) for j in sorted(jobs[i : i + window], key=lambda j: len(j.prompt_ids))]


def answer(model, jobs: Iterable[Job], eos_ids: Iterable[int], max_new_tokens: int = 256, slots: int = 64,
           prefill_batch: int = 8, seed: int = 0, capacity: int = 1024,
           on_step: Callable[[int], None] | None = None, compact: int = 256) -> Iterator[tuple[Job, list[int]]]:
    """Yield `(job, response_ids)` as answers finish (not in job order); ids end with the EOS if one came.

    `slots` rows decode together; a prefill of up to `prefill_batch` new prompts runs once that many slots are
    free (or the jobs run out). `capacity` is the KV buffer's first width in columns (it grows as needed);
    once no live row uses the first `compact` columns they are dropped, so a step attends about as many
    columns as the oldest live row holds, not the buffer's whole history. `on_step(live_rows)` is called after
    every decode step (progress bars).
    """
    previous = model.config._attn_implementation
    model.set_attn_implementation(ATTENTION)
    try:
        yield from _answer(model, jobs, eos_ids, max_new_tokens, slots, prefill_batch, seed, capacity, on_step,
                           compact)
    finally:
        model.set_attn_implementation(previous)


@torch.no_grad()
def _answer(model, jobs: Iterable[Job], eos_ids: Iterable[int], max_new_tokens: int = 256, slots: int = 64,
           prefill_batch: int = 8, seed: int = 0, capacity: int = 1024, on_step: Callable[[int], None] | None = None,
           compact: int = 256) -> Iterator[tuple[Job, list[int]]]:
    """One pass of the loop; see `answer`."""
    device, dtype = model.device, model.dtype
    eos = set(eos_ids)
    n_layers, kv_heads, head_dim = _kv_shape(model.config)
    gen = torch.Generator(device=device).manual_seed(seed)
    todo = iter(jobs)
    cache = _SlotCache(n_layers, slots, kv_heads, head_dim, capacity, dtype, device)
    mask = torch.zeros(slots, cache.capacity, dtype=torch.long, device=device)  # which columns each row sees
    start = torch.zeros(slots, dtype=torch.long)  # first column of each row (for left compaction)
    pos = torch.zeros(slots, dtype=torch.long, device=device)  # position id of the row's next token
    last = torch.zeros(slots, dtype=torch.long, device=device)  # the row's newest token (the next input)
    owner: list[Job | None] = [None] * slots
    out: list[list[int]] = [[] for _ in range(slots)]
    exhausted = False

    def pick(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """logits [len(rows), vocab] (float32) → next token per row under each row's own law."""
        tok = logits.argmax(-1)
        for law in {(owner[r].temperature, owner[r].top_p) for r in rows if owner[r].temperature > 0}:
            sel = [i for i, r in enumerate(rows) if (owner[r].temperature, owner[r].top_p) == law]
            tok[sel] = sample(logits[sel], *law, generator=gen)
        return tok

    def refill(free: list[int]) -> None:
        nonlocal mask, exhausted
        batch = []
        room = len(free) - len(free) % prefill_batch or len(free)  # whole prefill batches: few distinct shapes
        while len(batch) < room and not exhausted:
            job = next(todo, None)
            if job is None:
                exhausted = True
            else:
                batch.append(job)
        if not batch:
            return
        width = -(-max(len(j.prompt_ids) for j in batch) // 16) * 16
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        pmask = torch.zeros(len(batch), width, dtype=torch.long)
        for i, j in enumerate(batch):
            ids[i, width - len(j.prompt_ids):] = torch.tensor(j.prompt_ids)
            pmask[i, width - len(j.prompt_ids):] = 1
        ppos = (pmask.cumsum(-1) - 1).clamp(min=0)
        fresh = DynamicCache()
        logits = model(input_ids=ids.to(device), attention_mask=pmask.to(device), position_ids=ppos.to(device),
                       cache=fresh, use_cache=True, logits_to_keep=1).logits[:, -1].float()
        if width > cache.n:  # every row must fit right-aligned at the current column
            pad = width - cache.n
            cache.shift(0, pad=pad, room=64)
            mask = torch.cat([mask.new_zeros(slots, pad), mask[:, : cache.capacity - pad]], 1)
            start.add_(pad)
        if mask.shape[1] < cache.capacity:
            mask = torch.cat([mask, mask.new_zeros(slots, cache.capacity - mask.shape[1])], 1)
        slots_used = free[: len(batch)]
        for i, (slot, job) in enumerate(zip(slots_used, batch)):
            owner[slot], out[slot] = job, []
            p = len(job.prompt_ids)
            for li in range(n_layers):
                k, v = fresh.layers[li].keys, fresh.layers[li].values
                cache.k[li][slot, :, cache.n - p : cache.n] = k[i, :, width - p :]
                cache.v[li][slot, :, cache.n - p : cache.n] = v[i, :, width - p :]
            mask[slot] = 0
            mask[slot, cache.n - p : cache.n] = 1
            start[slot] = cache.n - p
            pos[slot] = p
        take(slots_used, pick(logits, slots_used))

    def take(rows: list[int], toks: torch.Tensor) -> None:
        last[rows] = toks
        for r, t in zip(rows, toks.tolist()):
            out[r].append(t)

    def finished() -> Iterator[tuple[Job, list[int]]]:
        for r in range(slots):
            job = owner[r]
            if job is not None and (out[r][-1] in eos or len(out[r]) >= max_new_tokens):
                owner[r] = None
                yield job, out[r]

    refill(list(range(slots)))
    while True:
        yield from finished()
        free = [r for r in range(slots) if owner[r] is None]
        if free and not exhausted and (len(free) >= prefill_batch or len(free) == slots):
            refill(free)
            yield from finished()  # an answer may end at its first token
            free = [r for r in range(slots) if owner[r] is None]
        live = [r for r in range(slots) if owner[r] is not None]
        if not live:
            return
        for r in free:  # a dead row attends to its own newest column only: no NaN, costs one row
            mask[r] = 0
        drop = int(start[live].min())  # columns no live row needs
        if cache.n + 1 > cache.capacity or drop >= compact:  # drop them (and grow if still full)
            cache.shift(drop, room=256)
            mask = torch.cat([mask[:, drop:], mask.new_zeros(slots, cache.capacity - (mask.shape[1] - drop))], 1)
            start.sub_(drop)
        mask[:, cache.n] = 1
        logits = model(input_ids=last[:, None], attention_mask=mask[:, : cache.width(1)], position_ids=pos[:, None],
                       cache=cache, use_cache=True).logits[:, -1].float()
        cache.n += 1
        pos += 1
        take(live, pick(logits[live], live))
        if on_step is not None:
            on_step(len(live))
