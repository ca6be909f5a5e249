"""Before/after of this round's speed levers, in one process on the same prompts (research/record/benchmarks.md).

    .venv/bin/python research/levers_before_after.py [--limit 6] [--max-new-tokens 96] [--threads 2] [--out DIR]

"before" is the scheduler as it ran until commit f04bdaf: Algorithm 1's lengths on the same device profile,
but drafting the whole block (7 backbone slots, 7 LM-head rows and sequential steps) and drafting every round.
Here it is the same lengths through a callable policy, which gets no draft cap and no draft gate. "after" is
`verify_policy = "scheduler"`: drafts capped at scheduler.max_verified, the backbone on that many slots, the
DraftGate skipping rounds that do not pay. Greedy outputs are checked against plain generate.
"""

import argparse
import json
from pathlib import Path

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=6, help="prompts per eval file")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "eval"))
    ap.add_argument("--out", default="out/levers")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from hf_dspark import load_default_drafter, load_default_target
    from hf_dspark.eval.bench import Method, load_prompts, markdown_table, run_bench
    from hf_dspark.decoding.profile import get_profile

    model, tok = load_default_target(dtype=torch.float32)
    drafter = load_default_drafter(model)
    profile = get_profile(model, drafter)
    before = lambda conf: profile.verify_length(conf)  # noqa: E731  (a callable: no cap, no gate, full block)
    methods = [Method("plain"), Method("scheduler-before", drafter=drafter, policy=before),
               Method("scheduler-after", drafter=drafter, policy="scheduler")]
    prompts = load_prompts([f"{a.eval}/gsm8k.jsonl", f"{a.eval}/mbpp.jsonl"], a.limit)
    res = run_bench(model, tok, methods, prompts, a.max_new_tokens)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
    print(markdown_table(res))
    for name in ("scheduler-before", "scheduler-after"):
        for ds in ("gsm8k", "mbpp"):
            e = res["methods"][name][ds]
            print(f"{name} {ds}: drafted {e['drafted_rounds']}/{e['rounds']} rounds, drafter "
                  f"{1000 * e['draft_time_s'] / max(e['drafted_rounds'], 1):.1f} ms per drafted round, "
                  f"verify lengths {e['verify_lengths']}")


if __name__ == "__main__":
    main()
