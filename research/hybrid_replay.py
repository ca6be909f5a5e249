"""Replay a greedy `hf-dspark bench` run offline to compare draft-source policies (how drafter.options.ngram_drafts's
n-gram rules were chosen; research/record/benchmarks.md, "DSpark + n-gram drafts").

Greedy decoding is lossless, so every method commits the same tokens: the run's output per prompt fixes what
each round would accept. For every position this script computes the n-gram draft (several rules) and the
shipped drafter's greedy block with its confidences (`replay.slot_scores`, one teacher-forced pass), then walks
each policy's rounds under a cost model fitted to the run's DSpark + scheduler rounds: a round verifying k drafts
costs the profile's T(k+1) plus the offset between the run's 4-draft rounds and T(5); a round without drafts
costs the run's plain-like round; a drafter round adds the run's median drafter time. Methods the run measured
print their measured ratio next to the simulated one, which checks the model. Estimates, not measurements: the
chosen policy was then benchmarked for real.

    python research/hybrid_replay.py out/big_gsm8k/results.json data/prompts/eval/gsm8k.jsonl   # ~5 min the first time

With `--cost-run` the costs come instead from another run's rounds (every DSpark method; a round verifying k
drafts costs the median of those rounds, lengths with ≤ 20 rounds the profile's T(k+1) plus the offset at 7) and
`--profile` gives that run's device profile, e.g. the float32 outputs replayed under a bf16 run's costs:

    python research/hybrid_replay.py out/big_mbpp/results.json data/prompts/eval/mbpp.jsonl \
        --cost-run out/bf16_mbpp/results.json --profile docs/results/profile_amd_bf16.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from hf_dspark.eval.bench import load_prompts
from hf_dspark.io.prompts import chat_inputs
from hf_dspark.io.loading import load_target_and_drafter
from hf_dspark.decoding.profile import get_profile, load_profile
from hf_dspark.eval.replay import slot_scores
from hf_dspark.decoding.scheduler import DraftGate, max_verified, single_stream_length
from rejudge import output_tokens  # research/rejudge.py: outputs of runs made before the bench stored them

GAMMA = 7


def ngram_draft(x: list[int], cur: int, num: int, min_n: int, max_n: int, latest: bool, periodic: bool = False) -> list[int]:
    """Tokens after an earlier occurrence (latest or first) of the longest suffix n-gram of x[:cur]; `periodic`
    continues a match that runs into the end as a repeat (period = cur - its end) up to `num` tokens."""
    for n in range(min(max_n, cur - 1), min_n - 1, -1):
        pat = x[cur - n:cur]
        starts = range(cur - n - 1, -1, -1) if latest else range(0, cur - n)
        for i in starts:
            if x[i:i + n] == pat:
                e = i + n
                if periodic:
                    return [x[e + k % (cur - e)] for k in range(num)]
                return x[e:min(e + num, cur)]
    return []


def collect(results: Path, prompts_file: str, cache: Path) -> list[dict]:
    """Per prompt of `prompts_file`'s set: prompt length, prompt + greedy output, the drafter's match rows and
    calibrated confidences along its own greedy chain, and the run's seconds per method."""
    if cache.exists():
        return json.loads(cache.read_text())
    res = json.loads(results.read_text())
    name = Path(prompts_file).stem
    indices = sorted({r["prompt"] for r in res["rows"] if r["dataset"] == name})
    if not indices:
        raise SystemExit(f"{results} has no rows for the set {name!r}")
    model, tok, drafter, _ = load_target_and_drafter(None, None, torch.float32, "cpu")
    out = []
    for i, (_, text) in zip(indices, load_prompts([prompts_file], len(indices))):
        prompt = chat_inputs(tok, text)["input_ids"]
        ids = prompt[0].tolist()
        rows = {r["method"]: r for r in res["rows"] if r["prompt"] == i}
        y = output_tokens(next(r for r in rows.values() if r["rounds"]), prompt, model)
        assert len(y) == rows["plain"]["new_tokens"], f"prompt {i}: DSpark's output is not plain's length"
        sc = slot_scores(drafter, ids, y)
        out.append({"P": len(ids), "x": ids + y, "match": sc["match"].int().tolist(),
                    "conf": drafter.confidence_probs(sc["conf_greedy"]).tolist(),
                    "seconds": {m: r["seconds"] for m, r in rows.items()}})
        print(f"prompt {i}: {len(ids)} + {len(y)} tokens", flush=True)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(out))
    return out


def simulate(d: dict, policy: dict, cost: dict, step_time: list[float], profile, max_new: int) -> float:
    """Seconds of one generation under `policy` (as candidate.py runs it): n-gram drafts first when
    policy["ngram"] = (min_n, max_n, latest, periodic) finds a match, at most policy["ngram_cap"] of them (γ for
    transformers' prompt lookup; max_verified at the roll-back overhead under the scheduler); else, with
    policy["dspark"], the drafter under the scheduler and its draft gate (n-gram rounds do not reach the gate);
    else a plain step."""
    P, x, match, conf = d["P"], d["x"], d["match"], d["conf"]
    L, cur, secs = len(x), P + 1, cost["plain"]
    overhead = profile.round_overhead
    gate = DraftGate(step_time, overhead)
    cap = min(GAMMA, max_verified(step_time, overhead))
    ngram_cap = policy.get("ngram_cap", min(GAMMA, max_verified(step_time, profile.rollback_time)))
    while cur < L:
        room = max(P + max_new - cur - 1, 0)
        drafts = ngram_draft(x, cur, min(room, ngram_cap), *policy["ngram"]) if policy.get("ngram") else []
        if drafts:
            a = 0
            while a < len(drafts) and cur + a < L and drafts[a] == x[cur + a]:
                a += 1
            secs, cur = secs + cost["verify"][len(drafts)], cur + min(a + 1, L - cur)
            continue
        if policy.get("dspark"):
            n = min(room, cap)
            if n > 0 and gate.should_draft():
                length = single_stream_length(torch.tensor(conf[cur - 1 - P][:n]), step_time, overhead)
                a = 0
                while a < length and cur + a < L and match[cur - 1 - P][a]:
                    a += 1
                gate.record(True, length, a)
                secs, cur = secs + cost["draft"] + cost["verify"][length], cur + min(a + 1, L - cur)
                continue
            gate.record(False)
        secs, cur = secs + cost["plain"], cur + 1
    return secs


# (measured method whose simulation checks the cost model, or None, policy)
POLICIES = {
    "prompt lookup (transformers: 1-2-grams, first match)": ("prompt-lookup-7", {"ngram": (1, 2, False), "ngram_cap": 7}),
    "DSpark + scheduler": ("dspark+scheduler", {"dspark": True}),
    "n-gram 1-2, first + DSpark": (None, {"ngram": (1, 2, False), "dspark": True}),
    "n-gram 2, first + DSpark": (None, {"ngram": (2, 2, False), "dspark": True}),
    "n-gram 2-4, first + DSpark": (None, {"ngram": (2, 4, False), "dspark": True}),
    "n-gram 2-4, latest + DSpark (shipped until lengths were learnt)": ("dspark+scheduler+ngram", {"ngram": (2, 4, True), "dspark": True}),
    "n-gram 2-4, latest, periodic + DSpark": (None, {"ngram": (2, 4, True, True), "dspark": True}),
    "n-gram 3-4, latest + DSpark": (None, {"ngram": (3, 4, True), "dspark": True}),
    "n-gram 1-4, latest + DSpark": (None, {"ngram": (1, 4, True), "dspark": True}),
    "n-gram 2-4, latest, no DSpark": (None, {"ngram": (2, 4, True)}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="results.json of a greedy bench run with a dspark+scheduler method")
    ap.add_argument("prompts", help="the JSONL prompt file of one of its sets")
    ap.add_argument("--cache", type=Path, help="where the per-prompt replay data is kept (default: next to results)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cost-run", type=Path, help="take the cost model from this run's DSpark rounds instead")
    ap.add_argument("--profile", type=Path, help="the device profile JSON of --cost-run's setup")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cache = args.cache or args.results.with_name(f"hybrid_replay_{Path(args.prompts).stem}.json")
    data = collect(args.results, args.prompts, cache)
    res = json.loads(args.results.read_text())
    max_new = res["settings"]["max_new_tokens"]
    # the cost model comes from the drafter's rounds under the scheduler (not n-gram rounds, not other drafters)
    rounds = [x for r in res["rows"] if r["method"] == "dspark+scheduler"
              for x in r["rounds"] if x.get("source", "dspark") == "dspark"]
    by_len: dict[int, list[float]] = {}
    for r in rounds:
        by_len.setdefault(r["verified"], []).append(r["verify_time"] + (0.0 if r["drafted"] else r["draft_time"]))
    if 0 not in by_len or 4 not in by_len:
        raise SystemExit("the cost model needs dspark+scheduler rounds with 0 and with 4 verified drafts")
    model, _, drafter, _ = load_target_and_drafter(None, None, torch.float32, "cpu")
    try:
        prof = get_profile(model, drafter, measure=False)
    except FileNotFoundError:
        raise SystemExit("no device profile cached for this setup: run `hf-dspark profile` first") from None
    if args.profile:
        prof = load_profile(args.profile)
    T = prof.verify_time
    offset = statistics.median(by_len[4]) - T[4]
    cost = {"plain": statistics.median(by_len[0]), "verify": [statistics.median(by_len[0])] + [t + offset for t in T[1:]],
            "draft": statistics.median(r["draft_time"] for r in rounds if r["drafted"])}
    if args.cost_run:
        other = [x for r in json.loads(args.cost_run.read_text())["rows"] if r["rounds"] for x in r["rounds"]]
        lens: dict[int, list[float]] = {}
        for r in other:
            lens.setdefault(r["verified"], []).append(r["verify_time"])
        med = {k: statistics.median(v) for k, v in lens.items() if len(v) > 20}
        if 0 not in med or 7 not in med:
            raise SystemExit("--cost-run needs more than 20 rounds with 0 and with 7 verified drafts")
        verify = [med.get(k, T[k] + med[7] - T[7]) for k in range(len(T))]
        cost = {"plain": verify[0], "verify": verify,
                "draft": statistics.median(r["draft_time"] for r in other if r["drafted"] and r.get("source") == "dspark")}
    print(f"cost model (ms): plain {cost['plain'] * 1e3:.1f}, verify k=1..7 "
          f"{[round(v * 1e3, 1) for v in cost['verify'][1:]]}, drafter {cost['draft'] * 1e3:.1f}")
    base = sum(simulate(d, {}, cost, T, prof, max_new) for d in data)
    # pooled tokens/s against plain, per method, of the run the costs come from
    rows = json.loads(args.cost_run.read_text())["rows"] if args.cost_run else res["rows"]
    rate = {}
    for r in rows:
        t = rate.setdefault(r["method"], [0, 0.0])
        t[0], t[1] = t[0] + r["new_tokens"], t[1] + r["seconds"]
    measured_ratio = {m: (n / s) / (rate["plain"][0] / rate["plain"][1]) for m, (n, s) in rate.items()}
    for name, (measured, pol) in POLICIES.items():
        total = sum(simulate(d, pol, cost, T, prof, max_new) for d in data)
        check = f"   (measured in the run: {measured_ratio[measured]:.3f}x)" if measured in measured_ratio else ""
        print(f"{name:45s} simulated {base / total:.3f}x plain{check}")


if __name__ == "__main__":
    main()
