"""referee.judge_divergence: a bf16/fp16 greedy output that left plain's passes only if, from the first difference
on, every token is within the tolerance of the float32 referee's best; a far token anywhere there fails."""

import torch

from hf_dspark.eval.referee import judge_divergence
from tests.conftest import tiny_target

PROMPT = torch.tensor([[3, 14, 15, 9, 26, 5]])


def _plain(model, n=6):
    return model.generate(PROMPT, max_new_tokens=n, do_sample=False)


@torch.no_grad()
def _ranked(model, prefix: torch.Tensor, rank: int) -> tuple[int, float]:
    """The token the model ranks `rank`-th after `prefix` [1, L] (0 = its choice; -1 = least likely) and its gap to
    the best logit."""
    logits = model(prefix).logits[0, -1]
    order = logits.argsort(descending=True)
    tok = int(order[rank])
    return tok, float(logits[order[0]] - logits[tok])


def _replace(out: torch.Tensor, pos: int, tok: int) -> torch.Tensor:
    out = out.clone()
    out[0, pos] = tok
    return out


def test_near_tie_passes_far_token_fails_tolerance_decides():
    model = tiny_target(logit_scale=4.0)
    plain = _plain(model)
    second, gap2 = _ranked(model, plain[:, :-1], 1)
    last, gap_last = _ranked(model, plain[:, :-1], -1)
    assert 0 < gap2 < gap_last
    tol = (gap2 + gap_last) / 2

    tie = judge_divergence(plain, _replace(plain, -1, second), PROMPT.shape[1], model, tol)
    assert tie["near_tie"] and tie["position"] == plain.shape[1] - 1 - PROMPT.shape[1]
    assert tie["plain_token"] == int(plain[0, -1]) and tie["token"] == second
    assert abs(tie["fp32_gap"] - gap2) < 1e-4 and abs(tie["max_gap"] - gap2) < 1e-4 and tie["off_argmax"] == 1
    assert not judge_divergence(plain, _replace(plain, -1, second), PROMPT.shape[1], model, gap2 / 2)["near_tie"]
    far = judge_divergence(plain, _replace(plain, -1, last), PROMPT.shape[1], model, tol)
    assert not far["near_tie"] and abs(far["max_gap"] - gap_last) < 1e-4


def test_every_token_after_the_first_difference_is_judged():
    """A near-tie followed by a far token is a failure: the check does not stop at the first difference."""
    model = tiny_target(logit_scale=4.0)
    plain = _plain(model)
    second, gap2 = _ranked(model, plain[:, :-2], 1)
    other = _replace(plain, -2, second)  # the other side of a near-tie ...
    last, gap_last = _ranked(model, other[:, :-1], -1)  # ... then the least likely token after it
    best, _ = _ranked(model, other[:, :-1], 0)
    tol = max(gap2, 1e-3) * 1.01
    assert gap_last > tol
    bad = judge_divergence(plain, _replace(other, -1, last), PROMPT.shape[1], model, tol)
    assert bad["position"] == plain.shape[1] - 2 - PROMPT.shape[1] and not bad["near_tie"]
    good = judge_divergence(plain, _replace(other, -1, best), PROMPT.shape[1], model, tol)
    assert good["near_tie"] and good["off_argmax"] == 1


def test_never_a_near_tie_without_a_referee_or_for_prompt_length_and_processor_differences():
    model = tiny_target(logit_scale=4.0)
    plain = _plain(model)
    second, _ = _ranked(model, plain[:, :-1], 1)
    other = _replace(plain, -1, second)
    P = PROMPT.shape[1]
    assert judge_divergence(plain, other, P)["near_tie"] is False  # no referee
    inside = judge_divergence(plain, _replace(plain, 2, 7), P, model, 1e9)
    assert inside["near_tie"] is False and inside["position"] < 0 and "prompt" in inside["reason"]
    short = judge_divergence(plain, plain[:, :-1], P, model, 1e9)
    assert short["near_tie"] is False and "prefix" in short["reason"]
    model.generation_config.repetition_penalty = 1.3  # greedy scores are no longer the raw logits
    proc = judge_divergence(plain, other, P, model, 1e9)
    assert proc["near_tie"] is False and "processors" in proc["reason"]
