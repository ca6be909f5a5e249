"""Sequential heads (Markov, RNN) and the confidence head, plus the reference left-to-right draft loop.

The backbone drafts all γ positions in parallel; a sequential head then adds a bias B_k to each
position's base logits U_k that depends on the previous draft token(s), so later positions condition
on earlier ones. Every q_k stays an exact softmax, which keeps rejection sampling lossless.

The choice between the Triton kernels (kernels/dspark_kernels) and this PyTorch code is made here, once:
`draft_block` and `fuse_context` are what the drafter calls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.models.llama.modeling_llama import LlamaRMSNorm

try:  # kernels/dspark_kernels (docs/kernels.md); without it the PyTorch code runs everywhere
    from dspark_kernels import dispatch as kernels
except ModuleNotFoundError as e:
    if e.name != "dspark_kernels":
        raise
    kernels = None


class _LowRank(nn.Module):
    """W1 (previous-token embedding) and W2 (r → V bias projection), named as in DeepSpec checkpoints."""

    def __init__(self, vocab_size: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)

    @property
    def W1(self) -> nn.Embedding:
        return self.markov_w1

    @property
    def W2(self) -> nn.Linear:
        return self.markov_w2

    def bias(self, u: torch.Tensor, w2: torch.Tensor | None = None) -> torch.Tensor:
        """u [..., r] → B = W2·u [..., V], or through `w2` [V', r] (rows of W2 for a pruned vocabulary) → [..., V']."""
        return self.W2(u) if w2 is None else nn.functional.linear(u.to(w2.dtype), w2)

    def step(self, prev_ids: torch.Tensor, h: torch.Tensor, state: torch.Tensor | None, w2: torch.Tensor | None = None):
        """prev_ids [...], h [..., d] → (bias [..., V] (V' with `w2`), prev embedding W1[prev] [..., r], state):
        each head's `pre_bias`, then the shared projection."""
        u, e, state = self.pre_bias(prev_ids, h, state)
        return self.bias(u, w2), e, state


class MarkovHead(_LowRank):
    """B_k = W2 · W1[x_{k-1}]: a rank-r first-order transition bias. Stateless."""

    deepspec_name = "vanilla"  # DeepSpec's markov_head_type
    extra_tensors: tuple[tuple[str, str], ...] = ()  # (name under markov_head., shape in config terms) beyond W1/W2

    def __init__(self, vocab_size: int, rank: int, hidden_size: int):
        super().__init__(vocab_size, rank)

    def pre_bias(self, prev_ids: torch.Tensor, h: torch.Tensor, state: torch.Tensor | None):
        """prev_ids [...], h [..., d] → (u [..., r] with B = W2·u, prev embedding W1[prev] [..., r], state)."""
        e = self.W1(prev_ids)
        return e, e, state

    def block(self, prev_ids: torch.Tensor, h: torch.Tensor, w2: torch.Tensor | None = None):
        """Teacher-forced, all positions at once: prev_ids [B, γ], h [B, γ, d] → bias [B, γ, V], emb [B, γ, r]."""
        bias, e, _ = self.step(prev_ids, h, None, w2)
        return bias, e


class GatedMarkovHead(_LowRank):
    """B_k = W2 · (g ⊙ W1[x_{k-1}]), g = σ(W_g [h_k ; W1[x_{k-1}]] + b): DeepSpec's code-only `gated` variant.
    Stateless; the gate lets the backbone state h_k scale the transition bias."""

    deepspec_name = "gated"
    extra_tensors = (("gate_proj.weight", "r, d+r"), ("gate_proj.bias", "r"))

    def __init__(self, vocab_size: int, rank: int, hidden_size: int):
        super().__init__(vocab_size, rank)
        self.gate_proj = nn.Linear(hidden_size + rank, rank)

    def pre_bias(self, prev_ids: torch.Tensor, h: torch.Tensor, state: torch.Tensor | None):
        """→ (u = g ⊙ W1[prev] [..., r] with B = W2·u, W1[prev] [..., r], state unchanged)."""
        e = self.W1(prev_ids)
        gate = torch.sigmoid(self.gate_proj(torch.cat([h, e.to(h.dtype)], dim=-1)))
        return gate * e, e, state

    block = MarkovHead.block


class RNNHead(_LowRank):
    """Gated recurrent bias: s_k = σ(g)⊙s_{k-1} + (1-σ(g))⊙tanh(c), B_k = W2·tanh(o) (from the old state).
    Input order [state ; W1[x_{k-1}] ; h_k], output split (gate, candidate, output), as in DeepSpec."""

    deepspec_name = "rnn"
    extra_tensors = (("joint_proj.weight", "3*r, 2*r+d"), ("joint_proj.bias", "3*r"))

    def __init__(self, vocab_size: int, rank: int, hidden_size: int):
        super().__init__(vocab_size, rank)
        self.rank = rank
        self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)

    def pre_bias(self, prev_ids: torch.Tensor, h: torch.Tensor, state: torch.Tensor | None):
        """→ (u = tanh(o) [..., r] with B = W2·u, W1[prev] [..., r], new state [..., r])."""
        e = self.W1(prev_ids)
        if state is None:
            state = e.new_zeros(e.shape)
        g, c, o = self.joint_proj(torch.cat([state, e, h], dim=-1)).chunk(3, dim=-1)
        gate = torch.sigmoid(g)
        new_state = gate * state + (1 - gate) * torch.tanh(c)
        return torch.tanh(o), e, new_state

    def block(self, prev_ids: torch.Tensor, h: torch.Tensor, w2: torch.Tensor | None = None):
        state, biases, embs = None, [], []
        for k in range(prev_ids.shape[1]):
            b, e, state = self.step(prev_ids[:, k], h[:, k], state, w2)
            biases.append(b)
            embs.append(e)
        return torch.stack(biases, 1), torch.stack(embs, 1)


class ConfidenceHead(nn.Module):
    """c_k = σ(w·[h_k ; W1[x_{k-1}]] + b). It never sees x_k, which keeps a scheduler using it lossless."""

    def __init__(self, in_features: int, use_prev: bool = True):
        super().__init__()
        self.proj = nn.Linear(in_features, 1)
        self.use_prev = use_prev  # False: DeepSpec's confidence_head_with_markov=false, the head reads h only

    def forward(self, h: torch.Tensor, prev_emb: torch.Tensor | None) -> torch.Tensor:
        """h [..., d], prev_emb [..., r] or None → raw logit [...] (σ and calibration are applied by the user)."""
        x = h if prev_emb is None or not self.use_prev else torch.cat([h, prev_emb.to(h.dtype)], dim=-1)
        return self.proj(x).squeeze(-1)


# The sequential heads by config.head_type. A new head type is one class (pre_bias / step / block, its
# deepspec_name and extra_tensors) plus one entry here: the config's allowed values, the trainer's --head
# choices and the DeepSpec key table and head names are derived from this dict. "none" is the DFlash ablation.
HEADS: dict[str, type[_LowRank] | None] = {"markov": MarkovHead, "gated": GatedMarkovHead, "rnn": RNNHead, "none": None}


def build_head(config) -> nn.Module | None:
    cls = HEADS[config.head_type]
    return cls(config.vocab_size, config.markov_rank, config.hidden_size) if cls is not None else None


@dataclass
class DraftBlock:
    """One round's draft. tokens [n] long; logits [n, V] float32, the exact (processed) logits each token was
    drawn from, so q_k = softmax(logits[k]), or None where nothing needs q (greedy drafts: the target judges their
    tokens); conf_logits [n] float32 raw confidence logits (uncalibrated);
    confidences [n] the calibrated c_k on the CPU (set by DSparkDraftModel.draft; None without a confidence head)."""

    tokens: torch.Tensor
    logits: torch.Tensor | None
    conf_logits: torch.Tensor
    confidences: torch.Tensor | None = None


Processor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def draw_from(weights: torch.Tensor) -> torch.Tensor:
    """One token per row of nonnegative `weights` [n, V] (any scale) → [n]: inverse CDF on one uniform per row, in
    float64. A token of weight 0 has no width in the CDF and is never drawn (the draft vocabulary's -inf, a residual's
    clamped entries)."""
    cdf = weights.double().cumsum(dim=-1)
    u = torch.rand(weights.shape[0], 1, dtype=torch.float64, device=weights.device) * cdf[:, -1:]
    # u < cdf[-1] up to rounding; the min keeps a rounding of u onto cdf[-1] on the last token with mass
    last = (cdf < cdf[:, -1:]).sum(dim=-1, keepdim=True)
    return torch.minimum(torch.searchsorted(cdf, u, right=True), last).view(-1)


def draw(z: torch.Tensor) -> torch.Tensor:
    """One token per row from softmax(z), z [n, V] → [n]. The same law as torch.multinomial, ~4× faster on a Zen 3 at
    V = 49k (one uniform per row instead of a pass of random numbers over V)."""
    return draw_from(torch.softmax(z.double(), dim=-1))


# Warpers that act on each row alone and ignore the ids (exact classes: a subclass may not). On a row whose only
# finite entries are the draft vocabulary's, they give those entries the same values whether the -inf columns are
# there or not (up to float rounding in a softmax's normaliser), so a sampled draft can be processed and drawn on
# the V' columns alone; q is then exactly what the token was drawn from, which is all rejection sampling needs.
ROW_WARPERS = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper)


def _row_wise(processor) -> bool:
    """No processor, or a list of ROW_WARPERS only."""
    return processor is None or (isinstance(processor, list) and all(type(p) in ROW_WARPERS for p in processor))


def sequential_draft(
    base_logits: torch.Tensor,
    hidden: torch.Tensor,
    anchor: torch.Tensor,
    head: nn.Module | None,
    confidence: nn.Module | None,
    prefix_ids: torch.Tensor,
    processor: Processor | None,
    do_sample: bool,
    vocab: torch.Tensor | None = None,
    w2: torch.Tensor | None = None,
    vocab_size: int | None = None,
    need_logits: bool = True,
) -> DraftBlock:
    """The reference left-to-right loop: x_k ~ processor(U_k + B_k(x_{k-1})).

    base_logits [n, V'] float32 (U_k), hidden [n, d] (h_k), anchor: 0-dim long (x_0), prefix_ids [1, cur_len]
    (the sequence so far; processors see prefix + drafts as the target's processors will), processor: the
    target's logits processors (temperature, top-k/p, penalties...) so q is what the tokens are drawn from.

    Draft vocabulary: with `vocab` [V'] (token ids) the logits cover only those tokens, `w2` [V', r] holds the
    matching rows of the head's W2, and q is 0 elsewhere (logits -inf), which keeps rejection sampling exact:
    q is still exactly what the tokens are drawn from. `vocab_size` is the full V for the returned logits. A sampled
    draft whose processors are all ROW_WARPERS (or none) is processed and drawn on the V' columns alone, and its rows
    are widened to V with -inf once, at the end (the same q, ~V/V' less work per token).
    need_logits=False (greedy drafts only): return no logits, and without processors take the argmax over the
    draft vocabulary's own V' columns (the same token: ids are sorted, the rest are -inf) instead of building each
    position's full-vocabulary row.
    """
    if do_sample and not need_logits:
        raise ValueError("sampled drafts need their logits: q is what rejection sampling divides by")
    n = base_logits.shape[0]
    prev, state = anchor.view(1), None
    tokens, logits, confs = [], [], []
    seq = prefix_ids.to(base_logits.device)  # processors index logits with it (device_map: may differ)
    # a sampled draft on the draft vocabulary's columns: V' wide instead of V (ROW_WARPERS), rows widened once at the end
    narrow = do_sample and vocab is not None and _row_wise(processor)
    for k in range(n):
        z = base_logits[k : k + 1]
        emb = None
        if head is not None:
            u, emb, state = head.pre_bias(prev, hidden[k : k + 1], state)
            z = z + (u @ (head.W2.weight.T if w2 is None else w2.T)).float()
        if confidence is not None:
            confs.append(confidence(hidden[k : k + 1], emb).float())
        if narrow:
            if processor is not None:
                z = processor(seq, z)
            x = vocab[draw(z)]
            logits.append(z)
        elif vocab is not None and not need_logits and processor is None:
            x = vocab[z.argmax(dim=-1)]  # a greedy draft on the draft vocabulary's columns
        else:
            if vocab is not None:  # back to full-vocabulary ids: processors and the verifier work there
                z = torch.full((1, vocab_size), float("-inf"), device=z.device).index_copy_(1, vocab, z)
            if processor is not None:
                z = processor(seq, z)
            x = draw(z) if do_sample else z.argmax(dim=-1)
            if need_logits:
                logits.append(z)
        tokens.append(x)
        prev = x
        if processor is not None and not narrow and k + 1 < n:
            seq = torch.cat([seq, x.view(1, 1).to(seq.device)], dim=-1)
    conf = torch.cat(confs) if confs else torch.zeros(n)
    if narrow:  # q over the full vocabulary: -inf outside the draft vocabulary, as the token was drawn
        q = torch.cat(logits)
        return DraftBlock(torch.cat(tokens), q.new_full((n, vocab_size), float("-inf")).index_copy_(1, vocab, q), conf)
    return DraftBlock(torch.cat(tokens), torch.cat(logits) if need_logits else None, conf)


# ---- kernel or PyTorch ---------------------------------------------------------------------------------------
def kernel_plan(head, confidence, processor) -> dict | str:
    """The Markov kernel's settings {temperature, top_k} for a draft, or a string saying why the reference must
    run: the tokens must be drawn from exactly the logits handed to the rejection sampler, and only the
    reference applies arbitrary processors and heads."""
    if head is not None and type(head) is not MarkovHead:
        return f"head {type(head).__name__}"
    if confidence is not None and (type(confidence) is not ConfidenceHead or confidence.proj.out_features != 1):
        return f"confidence head {type(confidence).__name__}"
    temperature = top_k = None
    if processor is not None and not isinstance(processor, list):
        return f"logits processor {type(processor).__name__}"
    for p in processor or ():
        # transformers' order: temperature, then top-k; anything else (penalties, top-p, ...) needs the reference
        if type(p) is TemperatureLogitsWarper and temperature is None and top_k is None:
            temperature = float(p.temperature)
        elif (type(p) is TopKLogitsWarper and top_k is None and p.filter_value == -math.inf
              and p.top_k <= kernels.MAX_TOP_K):
            top_k = int(p.top_k)
        else:
            return f"logits processor {type(p).__name__}"
    return {"temperature": temperature, "top_k": top_k}


def draft_block(base_logits, hidden, anchor, head, confidence, prefix_ids, processor, do_sample,
                vocab=None, w2=None, vocab_size=None, backend: str | None = None, need_logits: bool = True
                ) -> DraftBlock:
    """sequential_draft's arguments and DraftBlock, on the fused Markov kernel when `kernels.use_kernels` says so
    (`backend`: "auto" | "triton" | "torch", default HF_DSPARK_KERNELS; docs/kernels.md) and the draft's settings
    allow it (kernel_plan), else sequential_draft.
    The kernel samples with Gumbel noise from torch's generator: a different stream than the reference's one
    uniform per token (draw), the same distribution, and the returned logits are exactly the ones sampled from.
    need_logits=False lets the reference skip q for greedy drafts; the kernel returns it anyway."""
    args = (base_logits, hidden, anchor, head, confidence, prefix_ids, processor, do_sample)
    if kernels is None or not kernels.use_kernels(base_logits, backend):
        return sequential_draft(*args, vocab=vocab, w2=w2, vocab_size=vocab_size, need_logits=need_logits)
    plan = kernel_plan(head, confidence, processor)
    if isinstance(plan, str):
        if (backend or kernels.backend()) == "triton":
            kernels.warn_once(plan)
        return sequential_draft(*args, vocab=vocab, w2=w2, vocab_size=vocab_size, need_logits=need_logits)
    n, vd = base_logits.shape
    w1 = head.W1.weight if head is not None else None
    if head is not None and w2 is None:
        w2 = head.W2.weight
    conf_w = conf_b = None
    if confidence is not None:
        proj = confidence.proj
        conf_w = proj.weight.reshape(-1)
        conf_b = proj.bias if proj.bias is not None else conf_w.new_zeros(1)
    uniforms = torch.rand(n, vd, device=base_logits.device) if do_sample else None
    tokens, logits, conf = kernels.markov_draft(
        base_logits, anchor, w1, w2 if head is not None else None, hidden, conf_w, conf_b, vocab,
        vocab_size or vd, uniforms=uniforms, **plan,
    )
    return DraftBlock(tokens, logits, conf if conf is not None else torch.zeros(n))


def fuse_context(features: torch.Tensor, fc: nn.Linear, norm: nn.Module, backend: str | None = None) -> torch.Tensor:
    """features [B, n, m·d] → norm(fc(features)) [B, n, d]: the fused kernel for a bias-free fc followed by a
    LlamaRMSNorm when `kernels.use_kernels` says so (`backend` as in draft_block), else the modules themselves."""
    if (kernels is not None and kernels.use_kernels(features, backend) and fc.bias is None
            and type(norm) is LlamaRMSNorm):
        return kernels.context_fusion(features, fc.weight, norm.weight, norm.variance_epsilon)
    return norm(fc(features.to(fc.weight.dtype)))
