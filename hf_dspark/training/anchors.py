"""Random anchors inside the response and the teacher-forced blocks they define.

Slot j (0-based) of the block anchored at position a sits at position a+j, holds x_a (j=0) or MASK, and
predicts token a+j+1; its target distribution is LMHead(last_hidden[a+j]) and its Markov previous token is
the ground-truth x_{a+j}. The block sees context positions < a only (the anchor's own features do not exist
at inference) plus the slots of its own block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Blocks:
    """N anchors per sequence, γ slots per block. Shapes: anchors/keep [B, N]; the rest [B, N, γ]."""

    anchors: torch.Tensor  # long, anchor position a (0 for dummy blocks)
    keep: torch.Tensor  # bool, False for dummy blocks (fewer candidates than N)
    positions: torch.Tensor  # long, a + j: the slot's position id, and where its target distribution is read
    input_ids: torch.Tensor  # long, [x_a, MASK, ..., MASK]
    prev_ids: torch.Tensor  # long, x_{a+j}: the Markov head's teacher-forced previous token
    labels: torch.Tensor  # long, x_{a+j+1}
    valid: torch.Tensor  # bool, label supervised: cumulative (stops at the first label past the end / outside M)


def candidate_anchors(loss_mask: torch.Tensor, length: int) -> torch.Tensor:
    """loss_mask [n] (1 = response token) → positions a ≤ length-2 with M[a] = M[a+1] = 1."""
    m = loss_mask[:length].bool()
    if length < 2:
        return torch.empty(0, dtype=torch.long)
    return torch.nonzero(m[:-1] & m[1:]).flatten()


def sample_blocks(input_ids: torch.Tensor, loss_mask: torch.Tensor, lengths: torch.Tensor, num_anchors: int,
                  block_size: int, mask_token_id: int, generators: list[torch.Generator] | None = None) -> Blocks:
    """input_ids/loss_mask [B, n] right padded, lengths [B] → Blocks with `num_anchors` sorted anchors per
    sequence, sampled uniformly without replacement (each sequence its own generator, so the draw does not
    depend on how a batch is split across processes)."""
    B, n = input_ids.shape
    N, g = num_anchors, block_size
    anchors = torch.zeros(B, N, dtype=torch.long)
    keep = torch.zeros(B, N, dtype=torch.bool)
    for b in range(B):
        cand = candidate_anchors(loss_mask[b].cpu(), int(lengths[b]))
        gen = generators[b] if generators is not None else None
        if len(cand) > N:
            cand = cand[torch.randperm(len(cand), generator=gen)[:N]].sort().values
        anchors[b, : len(cand)] = cand
        keep[b, : len(cand)] = True
    anchors, keep = anchors.to(input_ids.device), keep.to(input_ids.device)
    j = torch.arange(g, device=input_ids.device)
    positions = anchors[..., None] + j  # [B, N, γ]
    label_pos = positions + 1
    in_seq = label_pos < lengths[:, None, None]
    gather = lambda t, pos: torch.gather(t, 1, pos.clamp(max=n - 1).flatten(1)).view(B, N, g)
    labels = gather(input_ids, label_pos)
    prev_ids = gather(input_ids, positions)
    valid = in_seq & gather(loss_mask, label_pos).bool() & keep[..., None]
    valid = valid.long().cumprod(-1).bool()  # supervision stops at the first invalid label
    block_in = torch.full_like(prev_ids, mask_token_id)
    block_in[..., 0] = prev_ids[..., 0]
    return Blocks(anchors, keep, positions, block_in, prev_ids, labels, valid)


def block_mask(anchors: torch.Tensor, block_size: int, context_len: int) -> torch.Tensor:
    """anchors [B, N] → bool SDPA mask [B, 1, N·γ, n + N·γ] (True = may attend).

    A slot of block b sees context positions < a_b and every slot of block b (bidirectional inside the block),
    so no query row is fully masked (SDPA would return NaN for it), dummy blocks included.
    """
    B, N = anchors.shape
    g, dev = block_size, anchors.device
    ctx = torch.arange(context_len, device=dev)[None, None, :] < anchors[..., None]  # [B, N, n]
    ctx = ctx.repeat_interleave(g, dim=1)  # [B, N·γ, n]
    blk = torch.arange(N * g, device=dev) // g
    own = (blk[:, None] == blk[None, :]).expand(B, -1, -1)  # [B, N·γ, N·γ]
    return torch.cat([ctx, own], dim=-1)[:, None]
