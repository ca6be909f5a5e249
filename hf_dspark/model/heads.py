"""Sequential heads (Markov, RNN) and the confidence head, plus the reference left-to-right draft loop.

The backbone drafts all γ positions in parallel; a sequential head then adds a bias B_k to each
position's base logits U_k that depends on the previous draft token(s), so later positions condition
on earlier ones. Every q_k stays an exact softmax, which keeps rejection sampling lossless.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn


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


class MarkovHead(_LowRank):
    """B_k = W2 · W1[x_{k-1}]: a rank-r first-order transition bias. Stateless."""

    def __init__(self, vocab_size: int, rank: int, hidden_size: int):
        super().__init__(vocab_size, rank)

    def pre_bias(self, prev_ids: torch.Tensor, h: torch.Tensor, state: torch.Tensor | None):
        """prev_ids [...], h [..., d] → (u [..., r] with B = W2·u, prev embedding W1[prev] [..., r], state)."""
        e = self.W1(prev_ids)
        return e, e, state

    def step(self, prev_ids: torch.Tensor, h: torch.Tensor, state: torch.Tensor | None):
        """prev_ids [...], h [..., d] → (bias [..., V], prev embedding W1[prev] [..., r], state)."""
        u, e, state = self.pre_bias(prev_ids, h, state)
        return self.W2(u), e, state

    def block(self, prev_ids: torch.Tensor, h: torch.Tensor):
        """Teacher-forced, all positions at once: prev_ids [B, γ], h [B, γ, d] → bias [B, γ, V], emb [B, γ, r]."""
        bias, e, _ = self.step(prev_ids, h, None)
        return bias, e


class GatedMarkovHead(_LowRank):
    """B_k = W2 · (g ⊙ W1[x_{k-1}]), g = σ(W_g [h_k ; W1[x_{k-1}]] + b): DeepSpec's code-only `gated` variant.
    Stateless; the gate lets the backbone state h_k scale the transition bias."""

    def __init__(self, vocab_size: int, rank: int, hidden_size: int):
        super().__init__(vocab_size, rank)
        self.gate_proj = nn.Linear(hidden_size + rank, rank)

    def pre_bias(self, prev_ids: torch.Tensor, h: torch.Tensor, state: torch.Tensor | None):
        """→ (u = g ⊙ W1[prev] [..., r] with B = W2·u, W1[prev] [..., r], state unchanged)."""
        e = self.W1(prev_ids)
        gate = torch.sigmoid(self.gate_proj(torch.cat([h, e.to(h.dtype)], dim=-1)))
        return gate * e, e, state

    step = MarkovHead.step
    block = MarkovHead.block


class RNNHead(_LowRank):
    """Gated recurrent bias: s_k = σ(g)⊙s_{k-1} + (1-σ(g))⊙tanh(c), B_k = W2·tanh(o) (from the old state).
    Input order [state ; W1[x_{k-1}] ; h_k], output split (gate, candidate, output), as in DeepSpec."""

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

    def step(self, prev_ids: torch.Tensor, h: torch.Tensor, state: torch.Tensor | None):
        u, e, state = self.pre_bias(prev_ids, h, state)
        return self.W2(u), e, state

    def block(self, prev_ids: torch.Tensor, h: torch.Tensor):
        state, biases, embs = None, [], []
        for k in range(prev_ids.shape[1]):
            b, e, state = self.step(prev_ids[:, k], h[:, k], state)
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


def build_head(config) -> nn.Module | None:
    if config.head_type == "markov":
        return MarkovHead(config.vocab_size, config.markov_rank, config.hidden_size)
    if config.head_type == "gated":
        return GatedMarkovHead(config.vocab_size, config.markov_rank, config.hidden_size)
    if config.head_type == "rnn":
        return RNNHead(config.vocab_size, config.markov_rank, config.hidden_size)
    return None


@dataclass
class DraftBlock:
    """One round's draft. tokens [n] long; logits [n, V] float32, the exact (processed) logits each token was
    drawn from, so q_k = softmax(logits[k]); conf_logits [n] float32 raw confidence logits (uncalibrated)."""

    tokens: torch.Tensor
    logits: torch.Tensor
    conf_logits: torch.Tensor


Processor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def draw(z: torch.Tensor) -> torch.Tensor:
    """One token from softmax(z), z [1, V]: inverse CDF on one uniform, in float64. The same law as
    torch.multinomial, ~20× faster on CPU at V = 49k (one uniform instead of a pass of random numbers over V).
    A token of probability 0 has no width in the CDF and is never drawn: the draft vocabulary's -inf stay out."""
    cdf = torch.softmax(z.double(), dim=-1).cumsum(dim=-1)
    u = torch.rand(1, 1, dtype=torch.float64, device=z.device) * cdf[:, -1:]
    # u < cdf[-1] up to rounding; the min keeps a rounding of u onto cdf[-1] on the last token with mass
    last = (cdf < cdf[:, -1:]).sum(dim=-1, keepdim=True)
    return torch.minimum(torch.searchsorted(cdf, u, right=True), last).view(1)


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
) -> DraftBlock:
    """The reference left-to-right loop: x_k ~ processor(U_k + B_k(x_{k-1})).

    base_logits [n, V'] float32 (U_k), hidden [n, d] (h_k), anchor: 0-dim long (x_0), prefix_ids [1, cur_len]
    (the sequence so far; processors see prefix + drafts as the target's processors will), processor: the
    target's logits processors (temperature, top-k/p, penalties...) so q is what the tokens are drawn from.

    Draft vocabulary: with `vocab` [V'] (token ids) the logits cover only those tokens, `w2` [V', r] holds the
    matching rows of the head's W2, and q is 0 elsewhere (logits -inf), which keeps rejection sampling exact:
    q is still exactly what the tokens are drawn from. `vocab_size` is the full V for the returned logits.
    """
    n = base_logits.shape[0]
    prev, state = anchor.view(1), None
    tokens, logits, confs = [], [], []
    seq = prefix_ids.to(base_logits.device)  # processors index logits with it (device_map: may differ)
    for k in range(n):
        z = base_logits[k : k + 1]
        emb = None
        if head is not None:
            u, emb, state = head.pre_bias(prev, hidden[k : k + 1], state)
            z = z + (u @ (head.W2.weight.T if w2 is None else w2.T)).float()
        if confidence is not None:
            confs.append(confidence(hidden[k : k + 1], emb).float())
        if vocab is not None:  # back to full-vocabulary ids: processors and the verifier work there
            z = torch.full((1, vocab_size), float("-inf"), device=z.device).index_copy_(1, vocab, z)
        if processor is not None:
            z = processor(seq, z)
        if do_sample:
            x = draw(z)
        else:
            x = z.argmax(dim=-1)
        tokens.append(x)
        logits.append(z)
        prev = x
        if processor is not None and k + 1 < n:
            seq = torch.cat([seq, x.view(1, 1).to(seq.device)], dim=-1)
    conf = torch.cat(confs) if confs else torch.zeros(n)
    return DraftBlock(torch.cat(tokens), torch.cat(logits), conf)
