"""VerifyPolicy (decoding/policy.py): what each `verify_policy` resolves to for one call (drafts computed, n-gram
drafts verified, the draft gate and its prior from the calibration), and the specs and profiles it refuses."""

import pytest
import torch

from hf_dspark import DecodingOptions, DSparkDrafter
from hf_dspark.decoding.policy import VerifyPolicy
from hf_dspark.decoding.profile import ProfileMismatchError, profile_key
from hf_dspark.decoding.scheduler import max_verified
from tests.conftest import tiny_target
from tests.helpers import synthetic_profile
from tests.sampling_check import GENTLE, PROMPT, scheduled_setup, setup


def test_bad_policy_is_an_error():
    model, drafter = setup()
    drafter.options.verify_policy = "sometimes"
    with pytest.raises(ValueError, match="verify_policy"):
        model.generate(PROMPT, do_sample=False, max_new_tokens=3, assistant_model=drafter)


def test_profile_of_another_setup_is_refused():
    model, drafter = setup()
    other = tiny_target(vocab=8, hidden=16, layers=3, heads=2, kv_heads=1, seed=0, logit_scale=6.0)
    other.config.num_hidden_layers = 4  # another model shape → another key
    prof = synthetic_profile(model, drafter, GENTLE)
    prof.key = profile_key(other, drafter)
    drafter.options.device_profile, drafter.options.verify_policy = prof, "scheduler"
    with pytest.raises(ProfileMismatchError):
        model.generate(PROMPT, do_sample=False, max_new_tokens=3, assistant_model=drafter)


def test_ngram_drafts_cap_is_the_best_prefix_reach_at_their_own_overhead():
    """Under the scheduler a drafter round pays draft + roll-back and is capped at the walk's reach
    (scheduler.max_verified); an n-gram round pays only the roll-back and is capped at the best prefix's reach
    (scheduler.best_prefix_reach). A linear curve shows the overheads: with a 5-step drafter 4 drafts can pay,
    with no fixed cost no draft ever can (1 + a tokens for 2 steps)."""
    model, drafter = setup(block=4)
    drafter.options.device_profile = synthetic_profile(model, drafter, [1.0, 2.0, 3.0, 4.0, 5.0])
    drafter.options.device_profile.draft_time = 5.0
    policy = VerifyPolicy("scheduler", drafter, model, device_profile=drafter.options.device_profile)
    assert (policy.max_drafts, policy.max_ngram_drafts) == (4, 0)
    drafter.options.device_profile.rollback_time = 5.0
    assert VerifyPolicy("scheduler", drafter, model, device_profile=drafter.options.device_profile).max_ngram_drafts == 4
    assert VerifyPolicy(2, drafter, model, device_profile=drafter.options.device_profile).max_ngram_drafts == 2 and VerifyPolicy("all", drafter, model, device_profile=drafter.options.device_profile).max_ngram_drafts == 4


def test_auto_without_a_confidence_head_verifies_the_profiles_reach_behind_the_gate():
    """"auto" on a drafter without a confidence head (where "scheduler" is refused): a static length, the most
    the scheduler could verify on the profile, and the same draft gate; greedy output stays plain's."""
    model = tiny_target()
    torch.manual_seed(1)
    drafter = DSparkDrafter.from_target(model, block_size=4, target_layer_ids=[0, 2], markov_rank=8,
                                        confidence_head=False)
    drafter.options.device_profile = synthetic_profile(model, drafter, [1.0, 1.3, 1.5, 1.6, 1.7])
    policy = VerifyPolicy("auto", drafter, model, device_profile=drafter.options.device_profile)
    reach = max_verified(drafter.options.device_profile.verify_time)
    assert policy.gate is not None and policy.ngram_survival is not None and not policy.needs_confidence
    assert policy.max_drafts == reach and policy.length(None, 4) == reach and policy.length(None, 1) == 1
    with pytest.raises(ValueError, match="confidence head"):
        VerifyPolicy("scheduler", drafter, model, device_profile=drafter.options.device_profile)
    prompt = torch.tensor([[5, 17, 3, 42, 8, 11]])
    plain = model.generate(prompt, do_sample=False, max_new_tokens=40)
    assert model.generate(prompt, do_sample=False, max_new_tokens=40, assistant_model=drafter).tolist() == plain.tolist()
    assert max(r.drafted for r in drafter.last_stats.rounds if r.source == "dspark") == reach


def test_gate_prior_comes_from_the_calibration_at_the_calls_temperature():
    """config.calibration's prefix survival, at the temperature it was measured at (0 = greedy), becomes the gate's
    prior: the policy's own length on the conditional rates and its accepted drafts, priced by the gate on the profile. Another
    temperature, or no calibration, gives no prior."""
    model, drafter = scheduled_setup("auto", [1.0, 1.1, 1.2, 1.3])
    assert VerifyPolicy("auto", drafter, model, device_profile=drafter.options.device_profile, temperature=1.0)._gate_prior(1.0) is None  # not calibrated
    ones = [1.0] * 3
    drafter.config.calibration = [{"temperature": 1.0, "confidence_temperatures": ones, "prefix_survival": [0.8, 0.6, 0.1]}]
    policy = VerifyPolicy("auto", drafter, model, device_profile=drafter.options.device_profile, temperature=1.0)
    n = policy.length(torch.tensor([0.8, 0.75, 0.1 / 0.6]), 3)
    assert n == 2  # the third draft (conditional 1/6) does not pay for its 0.1 s on this curve
    assert policy._gate_prior(1.0) == (pytest.approx(0.8 + 0.6), 2)
    assert (policy.gate.accepted, policy.gate.cost) == pytest.approx((1.4, 1.2))  # priced on the profile
    assert VerifyPolicy("auto", drafter, model, device_profile=drafter.options.device_profile, temperature=0.7).gate.accepted is None  # nearest is not exact
    assert VerifyPolicy("auto", drafter, model, device_profile=drafter.options.device_profile, temperature=0.0).gate.accepted is None
    assert VerifyPolicy("auto", drafter, model, device_profile=drafter.options.device_profile).gate.accepted is None
    # a greedy entry beside it: greedy calls start from what greedy measured, T = 1 calls still from theirs
    drafter.config.calibration.append({"temperature": 0.0, "confidence_temperatures": ones,
                                       "prefix_survival": [0.9, 0.9, 0.9]})
    assert VerifyPolicy("auto", drafter, model, device_profile=drafter.options.device_profile, temperature=0.0)._gate_prior(0.0) == (pytest.approx(2.7), 3)
    assert VerifyPolicy("auto", drafter, model, device_profile=drafter.options.device_profile, temperature=1.0)._gate_prior(1.0) == (pytest.approx(1.4), 2)


def test_static_policies_resolve_their_lengths():
    """Policies without a profile: "all" verifies every draft, k at most k (and no more than k drafts are computed),
    a threshold up to the first c_k below it; none gates drafting. A callable's answer outside 0..n, and a spec that
    is none of these (True is not a k), are errors."""
    model, drafter = setup(block=4)
    conf = torch.tensor([0.9, 0.8, 0.3, 0.9])
    everything = VerifyPolicy("all", drafter, model)
    assert everything.length(conf, 4) == 4 and everything.max_drafts == 4 and everything.gate is None
    two = VerifyPolicy(2, drafter, model)
    assert (two.length(conf, 4), two.length(conf, 1), two.max_drafts, two.max_ngram_drafts) == (2, 1, 2, 2)
    threshold = VerifyPolicy(("threshold", 0.5), drafter, model)
    assert threshold.needs_confidence and threshold.length(conf, 4) == 2 and threshold.should_draft()
    assert VerifyPolicy.for_call(drafter, model).spec == drafter.options.verify_policy == "all"
    assert VerifyPolicy.for_call(drafter, model, DecodingOptions(3)).max_drafts == 3
    with pytest.raises(ValueError, match="returned 9 for 4 drafts"):
        VerifyPolicy(lambda c: 9, drafter, model).length(conf, 4)
    with pytest.raises(ValueError, match="verify_policy"):
        VerifyPolicy(True, drafter, model)
