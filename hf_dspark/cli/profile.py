"""`hf-dspark profile`: measure (or show the cached) device profile for a target + drafter on this device."""

from __future__ import annotations

from . import common


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("profile", help="set up this machine: compile DSpark's loop and measure the step-time "
                                              "curve the scheduler uses (once per target, dtype and thread count)")
    common.add_target(p)
    common.add_drafter(p, help="drafter folder (default: the shipped drafter; only its shape matters)")
    common.add_dtype(p, default="auto", help="target dtype (auto: as hf-dspark generate picks it)")
    common.add_device(p)
    common.add_threads(p, help="torch threads (0: torch's default); part of the key on CPU")
    p.add_argument("--cache-len", type=common.positive, default=256, help="KV-cache length the forwards run on")
    p.add_argument("--warmup", type=common.non_negative, default=5, help="untimed forwards per length")
    p.add_argument("--repeats", type=common.positive, default=20, help="timed forwards per length (median kept)")
    p.add_argument("--loop", choices=common.LOOPS[1:], default="compiled",
                   help="the decoding loop to measure (DecodingOptions.loop), each has its own profile; compiled "
                        "(default) also compiles and saves its verification graph (minutes on a CPU, once), after "
                        "which loop 'auto', the default, runs DSpark's compiled loop on this machine")
    p.add_argument("--force", action="store_true", help="re-measure even if a profile for this setup is cached")
    common.add_output(p, "also write the profile JSON here")
    p.set_defaults(func=cmd_profile)


def cmd_profile(args) -> int:
    from ..decoding.profile import format_profile, load_profile, measure_profile, prepare, profile_key, profile_path
    from ..io.loading import load_target_and_drafter

    common.set_threads(args)
    model, _, drafter, _ = load_target_and_drafter(args.target, args.drafter, args.dtype, common.device(args))
    key = profile_key(model, drafter, args.loop)
    path = profile_path(key)
    cached = load_profile(path, expect=key) if path.exists() and not args.force else None
    if cached is not None:
        profile = cached
        print(f"cached profile {path} (use --force to re-measure)")
    else:
        timing = dict(cache_len=args.cache_len, warmup=args.warmup, repeats=args.repeats)
        if args.loop == "compiled":  # the setup of the default loop: refuses a target it cannot run, by name
            profile = prepare(model, drafter, force=True, **timing)
        else:
            profile = measure_profile(model, drafter, loop=args.loop, **timing)
            profile.save(path)
        print(f"saved {path}")
    if args.output:
        profile.save(args.output)
    print(format_profile(profile))
    return 0
