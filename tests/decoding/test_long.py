"""Long generations on a tiny model (research/long_generation.py is the 4,096-token SmolLM2 version):
the drafter's context stays in step with the target's cache at every round, and nothing the drafter keeps
grows except that context (one row per committed position) and the run's per-round statistics."""

import torch

from hf_dspark import DSparkDrafter
from hf_dspark.decoding.options import DecodingOptions
from hf_dspark.decoding.candidate import DSparkCandidateGenerator
from tests.conftest import tiny_target
from tests.helpers import oracle_drafts

NEW = 400
BLOCK = 5


def _tensor_bytes(obj, skip=()) -> int:
    """Bytes of the tensors an object holds directly or in lists/tuples/dicts (one level of nesting)."""
    total = 0
    for name, value in vars(obj).items():
        if name in skip:
            continue
        items = value if isinstance(value, (list, tuple)) else value.values() if isinstance(value, dict) else [value]
        for v in items:
            for t in (v if isinstance(v, (list, tuple)) else [v]):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
    return total


def test_long_generation_keeps_the_drafter_in_step(monkeypatch):
    model = tiny_target("llama", vocab=64, layers=3, hidden=16, heads=2, kv_heads=1, seed=2, logit_scale=4.0)
    model.config.max_position_embeddings = 1024  # room for NEW tokens (tiny_target's default is 256)
    torch.manual_seed(0)
    drafter = DSparkDrafter.from_target(model, block_size=BLOCK, target_layer_ids=[0, 1], head_type="markov",
                                        markov_rank=4)
    drafter.options = DecodingOptions("all", ngram_drafts=False)  # every round drafts the whole block
    drafter_state = {k: v.clone() for k, v in drafter.state_dict().items()}
    prompt = torch.tensor([[3, 9, 27, 17, 51]])
    rounds = []
    real_get = DSparkCandidateGenerator.get_candidates

    def get(self, input_ids, model_kwargs=None, model_outputs=None, is_first_iteration=False, **k):
        out = real_get(self, input_ids, model_kwargs=model_kwargs, model_outputs=model_outputs,
                       is_first_iteration=is_first_iteration, **k)
        if not is_first_iteration:
            cache = model_kwargs.get("cache") or model_kwargs.get("past_key_values")
            rows = {t.shape[2] for kv in self.context_kv for t in kv}
            rounds.append(dict(
                seq=input_ids.shape[1], ctx=self.ctx_len, cache=cache.get_seq_length(), rows=rows,
                unfused=sum(f.shape[1] for f in self.unfused), drafted=out[0].shape[1] > input_ids.shape[1],
                grad=any(t.requires_grad or t.grad_fn is not None for kv in self.context_kv for t in kv),
                kv_bytes=sum(t.numel() * t.element_size() for kv in self.context_kv for t in kv),
                other_bytes=_tensor_bytes(self, skip=("context_kv", "unfused")),
                observer=len(self.observer.target_probs) + len(self.observer.target_tokens),
                stats=len(self.stats.rounds),
            ))
        return out

    monkeypatch.setattr(DSparkCandidateGenerator, "get_candidates", get)
    plain = model.generate(prompt, do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW)
    with oracle_drafts(plain, p_right=0.7, seed=1):
        spec = model.generate(prompt, do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW, assistant_model=drafter)
    assert spec.tolist() == plain.tolist() and spec.shape[1] == prompt.shape[1] + NEW

    assert len(rounds) > NEW // (BLOCK + 1)  # many rounds, with every acceptance length (oracle at 0.7)
    assert set(drafter.last_stats.acceptance_histogram) == set(range(BLOCK + 1))
    per_row = rounds[0]["kv_bytes"] / rounds[0]["ctx"]
    for i, r in enumerate(rounds):
        # in step: the drafter holds K/V for exactly the positions the target has cached (all but the anchor)
        # (rows of rounds that draft nothing wait in `unfused` until the next round that drafts)
        assert r["ctx"] + r["unfused"] == r["cache"] == r["seq"] - 1 and r["rows"] == {r["ctx"]}, r
        assert r["unfused"] == 0 or not r["drafted"], r
        assert not r["grad"]  # no autograd graph kept alive round after round
        assert r["kv_bytes"] == per_row * r["ctx"]  # the context grows by one row per position, nothing else
        assert r["other_bytes"] == rounds[0]["other_bytes"]  # every other tensor the generator holds: constant
        assert r["observer"] <= 2 * BLOCK  # the target-probability observer is reset each round
        assert r["stats"] == i  # one Round record per round, appended after the round's verification
    assert spec.shape[1] - rounds[-1]["ctx"] <= BLOCK + 2  # at the end: only the last round is not ingested
    for k, v in drafter.state_dict().items():  # generate never writes into the drafter's weights or buffers
        assert torch.equal(v, drafter_state[k]), k
    assert set(drafter.state_dict()) == set(drafter_state)
