"""DeviceProfile: what one round costs on this device, measured, for the scheduler.

A profile holds, for one (target, drafter shape, dtype, device, torch, loop) combination:
  verify_time [γ+1]  median seconds of a target verification forward of 1..γ+1 new tokens on a KV cache of
                     realistic length, with the tapped hidden states requested as in decoding, on the loop that
                     decodes: transformers' assisted loop (a DynamicCache, eager) or DSpark's own (loop.py: a static
                     cache, forwards padded to its fixed lengths, eager or compiled), so the curve is the one the
                     scheduler pays for;
  draft_time         median seconds of one greedy drafter round (context ingest + backbone + sequential head) as
                     the scheduler runs it: drafting `draft_tokens` = scheduler.max_verified tokens, not the whole
                     block; sampled_draft_time the same for a sampled round (it also builds and draws from q);
  rollback_time      median seconds of cropping the target cache back after a verification;
  linear             how a round's few-row products multiply ("stock" F.linear or "weight_major", linears.py): the
                     faster of the two in an A/B of the target's verification forwards and the drafter's round
                     (`linear_ab`), chosen before the rest is measured with it (on the compiled loop the
                     verification graphs are compiled with each form installed).
The measured curve is used as is: on CPU in fp32 it is not monotone, so no
smooth cost model would do. Profiles are cached as JSON under `storage.storage_dir()/profiles/`, keyed by
`ProfileKey`; a profile is never used for another key (loading one raises `ProfileMismatchError`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import random
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import DynamicCache, GenerationConfig
from transformers.utils import logging

from ..storage import storage_dir, write_atomic
from .graphs import graph_setup
from .linears import LINEARS, WeightMajorLinears, round_linears
from .loop import StaticVerifier, unsupported
from .machine import device_name
from .scheduler import max_verified, monotone_envelope, pad_length, single_stream_length


class ProfileMismatchError(ValueError):
    """A stored profile was measured for another model, dtype, device or torch: its timings do not apply."""


@dataclass(frozen=True)
class ProfileKey:
    """What the timings depend on. Two profiles are interchangeable only if every field is equal."""

    model: str  # the target's name or path (readable; config_hash is what decides)
    config_hash: str  # target config + drafter shape (calibration excluded: it does not change timings)
    dtype: str
    device: str  # device_name(): CPU model, vendor/family/model, ISA flags, threads; or the GPU name
    torch: str
    loop: str = "assisted"  # the decoding loop measured (DecodingOptions.loop): "assisted", "static" or "compiled"
    # the compiled loop: a digest of graphs.graph_setup() (its graphs' CPU, versions, format), so that a profile whose
    # graphs this install cannot load is not found and loop "auto" does not choose a loop that would compile in a call
    graphs: str = ""
    # what a profile measures: 2 adds the linear A/B, 3 the drafter's round to it and greedy and sampled rounds,
    # 4 the A/B on the compiled loop too; a profile of an earlier version is measured again
    version: int = 4

    def slug(self) -> str:
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(self.model).name or "model")[:40]
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k != "graphs" or v}  # older names stay
        return f"{name}-{self.dtype}-{_digest(fields)[:12]}"


@dataclass
class DeviceProfile:
    """Per-device costs of a DSpark round, in seconds. verify_time[i] is for i+1 tokens (anchor + i drafts)."""

    key: ProfileKey
    verify_time: list[float]
    draft_time: float
    rollback_time: float
    cache_len: int
    warmup: int
    repeats: int
    verify_iqr: list[list[float]] = field(default_factory=list)  # [γ+1] × (p25, p75), for the record
    created: str = ""
    draft_tokens: int = 0  # drafts per round draft_time was measured with (set by measure_profile)
    linear: str = "stock"  # a round's few-row products (linears.LINEARS), measured to be the faster
    # {"stock"|"weight_major": {tokens: median s of that verification, "draft": of a drafter round}}: the choice's data
    linear_ab: dict = field(default_factory=dict)
    sampled_draft_time: float | None = None  # a sampled drafter round (None: as draft_time)

    @property
    def block_size(self) -> int:
        return len(self.verify_time) - 1

    def round_overhead_at(self, sampled: bool = False) -> float:
        """Fixed seconds per round whatever ℓ is: drafting (a greedy or a `sampled` round) + cache roll-back."""
        draft = self.sampled_draft_time if sampled and self.sampled_draft_time is not None else self.draft_time
        return draft + self.rollback_time

    round_overhead = property(round_overhead_at)  # a greedy round's

    def verify_length(self, conf: torch.Tensor, sampled: bool = False) -> int:
        """conf [n] calibrated conditional survival → drafts to verify (batch-1 scheduler on this profile), for a
        greedy or a `sampled` call."""
        return single_stream_length(conf, self.verify_time, self.round_overhead_at(sampled))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DeviceProfile":
        d = dict(d)
        d["key"] = ProfileKey(**{"version": 1, **d["key"]})  # a key written before versions existed is version 1
        return cls(**d)

    def save(self, path: str | Path | None = None) -> Path:
        return write_atomic(path if path is not None else profile_path(self.key), json.dumps(self.to_dict(), indent=2))

    def __str__(self) -> str:
        return format_profile(self)


# ---- keys ------------------------------------------------------------------------------------------------------
def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _config_dict(config, drop=()) -> dict:
    d = config.to_dict()
    for k in ("_name_or_path", "transformers_version", "dtype", "torch_dtype", *drop):
        d.pop(k, None)
    return d


def make_key(config, device: torch.device | str, dtype: str, drafter_config=None) -> ProfileKey:
    """The key of a measurement of the model with `config` on `device` in `dtype` (a name, or several joined
    when one measurement compares dtypes), verified with a drafter of `drafter_config` if given."""
    shapes = {"target": _config_dict(config)}
    if drafter_config is not None:
        shapes["drafter"] = _config_dict(drafter_config, drop=("confidence_temperatures", "calibration"))
    digest = _digest(shapes)[:16]
    name = getattr(config, "_name_or_path", "") or config.model_type
    return ProfileKey(model=str(name), config_hash=digest, dtype=dtype, device=device_name(device),
                      torch=torch.__version__)


def profile_key(target, drafter, loop: str = "assisted") -> ProfileKey:
    """The key of `target` verified with `drafter` on the target's device and dtype, on decoding loop `loop`."""
    key = make_key(target.config, target.device, str(target.dtype).removeprefix("torch."), drafter.config)
    graphs = _digest(graph_setup())[:12] if loop == "compiled" else ""
    return dataclasses.replace(key, loop=loop, graphs=graphs)


def profile_path(key: ProfileKey, kind: str = "") -> Path:
    """Where a measurement under `key` is cached; `kind` names measurements other than the device profile."""
    return storage_dir() / "profiles" / f"{kind + '-' if kind else ''}{key.slug()}.json"


def load_profile(path: str | Path, expect: ProfileKey | None = None) -> DeviceProfile:
    """Read a profile; with `expect`, raise ProfileMismatchError naming the fields that differ."""
    profile = DeviceProfile.from_dict(json.loads(Path(path).read_text()))
    if expect is not None and profile.key != expect:
        diff = {
            f.name: (getattr(profile.key, f.name), getattr(expect, f.name))
            for f in dataclasses.fields(ProfileKey)
            if getattr(profile.key, f.name) != getattr(expect, f.name)
        }
        raise ProfileMismatchError(
            f"{path} was measured for another setup ({', '.join(f'{k}: {a!r} ≠ {b!r}' for k, (a, b) in diff.items())}); "
            "measure one for this setup with `hf-dspark profile` or hf_dspark.decoding.profile.get_profile(..., measure=True)"
        )
    return profile


def get_profile(target, drafter, measure: bool = True, loop: str = "assisted", **measure_kwargs) -> DeviceProfile:
    """The cached profile for this target/drafter/device/dtype/torch on decoding loop `loop`; if there is none,
    measure and cache one (`measure=True`, a few seconds on CPU; the compiled loop compiles first) or raise
    FileNotFoundError. Never returns another setup's profile."""
    key = profile_key(target, drafter, loop)
    path = profile_path(key)
    if path.exists():
        return load_profile(path, expect=key)
    if not measure:
        raise FileNotFoundError(f"no device profile for {key} at {path}; run `hf-dspark profile --loop {loop}`")
    logging.get_logger(__name__).warning("No device profile for %s on %s yet: measuring one (once)", key.model,
                                         key.device)
    profile = measure_profile(target, drafter, loop=loop, **measure_kwargs)
    profile.save(path)
    return profile


def prepare(target, drafter, force: bool = False, **measure_kwargs) -> DeviceProfile:
    """Set this machine up for `target` verified with `drafter` (once per target, drafter shape, dtype, device and
    thread count; minutes on a CPU): compile DSpark's loop, save its graph and measure its device profile. From then
    on the default loop ("auto", options.py) runs the compiled loop here. force: measure again. Raises ValueError
    (a refusal, by name) where the loop cannot take the target or cannot compile here (the defaults then stay on transformers' assisted loop).
    measure_kwargs: measure_profile's (cache_len, warmup, repeats)."""
    why = unsupported(target, torch.zeros((1, 1), dtype=torch.long, device=target.device),
                      GenerationConfig(max_length=256), {}, drafter.config.block_size)
    if why is not None:
        raise ValueError(f"DSpark's compiled loop cannot run this target ({why}); the defaults keep transformers' "
                         "assisted loop for it")
    path = profile_path(profile_key(target, drafter, "compiled"))
    if force or not path.exists():
        measure_profile(target, drafter, loop="compiled", **measure_kwargs).save(path)
    return get_profile(target, drafter, measure=False, loop="compiled")


# ---- measuring --------------------------------------------------------------------------------------------------
class _Clock:
    """Wall time around device work: synchronises CUDA so queued kernels are counted."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


@torch.no_grad()
def measure_profile(target, drafter, cache_len: int = 256, warmup: int = 3, repeats: int = 10,
                    seed: int = 0, loop: str = "assisted", linear: str | None = None) -> DeviceProfile:
    """Time a verification forward of 1..γ+1 tokens on a `cache_len`-token cache of decoding loop `loop` (lengths
    interleaved in random order, `warmup` untimed passes, medians over `repeats`), the drafter's round and the cache
    roll-back. `linear`: the verification products to measure with (linears.LINEARS; None: the faster in an A/B).
    Runs on the target's device and dtype; token ids are random (costs do not depend on them). The global RNG is
    left untouched, so measuring on first use inside a seeded generate() does not change its samples."""
    devices = [target.device] if target.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        return _measure(target, drafter, cache_len, warmup, repeats, seed, loop, linear)


@dataclass
class ForwardTimes:
    """Seconds of target forwards on one KV cache (time_forwards)."""

    prefill: float  # the forward of cache_len tokens that filled the cache
    forward: dict[int, list[float]]  # k → each timed forward of k new tokens on that cache (rolled back after each)
    rollback: list[float]  # each cache.crop after a timed forward


@torch.no_grad()
def time_forwards(target, lengths, cache_len: int = 256, warmup: int = 3, repeats: int = 10, seed: int = 0,
                  taps: list[int] | None = None, loop: str = "assisted") -> ForwardTimes:
    """Time the target as decoding loop `loop` runs it: one untimed short forward (one-time allocations and kernel
    choice), a timed `cache_len`-token prefill, then forwards of each k in `lengths` new tokens on that cache
    (lengths in random order each repeat, `warmup` untimed repeats), each rolled back. "assisted": a DynamicCache
    cropped as transformers' assisted loop crops it; "static"/"compiled": loop.StaticVerifier, its forwards padded
    to loop.LENGTHS (compiled: each length compiled after the prefill, before timing). `taps`: hidden states
    requested as verification requests them. Token ids are random (costs do not depend on them) from a seeded
    generator: the global RNG is not used."""
    clock = _Clock(target.device)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    vocab = target.config.get_text_config().vocab_size
    ids = lambda n: torch.randint(0, vocab, (1, n), generator=gen).to(target.device)  # noqa: E731
    target(ids(max(1, cache_len // 4)), use_cache=True)
    extra = {"output_hidden_states": taps} if taps else {}
    if loop == "assisted":
        cache = DynamicCache(config=target.config)
        # as transformers' assisted loop does: sliding-window layers keep their past so crop can roll back past the
        # window
        cache.activate_past_recording()
        prefill = forward = lambda tokens: target(tokens, cache=cache, use_cache=True, **extra)  # noqa: E731
        rollback = lambda k: cache.crop(-k)  # noqa: E731 -- crop takes the number of tokens to remove, negated
    else:
        verifier = StaticVerifier(target, cache_len + 2 * max(lengths), taps or None, compiled=loop == "compiled",
                                  longest=max(lengths))
        cache, prefill, forward = verifier.cache, verifier.prefill, verifier.verify
        rollback = lambda k: verifier.keep(0)  # noqa: E731
    t0 = clock.now()
    prefill(ids(cache_len))
    prefill_time = clock.now() - t0
    if loop == "compiled" and not verifier.compiled:  # its forwards would be eager: not the compiled loop's curve
        raise ValueError(f"the compiled loop cannot compile this target here ({target._dspark_compile_error}); "
                         "use loop='assisted' or 'static'")
    times = ForwardTimes(prefill=prefill_time, forward={k: [] for k in lengths}, rollback=[])
    for rep in range(warmup + repeats):
        order = list(lengths)
        rng.shuffle(order)
        for k in order:
            t0 = clock.now()
            forward(ids(k))
            t1 = clock.now()
            rollback(k)
            t2 = clock.now()
            assert cache.get_seq_length() == cache_len, "cache roll-back did not restore the length"
            if rep >= warmup:
                times.forward[k].append(t1 - t0)
                times.rollback.append(t2 - t1)
    return times


def _measure(target, drafter, cache_len, warmup, repeats, seed, loop, linear=None) -> DeviceProfile:
    gamma = drafter.config.block_size
    clock = _Clock(target.device)
    gen = torch.Generator().manual_seed(seed + 1)  # the drafter's inputs
    max_pos = getattr(target.config.get_text_config(), "max_position_embeddings", None)  # None: ALiBi (Bloom, MPT)
    if max_pos is not None:
        cache_len = max(1, min(cache_len, max_pos - gamma - 2))
    taps = [i + 1 for i in drafter.config.target_layer_ids]
    weights = drafter.draft_weights()  # as the candidate generator gathers them: its LM head takes the form too
    if linear is not None:
        linear_ab = {}
    else:
        linear, linear_ab = choose_linear(target, drafter, weights, gamma, cache_len, seed, taps, loop)
    with round_forms(target, drafter, weights, linear):
        timed = time_forwards(target, range(1, gamma + 2), cache_len, warmup, repeats, seed, taps=taps, loop=loop)
        verify, rollback = timed.forward, timed.rollback
        verify_time = [statistics.median(verify[k]) for k in verify]
        rollback_time = statistics.median(rollback)

        def drafting(sample: bool) -> tuple[float, int]:
            # The scheduler never verifies more than max_verified drafts, so decoding drafts only that many: time
            # the round at that size. A cheaper draft can only lower the bound again, never raise it past the timed.
            t = time_drafter(drafter, gamma, cache_len, warmup, repeats, gen, clock, weights=weights, sample=sample)
            n = max(1, max_verified(verify_time, t + rollback_time))
            if n < gamma:
                t = time_drafter(drafter, n, cache_len, warmup, repeats, gen, clock, weights=weights, sample=sample)
            return t, n

        draft, n = drafting(sample=False)
        sampled_draft, _ = drafting(sample=True)
    q = lambda xs, p: statistics.quantiles(xs, n=4)[p] if len(xs) > 1 else xs[0]  # noqa: E731
    return DeviceProfile(
        key=profile_key(target, drafter, loop),
        verify_time=verify_time,
        draft_time=draft,
        sampled_draft_time=sampled_draft,
        rollback_time=rollback_time,
        cache_len=cache_len, warmup=warmup, repeats=repeats,
        verify_iqr=[[q(verify[k], 0), q(verify[k], 2)] for k in verify],
        created=time.strftime("%Y-%m-%dT%H:%M:%S"),
        draft_tokens=n,
        linear=linear,
        linear_ab=linear_ab,
    )


LINEAR_GAIN = 0.95  # weight-major is chosen only below 95 % of stock's time: a tie is not worth a change


def round_forms(target, drafter, weights, linear: str) -> WeightMajorLinears | contextlib.nullcontext:
    """A context that runs a round's products (the target's verification forwards, the drafter's round and the
    draft LM head of `weights` = drafter.draft_weights()) as `linear` names (linears.LINEARS)."""
    return round_linears(linear, drafter.config.block_size, target, drafter, weights[1]) or contextlib.nullcontext()


def choose_linear(target, drafter, weights, gamma: int, cache_len: int, seed: int, taps, loop: str,
                  repeats: int = 3) -> tuple[str, dict]:
    """A/B of a round's products, stock and weight-major: the target's verification forwards (2, the middle and
    γ + 1 tokens) and a greedy drafter round of γ drafts → (the faster, {form: {tokens: median s, "draft": median s}}).
    Each verification counts with one drafter round; weight-major must take under LINEAR_GAIN of stock's total.
    The forms alternate (`repeats` rounds of both, in turn first), so a slow stretch of a shared machine weighs on
    both rather than deciding the choice. On the compiled loop each form's graphs are compiled with it installed
    (in the first untimed warm-up)."""
    lengths = sorted({2, gamma // 2 + 1, gamma + 1})
    times = {form: {**{str(k): [] for k in lengths}, "draft": []} for form in LINEARS}
    for rep in range(repeats):
        for form in LINEARS[::-1] if rep % 2 else LINEARS:
            with round_forms(target, drafter, weights, form):
                forward = time_forwards(target, lengths, cache_len, warmup=1, repeats=1, seed=seed + rep, taps=taps,
                                        loop=loop).forward
                times[form]["draft"].append(time_drafter(drafter, gamma, cache_len, warmup=2, repeats=3,
                                                         weights=weights))
            for k, v in forward.items():
                times[form][str(k)] += v
    medians = {form: {k: statistics.median(v) for k, v in t.items()} for form, t in times.items()}
    total = {form: sum(m[str(k)] + m["draft"] for k in lengths) for form, m in medians.items()}
    return ("weight_major" if total["weight_major"] < LINEAR_GAIN * total["stock"] else "stock"), medians


def time_drafter(drafter, n: int, cache_len: int = 300, warmup: int = 5, repeats: int = 30,
                 gen: torch.Generator | None = None, clock: _Clock | None = None, weights=None,
                 sample: bool = False) -> float:
    """Median seconds of one drafter round as the candidate generator runs it: ingest a few accepted rows into
    the context K/V, then drafter.draft (kernel or PyTorch, as decoding would): one backbone pass over the block,
    the LM-head rows and sequential head (greedy, or drawing from q with `sample`) for the first `n` drafts,
    calibrated confidences. Random context features of `cache_len` positions (`gen`, default seeded 0); `clock`
    syncs the device; `weights`: drafter.draft_weights() (default: gathered here)."""
    gen = torch.Generator().manual_seed(0) if gen is None else gen
    clock = _Clock(drafter.device) if clock is None else clock
    cfg, dev = drafter.config, drafter.device
    gamma, m = cfg.block_size, len(cfg.target_layer_ids)
    feats = torch.randn(1, cache_len, m * cfg.hidden_size, generator=gen).to(dev, drafter.dtype)
    context = drafter.context_kv(feats, torch.arange(cache_len, device=dev)[None])
    new = min(cache_len, gamma // 2 + 1)  # a typical round accepts about half the block
    prefix = torch.randint(0, cfg.vocab_size, (1, cache_len + 1), generator=gen).to(dev)  # the anchor at cache_len
    weights = drafter.draft_weights() if weights is None else weights  # a pruned vocabulary is part of the cost
    times = []
    for rep in range(warmup + repeats):
        t0 = clock.now()
        kv = drafter.context_kv(feats[:, -new:], torch.arange(cache_len - new, cache_len, device=dev)[None])
        ctx = [(torch.cat([k0, k], 2), torch.cat([v0, v], 2)) for (k0, v0), (k, v) in zip(context, kv)]
        # its confidences: the scheduler's host sync
        drafter.draft(ctx, prefix, n, do_sample=sample, weights=weights, temperature=1.0 if sample else 0.0)
        t1 = clock.now()
        if rep >= warmup:
            times.append(t1 - t0)
    return statistics.median(times)


# ---- printing ---------------------------------------------------------------------------------------------------
def break_even_survival(profile: DeviceProfile) -> list[float]:
    """[γ] the prefix survival a_ℓ above which draft ℓ is worth verifying when drafts 1..ℓ-1 are certain to
    survive: ℓ · (T*(ℓ+1) − T*(ℓ)) / (overhead + T*(ℓ)) on the envelope (token counts). With less certain
    predecessors the bar is lower (the rule uses 1 + Σ a_j in place of ℓ); a value ≥ 1 means never worth it."""
    env = monotone_envelope(profile.verify_time)
    o = profile.round_overhead
    return [ell * (env[ell] - env[ell - 1]) / (o + env[ell - 1]) for ell in range(1, len(env))]


def format_profile(profile: DeviceProfile) -> str:
    k = profile.key
    env = monotone_envelope(profile.verify_time)
    be = break_even_survival(profile)
    o = profile.round_overhead
    lines = [
        f"DSpark device profile: {k.model} [{k.dtype}] on {k.device}, torch {k.torch}, {k.loop} loop",
        f"  cache {profile.cache_len} tokens; medians of {profile.repeats} after {profile.warmup} warm-up; "
        f"drafter {profile.draft_time * 1e3:.2f} ms/round greedy, "
        f"{(profile.round_overhead_at(True) - profile.rollback_time) * 1e3:.2f} sampled ({profile.draft_tokens} drafts), "
        f"cache roll-back {profile.rollback_time * 1e3:.3f} ms",
        f"  round products: {profile.linear}" + "".join(
            f"; {form} {' '.join(f'T({k}) {t * 1e3:.1f}' if k != 'draft' else f'draft {t * 1e3:.1f}' for k, t in ts.items())} ms"
            for form, ts in profile.linear_ab.items()),
        "  drafts  tokens   T(B) ms  p25-p75 ms    T*(B) ms  run as  rounds/s  break-even a_ℓ",
    ]
    for i, t in enumerate(profile.verify_time):
        iqr = profile.verify_iqr[i] if i < len(profile.verify_iqr) else [float("nan")] * 2
        pad = pad_length(i, profile.verify_time)
        lines.append(
            f"  {i:6d}  {i + 1:6d}  {t * 1e3:8.2f}  {iqr[0] * 1e3:5.1f}-{iqr[1] * 1e3:<5.1f}  {env[i] * 1e3:9.2f}  "
            f"{pad:6d}  {1 / (o + env[i]):8.1f}  " + ("      -" if i == 0 else f"{be[i - 1]:7.3f}")
        )
    lines.append("  (run as: a length is verified as the cheaper longer forward T*(B) = min_{j≥B} T(j); lossless;"
                 " rounds/s and break-even for greedy rounds)")
    return "\n".join(lines)
