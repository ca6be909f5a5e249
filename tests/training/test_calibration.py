"""Sequential temperature scaling: lowers ECE on over-confident synthetic scores, keeps their ordering."""

import json

import numpy as np
import pytest

from hf_dspark.decoding.stats import Round
from hf_dspark.training.calibration import (
    cumulative,
    ece,
    ece_floor,
    ece_floor_per_position,
    ece_per_position,
    fit_shared,
    fit_sts,
    reliability_plot,
    rounds_to_arrays,
)


def _overconfident(R=4000, gamma=4, seed=0):
    rng = np.random.default_rng(seed)
    true_z = rng.normal(0.5, 1.5, size=(R, gamma))
    accept = rng.random((R, gamma)) < 1 / (1 + np.exp(-true_z))
    y = np.cumprod(accept, axis=1).astype(float)
    z = 3.0 * true_z  # the head is 3× over-confident
    return z, y, np.ones_like(y, bool)


def test_ece_simple():
    assert abs(ece(np.array([0.9, 0.9]), np.array([1.0, 1.0])) - 0.1) < 1e-12
    assert ece(np.array([0.25, 0.75]), np.array([0.0, 1.0])) == 0.25


def test_ece_floor_is_what_calibrated_predictions_measure_and_shrinks_with_the_sample():
    """Labels drawn from the predictions themselves measure about the floor; an over-confident head measures far
    above it; the floor falls like 1/sqrt(n)."""
    rng = np.random.default_rng(1)
    small, large = rng.random(500), rng.random(20000)
    calibrated = np.mean([ece(small, rng.random(500) < small) for _ in range(20)])
    assert abs(calibrated - ece_floor(small)) < 0.01
    assert ece_floor(large) < 0.4 * ece_floor(small)
    sharp = np.where(small > 0.5, 0.95, 0.05)  # over-confident scores of the same coins
    assert ece(sharp, rng.random(500) < small) > 3 * ece_floor(sharp)


def test_sts_lowers_ece_and_keeps_order():
    z, y, v = _overconfident()
    ones = [1.0] * z.shape[1]
    temps, _ = fit_sts(z, y, v, bias_grid=None)
    before, after = ece_per_position(z, y, v, ones), ece_per_position(z, y, v, temps)
    assert all(a < b for a, b in zip(after, before)), (before, after)
    assert np.mean(after) < 0.5 * np.mean(before)
    assert all(2.0 < t < 4.5 for t in temps[:1]), temps  # recovers roughly the 3× over-confidence at position 1
    for k in range(z.shape[1]):  # per-position ordering of conditional scores unchanged
        c0, c1 = z[:, k], z[:, k] / temps[k]
        assert (np.argsort(c0, kind="stable") == np.argsort(c1, kind="stable")).all()


def test_a_bias_fixes_a_shifted_head_that_a_temperature_cannot():
    """A head whose logits are shifted (it predicts survival too high at every score: what the shipped head does at
    T = 1 on the eval sets) keeps most of its ECE under temperatures alone; with a bias per position it is
    calibrated down to about the floor, and the ordering of scores is unchanged."""
    rng = np.random.default_rng(2)
    true_z = rng.normal(-0.5, 1.5, size=(4000, 2))
    y = np.cumprod(rng.random(true_z.shape) < 1 / (1 + np.exp(-true_z)), axis=1).astype(float)
    z, v = true_z + 1.0, np.ones_like(y, bool)  # over-predicts by a logit of 1
    t_only, b0 = fit_sts(z, y, v, bias_grid=None)
    temps, biases = fit_sts(z, y, v)
    assert b0 == [0.0] * 2 and -1.3 < biases[0] < -0.7, biases
    shifted, fixed = ece_per_position(z, y, v, t_only), ece_per_position(z, y, v, temps, biases)
    floor = ece_floor_per_position(z, v, temps, biases)
    assert fixed[0] < 0.5 * shifted[0] and all(f < 1.2 * fl for f, fl in zip(fixed, floor)), (shifted, fixed, floor)


def test_the_fit_stays_in_its_bounds_and_does_not_chase_a_small_sample():
    """A calibrated head seen on a few dozen rounds per position: the fit stays near T = 1, b = 0 (the prior and
    the log loss do not chase the sample's noise into a grid corner, as an ECE-minimising fit did); on a thousand
    rounds it is about as good as the raw head on fresh rounds (averaged over samples: one sample's noise
    moves a fit by more than the tolerance). Labels that no scaling can reach keep T and b on their bounds."""
    rng = np.random.default_rng(3)

    def rounds(n):
        true_z = rng.normal(0.0, 1.5, size=(n, 7))
        return true_z, np.cumprod(rng.random(true_z.shape) < 1 / (1 + np.exp(-true_z)), axis=1).astype(float)

    z, y = rounds(60)
    v = np.ones_like(y, bool)
    temps, biases = fit_sts(z, y, v)
    assert all(0.5 <= t <= 4.0 for t in temps) and all(-1.5 <= b <= 1.5 for b in biases)
    labelled = [k for k in range(7) if y[:, k].sum() >= 3]
    assert all(abs(np.log(temps[k])) < 0.6 and abs(biases[k]) < 0.8 for k in labelled), (temps, biases)
    z2, y2 = rounds(20000)
    v2 = np.ones_like(y2, bool)
    raw = np.mean(ece_per_position(z2, y2, v2, [1.0] * 7))
    fresh = [np.mean(ece_per_position(z2, y2, v2, *fit_sts(*rounds(1000), np.ones((1000, 7), bool))))
             for _ in range(6)]
    assert np.mean(fresh) < raw + 0.005, (fresh, raw)
    always = np.ones((50, 2))  # every draft survives, even at very negative logits: pushes T and b to the edges
    t_edge, b_edge = fit_sts(np.full((50, 2), -3.0), always, np.ones((50, 2), bool))
    assert t_edge[0] == pytest.approx(4.0) and b_edge[0] == pytest.approx(1.5), (t_edge, b_edge)


def _rounds(rng, n, gamma, head):
    """n rounds whose true conditional survival logits are N(0.5, 1.5) at every position; head(true_z, k) is the
    raw logit the confidence head reports at position k."""
    true_z = rng.normal(0.5, 1.5, size=(n, gamma))
    y = np.cumprod(rng.random(true_z.shape) < 1 / (1 + np.exp(-true_z)), axis=1).astype(float)
    z = np.stack([head(true_z[:, k], k) for k in range(gamma)], 1)
    return z, y, np.ones_like(y, bool)


def test_positions_are_fitted_around_a_shared_map():
    """A head off by the same map at every position (2× over-confident, shifted by +0.5), seen on a few hundred
    rounds: the shared map recovers it, and positions fitted around it wander less and calibrate fresh rounds
    better than positions fitted each on its own (the later ones see few surviving rounds)."""
    same = lambda t, k: 2.0 * t + 0.5  # noqa: E731
    spread, fresh = {None: [], "prior": []}, {None: [], "prior": []}
    for seed in range(5):
        rng = np.random.default_rng(10 + seed)
        z, y, v = _rounds(rng, 300, 7, same)
        z2, y2, v2 = _rounds(rng, 20000, 7, same)
        t0, b0 = fit_shared(z, y, v)
        assert 1.5 < t0 < 2.7 and -0.7 < b0 < 0.0, (t0, b0)  # σ(z / 2 − 0.25) is the truth
        assert fit_sts(z, y, v, centre=(t0, b0)) == fit_sts(z, y, v)  # a centre passed in is the one it fits
        assert fit_sts(z, y, v, centre=(1.0, 0.0)) != fit_sts(z, y, v)  # and it is used
        for key, kwargs in ((None, {"position_prior": None}), ("prior", {})):
            temps, biases = fit_sts(z, y, v, **kwargs)
            spread[key].append(np.ptp(np.log(temps)) + np.ptp(biases))
            fresh[key].append(np.mean(ece_per_position(z2, y2, v2, temps, biases)))
    assert np.mean(spread["prior"]) < 0.5 * np.mean(spread[None]), spread
    assert np.mean(fresh["prior"]) < np.mean(fresh[None]), fresh


def test_the_shared_prior_lets_a_position_that_differs_move_away():
    """With plenty of rounds a position whose head is off by another map than the rest (3× over-confident at
    position 1, calibrated after) still gets its own temperature: the prior settles noise, not signal."""
    rng = np.random.default_rng(4)
    z, y, v = _rounds(rng, 20000, 4, lambda t, k: 3.0 * t if k == 0 else t)
    temps, biases = fit_sts(z, y, v)
    assert 2.4 < temps[0] < 3.6 and all(0.8 < t < 1.25 for t in temps[1:]), (temps, biases)
    after = ece_per_position(z, y, v, temps, biases)
    assert after[0] < 0.5 * ece_per_position(z, y, v, [1.0] * 4)[0], after


def test_rounds_to_arrays_inverts_the_scaling_and_drops_after_stop(tmp_path):
    temps, biases = [2.0, 0.5, 1.0], [0.5, -1.0, 0.0]
    z = np.array([1.0, -2.0, 0.3])
    conf = list(1 / (1 + np.exp(-(z / np.array(temps) + np.array(biases)))))
    r1 = Round(drafted=3, verified=3, accepted=1, committed=2, draft_time=0, verify_time=0, confidence=conf)
    r2 = Round(drafted=3, verified=3, accepted=1, committed=1, draft_time=0, verify_time=0, confidence=conf)  # stop
    zz, y, v = rounds_to_arrays([r1, r2], 3, temps, biases)
    assert np.allclose(zz[0], z, atol=1e-5)
    assert y.tolist() == [[1, 0, 0], [1, 0, 0]]
    assert v.tolist() == [[True, True, True], [True, False, False]]
    reliability_plot(zz, y, v, ([1.0] * 3, None), (temps, biases), tmp_path / "rel.png")
    assert (tmp_path / "rel.png").stat().st_size > 1000
    assert np.allclose(cumulative(zz, temps, biases)[0], np.cumprod(conf))


def test_collect_rounds_verifies_every_draft_and_restores_the_drafter(llama, char_tokenizer):
    """Calibration data are drafter rounds verified in full, whatever the drafter was set to (a static length,
    n-gram drafts); the drafter's options are put back afterwards."""
    import copy

    import torch

    from hf_dspark import DSparkDrafter
    from hf_dspark.training.calibration import collect_rounds

    tok = copy.deepcopy(char_tokenizer)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    torch.manual_seed(0)
    drafter = DSparkDrafter.from_target(llama, block_size=4, target_layer_ids=[0, 2])
    drafter.options.verify_policy, drafter.options.ngram_drafts = 1, True
    rounds = collect_rounds(llama, tok, drafter, ["hello hello hello", "abc abc abc"], max_new_tokens=30, temperature=0)
    assert rounds and all(r.source == "dspark" and r.verified == r.drafted for r in rounds)
    assert max(r.drafted for r in rounds) == 4
    assert (drafter.options.verify_policy, drafter.options.ngram_drafts) == (1, True)
    # calibrating stores what it measured: the draft gate's prior when decoding at this temperature (greedy)
    from hf_dspark.training.calibration import calibrate

    report = calibrate(drafter, rounds, temperature=0)
    (prior,) = drafter.config.calibration
    assert prior["temperature"] == 0.0 and len(prior["prefix_survival"]) == 4
    assert all(a >= b for a, b in zip(prior["prefix_survival"], prior["prefix_survival"][1:]))
    assert prior["prefix_survival"][0] == report["prefix_survival_rate"][0]
    assert prior["confidence_temperatures"] == report["temperatures"] == drafter.config.confidence_temperatures
    assert prior["confidence_biases"] == report["biases"]
    type(drafter.config).from_dict(drafter.config.to_dict()).validate()  # round-trips through config.json
    # a calibration at another temperature adds its entry; one at the same temperature replaces it
    t1_rounds = collect_rounds(llama, tok, drafter, ["hello hello hello"], max_new_tokens=20, temperature=1.0)
    calibrate(drafter, t1_rounds, temperature=1.0)
    assert [c["temperature"] for c in drafter.config.calibration] == [0.0, 1.0]
    assert drafter.config.calibration[0] == prior
    # rounds hold confidences as scaled when collected: a new calibration collects its own
    again = collect_rounds(llama, tok, drafter, ["abc abc abc"], max_new_tokens=20, temperature=0)
    calibrate(drafter, again, temperature=0)
    assert [c["temperature"] for c in drafter.config.calibration] == [0.0, 1.0]  # replaced, not added
    assert drafter.config.calibration[0]["prefix_survival"] != prior["prefix_survival"]


def test_holdout_prompts_per_file_takes_only_never_answered_prompts_from_every_source(tmp_path):
    from hf_dspark.training.calibration import holdout_prompts
    from hf_dspark.training.data import answer_prompts, is_holdout

    files = []
    for name in ("math_train", "code_train"):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"turns": [f"{name} question {i}"]}) + "\n" for i in range(200)))
        files.append(str(path))
    held = {p["prompt"] for f in files for p in answer_prompts(f) if is_holdout(p["id"])}
    assert 2 < len(held) < 40  # ~1 in 20 of 400
    got = holdout_prompts(files, [], limit=0, seed=0, holdout=True, per_file=2)
    assert len(got) == 4 and set(got) <= held
    assert sum(p.startswith("code_train") for p in got) == 2  # each source gives its share
    pooled = holdout_prompts(files, [], limit=5, seed=0)
    assert len(pooled) == 5 and not set(pooled) <= held  # without --holdout any unanswered prompt may be picked
