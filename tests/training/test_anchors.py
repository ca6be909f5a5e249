"""training/anchors.py: candidate anchors, sampled blocks inside the response, the block attention mask."""

import pytest
import torch

from hf_dspark.training.anchors import block_mask, candidate_anchors, sample_blocks

torch.set_num_threads(1)


def _batch():
    # seq 0: prompt 5, response 10, length 15; seq 1: prompt 3, response 4, length 7 (padded to 15)
    ids = torch.arange(100, 115).repeat(2, 1)
    mask = torch.zeros(2, 15, dtype=torch.long)
    mask[0, 5:15] = 1
    mask[1, 3:7] = 1
    lengths = torch.tensor([15, 7])
    return ids, mask, lengths


def test_candidate_anchors_inside_response():
    _, mask, _lengths = _batch()
    assert candidate_anchors(mask[0], 15).tolist() == list(range(5, 14))
    assert candidate_anchors(mask[1], 7).tolist() == [3, 4, 5]


@pytest.mark.parametrize("seed", range(5))
def test_blocks_never_cover_prompt_or_run_past_end(seed):
    ids, mask, lengths = _batch()
    gens = [torch.Generator().manual_seed(seed * 10 + b) for b in range(2)]
    bl = sample_blocks(ids, mask, lengths, num_anchors=6, block_size=4, mask_token_id=7, generators=gens)
    for b in range(2):
        n_prompt = 5 if b == 0 else 3
        for i in range(6):
            if not bl.keep[b, i]:
                assert not bl.valid[b, i].any()
                continue
            a = int(bl.anchors[b, i])
            assert a >= n_prompt and a + 1 < lengths[b]  # anchor and first label are response tokens
            for j in range(4):
                if bl.valid[b, i, j]:
                    lab = a + j + 1
                    assert n_prompt <= lab < lengths[b]
                    # off-by-one: slot j sits at position a+j, predicts a+j+1, Markov prev = x_{a+j}
                    assert bl.positions[b, i, j] == a + j
                    assert bl.labels[b, i, j] == ids[b, lab]
                    assert bl.prev_ids[b, i, j] == ids[b, a + j]
            v = bl.valid[b, i].long()
            assert (v[1:] <= v[:-1]).all()  # contiguous valid prefix
            assert bl.input_ids[b, i, 0] == ids[b, a] and (bl.input_ids[b, i, 1:] == 7).all()
    # seq 1 has only 3 candidate anchors: 3 kept, the rest dummies
    assert bl.keep[1].sum() == 3
    # a block anchored at 5 in seq 1 (length 7) has exactly one valid label (position 6)
    i = (bl.anchors[1] == 5).nonzero()[0, 0]
    assert bl.valid[1, i].tolist() == [True, False, False, False]


def test_block_mask_context_strictly_before_anchor_and_no_empty_rows():
    anchors = torch.tensor([[0, 4, 2]])
    m = block_mask(anchors, 2, context_len=6)[0, 0]  # [3·2, 6 + 6]
    assert m.shape == (6, 12)
    assert m.any(-1).all()  # no fully masked row (SDPA NaN)
    for blk, a in enumerate([0, 4, 2]):
        for j in range(2):
            row = m[blk * 2 + j]
            assert row[:6].tolist() == [p < a for p in range(6)]
            assert row[6:].tolist() == [s // 2 == blk for s in range(6)]
