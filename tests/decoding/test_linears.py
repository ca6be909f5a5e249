"""Weight-major round products (linears.py): the same products as F.linear up to rounding, installed on the target,
the drafter and its draft LM head only between a call's prefill and its end, the profile's A/B of verification
forwards and drafter rounds choosing them by time, and decoding with them lossless (greedy identity on both eager
loops, the sampling G-test)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hf_dspark import DSparkDrafter
from hf_dspark.decoding import profile as prof
from hf_dspark.decoding.linears import WeightMajorLinears, weight_major_forward
from hf_dspark.decoding.options import DecodingOptions
from hf_dspark.decoding.profile import ForwardTimes, choose_linear, measure_profile
from tests.conftest import tiny_target
from tests.helpers import PROMPT, drafter_for, spread_confidence, synthetic_profile
from tests.sampling_check import ALPHA, STEPS, N, exact_distribution, fit_pvalue, processors, sample_counts, setup
from tests.sampling_check import PROMPT as SAMPLING_PROMPT


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 24), (1, 3, 24), (2, 4, 24), (8, 24), (1, 9, 24)])
def test_weight_major_forward_is_f_linear(bias, shape):
    torch.manual_seed(0)
    layer = nn.Linear(24, 40, bias=bias)
    x = torch.randn(*shape)
    got, want = weight_major_forward(layer, x, max_rows=8), F.linear(x, layer.weight, layer.bias)
    assert got.shape == want.shape and got.is_contiguous()
    rows = x.numel() // x.shape[-1]
    if rows == 1 or rows > 8:  # one row and long inputs are F.linear itself, bit for bit
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_install_and_remove_touch_only_plain_linears():
    model = tiny_target()
    hooked = model.model.layers[0].mlp.up_proj
    own = lambda x: F.linear(x, hooked.weight)  # someone else's forward (accelerate's hooks do this)
    hooked.forward = own

    class Quantized(nn.Linear):
        pass

    model.model.layers[1].mlp.up_proj.__class__ = Quantized
    linears = WeightMajorLinears(model, max_rows=8)
    plain = [m for m in model.modules() if type(m) is nn.Linear and m is not hooked]
    assert len(linears.layers) == len(plain) and hooked not in linears.layers
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        want = model(ids).logits
        with linears:
            assert all("forward" in m.__dict__ for m in plain)
            got = model(ids).logits
        assert not any("forward" in m.__dict__ for m in plain) and hooked.forward is own
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def installed(*modules) -> bool:
    return all("forward" in m.__dict__ for m in modules)


def forms_during_generate(model, drafter, monkeypatch, **gen):
    """Generate; per target forward, whether the weight-major forward was installed when it ran; per drafter round,
    whether it was on the drafter's layers and on the draft LM head the round multiplied with."""
    seen, rounds = [], []
    real = DSparkDrafter.base_logits

    def spy(self, h, head=None):
        if isinstance(head, nn.Module):  # a round's draft head (training and replay pass none or a tensor)
            rounds.append(installed(head, self.fc, self.layers[0].mlp.up_proj))
        return real(self, h, head)

    monkeypatch.setattr(DSparkDrafter, "base_logits", spy)
    handle = model.register_forward_pre_hook(lambda m, a: seen.append(installed(model.lm_head)))
    try:
        out = model.generate(PROMPT, do_sample=False, assistant_model=drafter, **gen)
    finally:
        handle.remove()
    return out, seen, rounds


def none_installed(*models) -> bool:
    return not any("forward" in m.__dict__ for model in models for m in model.modules())


def weight_major_drafter(model, loop="assisted", vocab=None):
    drafter = drafter_for(model)
    if vocab is not None:  # a pruned draft vocabulary is part of the drafter's shape: before the profile
        drafter.set_draft_vocab(vocab)
    spread_confidence(drafter)
    profile = dataclasses.replace(synthetic_profile(model, drafter, [1.0, 1.05, 1.1, 1.15, 1.2], loop),
                                  linear="weight_major")
    drafter.options = DecodingOptions("scheduler", ngram_drafts=False, device_profile=profile, loop=loop)
    return drafter


@pytest.mark.parametrize("loop,pruned", [("assisted", False), ("assisted", True), ("static", False)])
def test_greedy_identity_with_weight_major_rounds(loop, pruned, monkeypatch):
    """Installed after the prefill (which keeps plain's products), used by every verification and every drafter
    round (its layers and its draft LM head, pruned or not), gone at the end."""
    for seed in range(3):
        model = tiny_target(seed=seed)
        drafter = weight_major_drafter(model, loop, range(0, model.config.vocab_size, 2) if pruned else None)
        plain = model.generate(PROMPT, do_sample=False, max_new_tokens=40)
        out, seen, rounds = forms_during_generate(model, drafter, monkeypatch, max_new_tokens=40)
        assert out.tolist() == plain.tolist()
        assert not drafter.last_stats.fallback and sum(r.drafted for r in drafter.last_stats.rounds) > 0
        if loop == "assisted":  # the static loop's verifications call forward directly: no hook to count them
            assert seen[0] is False and all(seen[1:]) and len(seen) > 2, seen
        assert rounds and all(rounds), rounds
        assert none_installed(model, drafter)


def test_removed_when_the_call_fails():
    model = tiny_target()
    drafter = weight_major_drafter(model)

    def fail(input_ids, scores, **kw):
        if input_ids.shape[1] > PROMPT.shape[1] + 3:
            raise KeyboardInterrupt
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    with pytest.raises(KeyboardInterrupt):
        model.generate(PROMPT, do_sample=False, assistant_model=drafter, max_new_tokens=30, stopping_criteria=[fail])
    assert none_installed(model, drafter)


def eager_compile(m, most):
    """Stands in for torch.compile in the loop (loop._compiled_forward): the compiled loop's path, eagerly."""
    return m.forward


@pytest.mark.parametrize("loop", ["assisted", "compiled"])
def test_sampling_exact_with_weight_major_verification(loop, monkeypatch):
    from hf_dspark.decoding import loop as loop_module

    monkeypatch.setattr(loop_module, "_compiled_forward", eager_compile)
    model, drafter = setup(head="markov")
    spread_confidence(drafter)
    profile = dataclasses.replace(synthetic_profile(model, drafter, [1.0, 1.05, 1.1, 1.15], loop),
                                  linear="weight_major")
    drafter.options = DecodingOptions("scheduler", ngram_drafts=False, device_profile=profile, loop=loop)
    exact = exact_distribution(model, SAMPLING_PROMPT, STEPS, processors())
    samples = sample_counts(model, drafter, SAMPLING_PROMPT, STEPS, N, seed=123)
    assert sum(r.verified for r in drafter.last_stats.rounds) > 0 and not drafter.last_stats.fallback
    p = fit_pvalue(samples, exact)
    assert p >= ALPHA, f"weight-major verification, {loop} loop: samples deviate from the target's law (p={p:.2e})"


def fake_forwards(stock: float, weight_major: float):
    """time_forwards as if the stock forwards took `stock` s and weight-major ones `weight_major` s each."""
    def timed(target, lengths, *a, **kw):
        t = weight_major if installed(target.lm_head) else stock
        return ForwardTimes(prefill=0.0, forward={k: [t] * 3 for k in lengths}, rollback=[0.0])
    return timed


def fake_drafter(stock: float, weight_major: float):
    """time_drafter as if a round took `stock` s, or `weight_major` s with the form on its layers and draft head."""
    def timed(drafter, n, *a, weights=None, **kw):
        return weight_major if installed(drafter.fc, weights[1]) else stock
    return timed


@pytest.mark.parametrize("loop", ["assisted", "compiled"])
@pytest.mark.parametrize("forwards,drafts,chosen", [
    ((1.0, 0.5), (0.1, 0.1), "weight_major"),
    ((1.0, 0.97), (0.0, 0.0), "stock"),  # under LINEAR_GAIN
    ((0.5, 1.0), (0.1, 0.1), "stock"),
    ((1.0, 0.96), (0.5, 0.2), "weight_major"),  # the drafter's round decides a near tie of the verifications
    ((1.0, 0.9), (0.2, 0.5), "stock"),
])
def test_the_a_b_chooses_by_a_round_s_time(monkeypatch, forwards, drafts, chosen, loop):
    """Each verification length counts with one drafter round; weight-major needs under 95 % of stock's total (on
    the compiled loop too, whose graphs each form compiles with it installed)."""
    model = tiny_target()
    drafter = drafter_for(model)
    monkeypatch.setattr(prof, "time_forwards", fake_forwards(*forwards))
    monkeypatch.setattr(prof, "time_drafter", fake_drafter(*drafts))
    got, medians = choose_linear(model, drafter, drafter.draft_weights(), 7, 32, 0, [1], loop)
    assert got == chosen
    for form, f, d in zip(("stock", "weight_major"), forwards, drafts):
        assert medians[form] == {"2": f, "4": f, "8": f, "draft": d}
    assert none_installed(model, drafter)


def test_a_slow_stretch_of_the_machine_does_not_decide_the_a_b(monkeypatch):
    """Stock is faster (1.0 s against 1.2 s), but the machine is busy (3× slower) for the first 12 forwards timed:
    with one form measured after the other, stock would take all of them and lose; the forms alternate, so the
    stretch weighs on both and stock is chosen."""
    model = tiny_target()
    drafter = drafter_for(model)
    done = []

    def timed(target, lengths, cache_len, warmup=3, repeats=10, *a, **kw):
        busy = len(done) < 12
        done.extend([None] * (warmup + repeats) * len(lengths))
        t = (1.2 if installed(target.lm_head) else 1.0) * (3.0 if busy else 1.0)
        return ForwardTimes(prefill=0.0, forward={k: [t] * repeats for k in lengths}, rollback=[0.0])

    monkeypatch.setattr(prof, "time_forwards", timed)
    monkeypatch.setattr(prof, "time_drafter", fake_drafter(0.0, 0.0))
    got, medians = choose_linear(model, drafter, drafter.draft_weights(), 7, 32, 0, [1], "assisted")
    assert got == "stock" and medians["stock"]["2"] == 1.0 and medians["weight_major"]["2"] == 1.2


def test_profile_records_its_choice_and_measures_the_curve_with_it(monkeypatch):
    model = tiny_target()
    drafter = drafter_for(model)
    real = prof.time_forwards
    forms = []

    real_drafter = prof.time_drafter
    rounds = []

    def spy(target, lengths, *a, **kw):
        forms.append(installed(target.lm_head))
        return real(target, lengths, *a, **kw)

    def spy_drafter(dr, n, *a, weights=None, sample=False, **kw):
        rounds.append((installed(dr.fc, weights[1]), sample))
        return real_drafter(dr, n, *a, weights=weights, sample=sample, **kw)

    monkeypatch.setattr(prof, "choose_linear", lambda *a, **kw: ("weight_major", {"stock": {"2": 1.0}}))
    monkeypatch.setattr(prof, "time_forwards", spy)
    monkeypatch.setattr(prof, "time_drafter", spy_drafter)
    p = measure_profile(model, drafter, cache_len=16, warmup=0, repeats=1)
    assert p.linear == "weight_major" and forms == [True]
    assert {r[1] for r in rounds} == {False, True} and all(r[0] for r in rounds)  # greedy and sampled, both timed
    assert p.sampled_draft_time is not None and p.round_overhead_at(True) == p.sampled_draft_time + p.rollback_time
    assert "round products: weight_major" in str(p)
    assert none_installed(model, drafter)
    assert prof.DeviceProfile.from_dict(p.to_dict()) == p


def test_the_compiled_loop_compiles_and_verifies_with_the_call_s_form(monkeypatch):
    """Its graphs are traced with the round's products installed (compiled once per form: a second call reuses
    them), every verification runs with them, and decoding stays greedy-identical."""
    from hf_dspark.decoding import loop as loop_module
    from hf_dspark.decoding.linears import _bound

    model = tiny_target()
    drafter = weight_major_drafter(model, "compiled")
    traced = []

    def compiled_forward(m, most):  # stands in for torch.compile: records the form each graph call runs under
        def forward(*a, **kw):
            traced.append((kw["cache"].get_seq_length(), installed(m.lm_head)))
            return m.forward(*a, **kw)
        return forward

    monkeypatch.setattr(loop_module, "_compiled_forward", compiled_forward)
    plain = model.generate(PROMPT, do_sample=False, max_new_tokens=30)
    for call in range(2):
        out = model.generate(PROMPT, do_sample=False, max_new_tokens=30, assistant_model=drafter)
        assert out.tolist() == plain.tolist() and not drafter.last_stats.fallback
        assert traced and all(form for _, form in traced), traced
        assert none_installed(model, drafter)
        traced.clear()
    products = {p for key in model.__dict__["_dspark_compiled_lengths"] for p in key[2]}
    assert products and "stock" not in products  # every length was run with the call's products installed
    assert "forward" not in model.lm_head.__dict__  # removed: the class's forward again
    with WeightMajorLinears(model, max_rows=8):
        assert model.lm_head.forward.__func__ is _bound(8)  # one function per max_rows: compiled graphs' guards hold


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_profile_from_before_the_round_a_b_is_measured_again(tmp_path, version):
    """Version 1 had no A/B, version 2 one of the target's forwards only (and sampled drafter rounds), version 3
    none on the compiled loop."""
    model = tiny_target()
    drafter = drafter_for(model)
    p = synthetic_profile(model, drafter, [1.0, 1.1, 1.2, 1.3, 1.4])
    old = p.to_dict()
    del old["sampled_draft_time"]
    if version == 1:
        del old["key"]["version"], old["linear"], old["linear_ab"]
    else:
        old["key"]["version"] = version
    path = tmp_path / "old.json"
    path.write_text(__import__("json").dumps(old))
    with pytest.raises(prof.ProfileMismatchError, match="version"):
        prof.load_profile(path, expect=p.key)
