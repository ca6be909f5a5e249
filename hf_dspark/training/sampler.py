"""Continuous-batching sampler: answer many prompts with the target, one decode step for all live rows.

`model.generate` on a padded batch keeps stepping every row until the longest answer ends, and its
DynamicCache re-concatenates every layer's keys and values at every step. Here a fixed number of *slots*
share one preallocated KV buffer `[slots, kv_heads, capacity, head_dim]` per layer: a row that ends (EOS or
`max_new_tokens`) frees its slot, new prompts are prefilled in a small batch and written into free slots
right-aligned at the current column, and each row attends only to its own columns (a 2-D mask). Live rows
are kept packed in the first slots (a finished row's slot takes the last live row), so a step computes only
live rows, also while free slots wait for a whole prefill batch and while the last answers drain. Columns no
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
    """One layer's view into its `_SlotCache` buffer: writes the first `rows` slots at the shared column `n`
    and returns their whole buffer `[:rows]` (contiguous: slots lead and every column is attended)."""

    def __init__(self, owner: "_SlotCache", index: int):
        super().__init__()
        self.owner, self.index, self.is_initialized = owner, index, True

    def update(self, key_states, value_states, *args, **kwargs):
        o = self.owner
        n, q, rows = o.n, key_states.shape[-2], key_states.shape[0]
        o.k[self.index][:rows, :, n : n + q] = key_states
        o.v[self.index][:rows, :, n : n + q] = value_states
        return o.k[self.index][:rows], o.v[self.index][:rows]

    def get_seq_length(self) -> int:
        return self.owner.n

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.capacity, 0


class _SlotCache(DynamicCache):
    """Per layer, K and V buffers `[slots, kv_heads, capacity, head_dim]` with one shared write column `n`;
    beside them `mask [slots, capacity]` (the columns each slot's row sees) and `start [slots]` (its first).

    A step attends every column of the buffer, so `k[:rows]` is one contiguous block: CPU `bmm` copies a
    strided operand first (a `[:, :, :width]` slice of a wider buffer costs ~5× the product itself). `fit`
    keeps `capacity` at `n + 1` rounded up to a multiple of `BUCKET`: fixed widths keep the set of matmul
    shapes small (a new width every step grew oneDNN's primitive cache and the allocator ~1 MB a step, an
    OOM after ~4 minutes at 64 slots), at most `BUCKET - 1` masked columns per step.
    """

    def __init__(self, n_layers: int, slots: int, kv_heads: int, head_dim: int, dtype, device):
        super().__init__()
        self.k = [torch.zeros(slots, kv_heads, BUCKET, head_dim, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros_like(self.k[0]) for _ in range(n_layers)]
        self.mask = torch.zeros(slots, BUCKET, dtype=torch.long, device=device)
        self.start = torch.zeros(slots, dtype=torch.long)
        self.layers = [_SlotLayer(self, i) for i in range(n_layers)]
        self.layer_class_to_replicate = None
        self.n = 0

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    def fit(self, drop: int = 0, pad: int = 0) -> None:
        """Drop `drop` columns on the left, add `pad` empty ones there, and size the buffers for one more column.

        Unused columns of V are zeros (a NaN there would survive its zero weight); of K they are left as they
        come, since a masked score is replaced whatever it was."""
        n = self.n - drop + pad
        cap = -(-(n + 1) // BUCKET) * BUCKET
        if (drop, pad, cap) == (0, 0, self.capacity):
            return
        for buf, clean in ((self.k, False), (self.v, True)):
            for i, b in enumerate(buf):
                new = b.new_empty(b.shape[0], b.shape[1], cap, b.shape[3])
                new[:, :, pad:n] = b[:, :, drop : self.n]
                if clean:
                    new[:, :, :pad].zero_()
                    new[:, :, n:].zero_()
                buf[i] = new
        mask = self.mask.new_zeros(self.mask.shape[0], cap)
        mask[:, pad:n] = self.mask[:, drop : self.n]
        self.mask, self.n = mask, n
        self.start.add_(pad - drop)

    def move(self, src: int, dst: int) -> None:
        """Slot `src`'s row into slot `dst`: its columns `[start, n)` in every layer, its mask and start."""
        first = int(self.start[src])
        for buf in (self.k, self.v):
            for b in buf:
                b[dst, :, first : self.n] = b[src, :, first : self.n]
        self.mask[dst] = self.mask[src]
        self.start[dst] = first


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
        return draw(probs, generator)
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
    return draw(kept, generator)


def draw(weights: torch.Tensor, generator: torch.Generator, block: int = 256) -> torch.Tensor:
    """weights [rows, n] ≥ 0 → one index per row, drawn with probability weight / row sum.

    Two inverse-CDF steps in float64: a block of `block` indices by the blocks' sums, then an index within it,
    each from its own uniform. Each block's sum is a sum of float32 weights, so even a tiny weight keeps its
    relative precision (one float32 cumsum over the row would round weights below ~1e-7 of the total), and a
    zero weight is never drawn. `torch.multinomial` over a 49k vocabulary draws an exponential per entry:
    ~50 ms for 64 rows on one CPU thread, against ~2 ms here."""
    rows, n = weights.shape
    w = torch.nn.functional.pad(weights, (0, -n % block)) if n % block else weights
    blocks = w.view(rows, w.shape[1] // block, block)
    cb = blocks.sum(-1, dtype=torch.float64).cumsum(-1)  # [rows, n_blocks]
    u = torch.rand(rows, 2, generator=generator, dtype=torch.float64, device=weights.device)
    b = torch.searchsorted(cb, u[:, :1] * cb[:, -1:], right=True).clamp(max=cb.shape[1] - 1)  # [rows, 1]
    inner = blocks.gather(1, b[:, :, None].expand(rows, 1, block)).squeeze(1).double().cumsum(-1)  # [rows, block]
    j = torch.searchsorted(inner, u[:, 1:] * inner[:, -1:], right=True).clamp(max=block - 1)
    return (b * block + j).squeeze(1)


def by_length_in_windows(jobs: list[Job], window: int) -> list[Job]:
    """`jobs` with each consecutive run of `window` jobs sorted by prompt length (stable; 0 or 1: unchanged).

    Rows decoded together attend over as many columns as the longest of them holds, and a prefill batch pads
    to its longest prompt: neighbours of similar length waste less of both. Windows keep the order's mix at
    any stopping point, to within a window."""
    if window <= 1:
        return list(jobs)
    by_length = lambda j: len(j.prompt_ids)  # noqa: E731
    return [j for i in range(0, len(jobs), window) for j in sorted(jobs[i : i + window], key=by_length)]


def answer(model, jobs: Iterable[Job], eos_ids: Iterable[int], max_new_tokens: int = 256, slots: int = 64,
           prefill_batch: int = 8, seed: int = 0,
           on_step: Callable[[int], None] | None = None) -> Iterator[tuple[Job, list[int]]]:
    """Yield `(job, response_ids)` as answers finish (not in job order); ids end with the EOS if one came.

    `slots` rows decode together; once `prefill_batch` slots are free (or the jobs run out) new prompts fill
    whole batches of them, prefilled `prefill_batch` at a time in order of length (a batch pads to its
    longest). Once no live row uses the first `BUCKET` columns they are dropped, so a step attends about as
    many columns as the oldest live row holds, not the buffer's whole history. `on_step(live_rows)` is called
    after every decode step (progress bars).
    """
    previous = model.config._attn_implementation
    model.set_attn_implementation(ATTENTION)
    try:
        yield from _answer(model, jobs, eos_ids, max_new_tokens, slots, prefill_batch, seed, on_step)
    finally:
        model.set_attn_implementation(previous)


@torch.no_grad()
def _answer(model, jobs: Iterable[Job], eos_ids: Iterable[int], max_new_tokens: int = 256, slots: int = 64,
           prefill_batch: int = 8, seed: int = 0,
           on_step: Callable[[int], None] | None = None) -> Iterator[tuple[Job, list[int]]]:
    """One pass of the loop; see `answer`."""
    device, dtype = model.device, model.dtype
    eos = set(eos_ids)
    n_layers, kv_heads, head_dim = _kv_shape(model.config)
    gen = torch.Generator(device=device).manual_seed(seed)
    todo = iter(jobs)
    cache = _SlotCache(n_layers, slots, kv_heads, head_dim, dtype, device)
    pos = torch.zeros(slots, dtype=torch.long, device=device)  # position id of the row's next token
    last = torch.zeros(slots, dtype=torch.long, device=device)  # the row's newest token (the next input)
    owner: list[Job | None] = [None] * slots
    out: list[list[int]] = [[] for _ in range(slots)]
    live = 0  # rows [0, live) hold answers in progress; [live, slots) are free
    exhausted = False

    def pick(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """logits [len(rows), vocab] (float32) → next token per row under each row's own law."""
        tok = torch.empty(len(rows), dtype=torch.long, device=logits.device)
        for law in {(owner[r].temperature, owner[r].top_p) for r in rows}:
            sel = [i for i, r in enumerate(rows) if (owner[r].temperature, owner[r].top_p) == law]
            tok[sel] = logits[sel].argmax(-1) if law[0] <= 0 else sample(logits[sel], *law, generator=gen)
        return tok

    def refill() -> None:
        nonlocal exhausted, live
        batch = []
        free = slots - live
        room = free - free % prefill_batch or free  # whole prefill batches: few distinct shapes
        while len(batch) < room and not exhausted:
            job = next(todo, None)
            if job is None:
                exhausted = True
            else:
                batch.append(job)
        if not batch:
            return
        longest = max(len(j.prompt_ids) for j in batch)
        if longest > cache.n:  # every row must fit right-aligned at the current column
            cache.fit(pad=longest - cache.n)
        batch.sort(key=lambda j: len(j.prompt_ids))  # prefill batches of similar lengths pad little
        for c in range(0, len(batch), prefill_batch):
            rows = list(range(live, live + len(batch[c : c + prefill_batch])))
            live += len(rows)
            take(rows, pick(prefill(batch[c : c + prefill_batch], rows), rows))

    def prefill(batch: list[Job], rows: list[int]) -> torch.Tensor:
        """Prefill `batch` (padded on the left) and write it right-aligned at column n into slots `rows`
        → its last logits [len(rows), vocab] (float32)."""
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
        n = cache.n
        for i, (slot, job) in enumerate(zip(rows, batch)):
            owner[slot], out[slot] = job, []
            p = len(job.prompt_ids)
            for li in range(n_layers):
                cache.k[li][slot, :, n - p : n] = fresh.layers[li].keys[i, :, width - p :]
                cache.v[li][slot, :, n - p : n] = fresh.layers[li].values[i, :, width - p :]
            cache.mask[slot] = 0
            cache.mask[slot, n - p : n] = 1
            cache.start[slot] = n - p
            pos[slot] = p
        return logits

    def take(rows: list[int], toks: torch.Tensor) -> None:
        last[rows] = toks
        for r, t in zip(rows, toks.tolist()):
            out[r].append(t)

    def finished() -> Iterator[tuple[Job, list[int]]]:
        nonlocal live
        r = 0
        while r < live:
            job = owner[r]
            if out[r][-1] in eos or len(out[r]) >= max_new_tokens:
                yield job, out[r]
                live -= 1
                if r < live:  # the last live row takes this slot: live rows stay packed in [0, live)
                    cache.move(live, r)
                    pos[r], last[r] = pos[live], last[live]
                    owner[r], out[r] = owner[live], out[live]
                owner[live], out[live] = None, []
            else:
                r += 1

    refill()
    while True:
        yield from finished()
        free = slots - live
        if free and not exhausted and (free >= prefill_batch or free == slots):
            refill()
            yield from finished()  # an answer may end at its first token
        if not live:
            return
        rows = list(range(live))
        drop = int(cache.start[:live].min())  # columns no live row needs
        cache.fit(drop if drop >= BUCKET or cache.n + 1 > cache.capacity else 0)  # a copy: once a bucket is free
        cache.mask[:live, cache.n] = 1
        logits = model(input_ids=last[:live, None], attention_mask=cache.mask[:live],
                       position_ids=pos[:live, None], cache=cache, use_cache=True).logits[:, -1].float()
        cache.n += 1
        pos[:live] += 1
        take(rows, pick(logits, rows))
        if on_step is not None:
            on_step(live)
