"""Turn `hf-dspark bench` results into what docs/ keeps: compact JSONs and one plot over several runs.

    python research/bench_docs.py out/big_gsm8k/results.json out/big_mbpp/results.json \
        --compact docs/results/bench_amd_100x256_{}.json --plot docs/results/bench_amd_100x256.png

--compact writes each run without its per-round rows and output tokens (tens of MB at 100 × 256), keeping one
row per prompt and method (seconds, new tokens, identity and divergence, rounds, drafted rounds, accepted
drafts); `{}` is replaced by the run's dataset names. --plot draws `bench.plot` over the runs' datasets side
by side (the acceptance panel shows the first run's datasets pooled).
"""

import argparse
import json
from pathlib import Path

from hf_dspark.eval.bench import plot


def compact(res: dict) -> dict:
    rows = []
    for r in res["rows"]:
        d = {k: r[k] for k in ("prompt", "dataset", "method", "seconds", "new_tokens")}
        for k in ("identical", "divergence"):
            if k in r:
                d[k] = r[k]
        if r["rounds"] is not None:
            d["rounds"] = len(r["rounds"])
            d["drafted_rounds"] = sum(1 for x in r["rounds"] if x["drafted"])
            d["accepted"] = sum(x["accepted"] for x in r["rounds"])
        rows.append(d)
    return dict(res, rows=rows, note="per-round rows dropped; one row per prompt and method")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", nargs="+", help="results.json files of `hf-dspark bench` runs")
    p.add_argument("--compact", help="output path pattern; {} = the run's dataset names joined by '_'")
    p.add_argument("--plot", help="one PNG over all runs' datasets")
    args = p.parse_args()
    runs = [json.loads(Path(f).read_text()) for f in args.results]
    if args.compact:
        for res in runs:
            name = "_".join(s for s in next(iter(res["methods"].values())) if s != "all")
            Path(args.compact.format(name)).write_text(json.dumps(compact(res), indent=1))
    if args.plot:
        methods = {}
        for name in runs[0]["methods"]:
            entry = {"all": runs[0]["methods"][name]["all"]}
            for res in runs:
                entry.update({s: e for s, e in res["methods"][name].items() if s != "all"})
            methods[name] = entry
        plot({"methods": methods}, Path(args.plot))


if __name__ == "__main__":
    main()
