"""Long-generation check (issue 10): 4,096 greedy tokens on the embedded SmolLM2 (fp32) with the shipped drafter.

Measures, every --every tokens, the process RSS (/proc/self/status VmRSS), the target's KV cache (bytes held by
its DynamicCache) and the drafter's own context K/V; checks at every DSpark round that the drafter's context is
in step with the target (drafter context length == target cache length == sequence length − 1, and every
drafter layer's K/V holds exactly that many rows); and checks that the output equals plain greedy `generate` of
the same length. Each run (DSpark, plain) happens in its own child process, so RSS numbers start clean.

    OMP_NUM_THREADS=1 .venv/bin/python research/long_generation.py              # 4096 tokens (~40-50 min a run, 1 thread)
    OMP_NUM_THREADS=1 .venv/bin/python research/long_generation.py --new 256    # a quick try

Exit status 0 when every check passes, 1 otherwise. --json PATH also writes the raw samples.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

PROMPT = ("Write a very long, detailed story about a lighthouse keeper who finds a map in a bottle. "
          "Describe every day of the journey.")


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def cache_bytes(cache) -> tuple[int, int]:
    """(bytes held by a transformers cache's key/value tensors, its sequence length)."""
    total = 0
    for layer in getattr(cache, "layers", []):
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if t is not None and hasattr(t, "numel"):
                total += t.numel() * t.element_size()
    return total, int(cache.get_seq_length())


def run(mode: str, new: int, every: int, threads: int, progress: str | None = None) -> dict:
    import torch

    torch.set_num_threads(threads)
    from hf_dspark.decoding.candidate import DSparkCandidateGenerator
    from hf_dspark.io.loading import load_default_drafter, load_default_target

    model, tok = load_default_target(torch.float32)
    drafter = load_default_drafter(model) if mode == "dspark" else None
    ids = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    prompt_len = ids.shape[1]
    state = {"gen": None, "next": 0, "rounds": 0, "violations": []}
    samples = []

    def drafter_bytes():
        g = state["gen"]
        if g is None or g.context_kv is None:
            return 0, 0
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in g.context_kv), g.ctx_len

    t0 = time.perf_counter()

    def record(seq_len, cache):
        kv, cache_len = cache_bytes(cache)
        dkv, dlen = drafter_bytes()
        samples.append(dict(new_tokens=seq_len - prompt_len, seq_len=seq_len, rss=rss_bytes(), target_kv=kv,
                            target_cache_len=cache_len, drafter_kv=dkv, drafter_ctx_len=dlen,
                            seconds=time.perf_counter() - t0))

    def hook(module, args, kwargs, output):  # after every target forward: plain decode step or verification
        cache = output.get("cache", None) or output.get("past_key_values", None)  # transformers 5.24 calls it `cache`
        if cache is None:
            return
        seq_len = cache.get_seq_length()  # tokens whose K/V the target holds (≈ sequence length)
        if seq_len - prompt_len >= state["next"] or (seq_len >= prompt_len + new - 1 and not state.get("last")):
            state["last"] = seq_len >= prompt_len + new - 1
            record(seq_len, cache)
            state["next"] = (seq_len - prompt_len) // every * every + every
            s = samples[-1]
            print(f"[{mode}] {s['new_tokens']} new tokens, {s['seconds']:.0f} s, RSS {s['rss'] / 2**20:.1f} MiB, "
                  f"target KV {s['target_kv'] / 2**20:.1f} MiB, drafter KV {s['drafter_kv'] / 2**20:.2f} MiB",
                  file=sys.stderr, flush=True)

    handle = model.register_forward_hook(hook, with_kwargs=True)

    if mode == "dspark":
        real_init, real_get = DSparkCandidateGenerator.__init__, DSparkCandidateGenerator.get_candidates

        def init(self, *a, **k):
            real_init(self, *a, **k)
            state["gen"] = self

        def get(self, input_ids, model_kwargs=None, model_outputs=None, is_first_iteration=False, **k):
            out = real_get(self, input_ids, model_kwargs=model_kwargs, model_outputs=model_outputs,
                           is_first_iteration=is_first_iteration, **k)
            if not is_first_iteration:
                state["rounds"] += 1
                if progress and input_ids.shape[1] - prompt_len >= state.setdefault("next_dump", every):
                    state["next_dump"] += every  # committed tokens so far: a run cut short can still be checked
                    with open(progress, "a") as f:
                        f.write(json.dumps(dict(new_tokens=input_ids.shape[1] - prompt_len, rounds=state["rounds"],
                                                n_violations=len(state["violations"]), sample=samples[-1],
                                                tokens=input_ids[0].tolist())) + "\n")
                cache = model_kwargs.get("cache") or model_kwargs.get("past_key_values")
                cache_len = cache.get_seq_length()
                rows = {k.shape[2] for k, v in self.context_kv} | {v.shape[2] for k, v in self.context_kv}
                want = input_ids.shape[1] - 1  # everything but the anchor, which the next verification feeds
                if not (self.ctx_len == cache_len == want and rows == {want}):
                    state["violations"].append(dict(seq_len=input_ids.shape[1], drafter_ctx_len=self.ctx_len,
                                                    target_cache_len=cache_len, drafter_kv_rows=sorted(rows)))
            return out

        DSparkCandidateGenerator.__init__, DSparkCandidateGenerator.get_candidates = init, get

    kwargs = dict(do_sample=False, max_new_tokens=new, min_new_tokens=new)
    if drafter is not None:
        kwargs["assistant_model"] = drafter
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, **kwargs)
    wall = time.perf_counter() - start
    handle.remove()
    final_len = out.shape[1]
    result = dict(mode=mode, prompt_len=prompt_len, new_tokens=final_len - prompt_len, wall_s=wall,
                  tokens=out[0].tolist(), samples=samples, final_rss=rss_bytes())
    if mode == "dspark":
        g, st = state["gen"], drafter.last_stats
        dkv, dlen = drafter_bytes()
        result.update(
            rounds=state["rounds"], violations=state["violations"][:10], n_violations=len(state["violations"]),
            final_drafter_ctx_len=dlen, final_drafter_kv=dkv, tau=st.tau,
            # the last round's committed tokens (and the bonus) are never ingested: the run ends before the next draft
            final_gap=final_len - dlen, block_size=drafter.config.block_size,
            stats_rounds=len(st.rounds), pending_is_none=g.pending is None,
            observer_records=len(g.observer.target_probs),
        )
    return result


def start_child(mode, args) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "--child", mode, "--new", str(args.new), "--every", str(args.every),
           "--threads", str(args.threads)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)  # progress lines go to our stderr


def finish_child(mode, proc) -> dict:
    stdout, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{mode} run failed (exit {proc.returncode})")
    return json.loads(stdout.strip().splitlines()[-1])


def mib(b) -> str:
    return f"{b / 2**20:8.1f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--new", type=int, default=4096, help="new tokens (min_new_tokens = max_new_tokens)")
    p.add_argument("--every", type=int, default=256, help="sample memory every this many tokens")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--parallel", action="store_true", help="run the DSpark and plain processes at the same time")
    p.add_argument("--json", help="write the raw samples here")
    p.add_argument("--child", choices=["dspark", "plain"], help=argparse.SUPPRESS)
    p.add_argument("--progress", help="(with --child dspark) append the committed tokens and the in-step check "
                   "count here every --every tokens, for runs that may be cut short")
    args = p.parse_args()
    if args.child:
        print(json.dumps(run(args.child, args.new, args.every, args.threads, args.progress)))
        return 0

    if args.parallel:  # two single-threaded processes side by side (RSS stays per process)
        procs = {m: start_child(m, args) for m in ("dspark", "plain")}
        spec, plain = (finish_child(m, procs[m]) for m in ("dspark", "plain"))
    else:
        spec = finish_child("dspark", start_child("dspark", args))
        plain = finish_child("plain", start_child("plain", args))
    print(f"dspark: {spec['new_tokens']} new tokens in {spec['wall_s']:.0f} s, τ = {spec['tau']:.2f}", flush=True)
    print(f"plain:  {plain['new_tokens']} new tokens in {plain['wall_s']:.0f} s", flush=True)

    for run_ in (spec, plain):
        s0 = run_["samples"][0]
        print(f"\n{run_['mode']}: memory vs tokens (MiB; growth relative to the first sample)")
        print(f"{'new tok':>8} {'RSS':>8} {'ΔRSS':>8} {'target KV':>9} {'ΔKV':>8} {'drafter KV':>10} {'ΔRSS−ΔKVs':>10} {'s':>7}")
        for s in run_["samples"]:
            d_rss = s["rss"] - s0["rss"]
            d_kv = (s["target_kv"] - s0["target_kv"]) + (s["drafter_kv"] - s0["drafter_kv"])
            print(f"{s['new_tokens']:>8} {mib(s['rss'])} {mib(d_rss)} {mib(s['target_kv']):>9} {mib(d_kv)} "
                  f"{mib(s['drafter_kv']):>10} {mib(d_rss - d_kv):>10} {s['seconds']:7.0f}")

    checks = {}
    checks["same length"] = spec["new_tokens"] == plain["new_tokens"] == args.new
    a, b = spec["tokens"], plain["tokens"]
    first_diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    checks["DSpark output == plain greedy generate"] = a == b
    checks["drafter context in step with the target at every round"] = spec["n_violations"] == 0 and spec["rounds"] > 0
    checks["drafter context at the end = sequence − tokens of the last round"] = \
        2 <= spec["final_gap"] <= spec["block_size"] + 1
    checks["drafter holds no per-round leftovers (pending, observer)"] = \
        spec["pending_is_none"] and spec["observer_records"] <= spec["block_size"]
    last_s, last_p = spec["samples"][-1], plain["samples"][-1]
    growth = {r["mode"]: (r["samples"][-1]["rss"] - r["samples"][0]["rss"])
              - (r["samples"][-1]["target_kv"] - r["samples"][0]["target_kv"])
              - (r["samples"][-1]["drafter_kv"] - r["samples"][0]["drafter_kv"]) for r in (spec, plain)}
    print(f"\nRSS growth beyond the KV caches' own growth, first → last sample: dspark {growth['dspark'] / 2**20:.1f} MiB, "
          f"plain {growth['plain'] / 2**20:.1f} MiB")
    print(f"target KV at the end: {last_s['target_kv'] / 2**20:.1f} MiB ({last_s['target_cache_len']} positions); "
          f"drafter context K/V: {spec['final_drafter_kv'] / 2**20:.1f} MiB ({spec['final_drafter_ctx_len']} positions, "
          f"final sequence {spec['prompt_len'] + spec['new_tokens']}); rounds {spec['rounds']}, stats rounds kept "
          f"{spec['stats_rounds']}")
    if first_diff is not None:
        print(f"first difference at sequence index {first_diff} (new token {first_diff - spec['prompt_len']}): "
              f"dspark {a[first_diff]} vs plain {b[first_diff]}")
    if spec["violations"]:
        print("first violations:", spec["violations"])
    print()
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"dspark": spec, "plain": plain, "checks": checks, "first_diff": first_diff}, f)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
