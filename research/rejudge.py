"""Re-judge the greedy mismatches of a bf16/fp16 `hf-dspark bench` run with the float32 referee (referee.py).

    python research/rejudge.py out/bf16_gsm8k/results.json data/prompts/eval/gsm8k.jsonl [--tolerance 0.5]

Rows that carry their output ("tokens") are judged as they are. DSpark rows of runs made before the bench stored
outputs are rebuilt from their rounds: the prefill's token (recomputed in the run's dtype, as `generate` computed
it) and then each round's committed tokens. Plain's output is needed only up to its first difference, which the
run recorded ("divergence"). Rows that can be neither are counted as not judged. Prints one line per method and
writes rejudge.json next to the results.
"""

import argparse
import json
from pathlib import Path

import torch

from hf_dspark.eval.bench import load_prompts
from hf_dspark.io.prompts import chat_inputs
from hf_dspark.eval.referee import TIE_TOLERANCE, judge_divergence
from hf_dspark.io.loading import DTYPES, load_target


def output_tokens(row: dict, ids: torch.Tensor, model) -> list[int] | None:
    """A greedy bench row's new tokens: stored ("tokens"), or for DSpark rows of runs made before outputs were
    stored, rebuilt from the rounds (the prefill's token, recomputed with `model` as generate did, then each
    round's committed tokens). None for other rows of such runs."""
    if "tokens" in row:
        return row["tokens"]
    if not row.get("rounds"):
        return None
    with torch.no_grad():
        first = int(model(ids).logits[0, -1].argmax())
    out = [first] + [t for r in row["rounds"] for t in r["new_tokens"]]
    assert len(out) == row["new_tokens"], f"prompt {row['prompt']}: the rounds do not rebuild the output"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("prompts", help="the JSONL prompt file of the run's set")
    ap.add_argument("--tolerance", type=float, default=TIE_TOLERANCE)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    res = json.loads(args.results.read_text())
    name = Path(args.prompts).stem
    rows = [r for r in res["rows"] if r["dataset"] == name and "divergence" in r]
    model, tok = load_target(None, DTYPES[res["environment"]["dtype"]], "cpu")
    referee = load_target(None, torch.float32, "cpu")[0]
    texts = dict(enumerate(t for _, t in load_prompts([args.prompts], None)))
    index = sorted({r["prompt"] for r in res["rows"] if r["dataset"] == name})
    verdicts: dict[str, list] = {}
    for r in rows:
        ids = chat_inputs(tok, texts[index.index(r["prompt"])])["input_ids"]
        out = output_tokens(r, ids, model)
        if out is None:
            verdicts.setdefault(r["method"], []).append(None)
            continue
        d = r["divergence"]
        plain = torch.cat([ids, torch.tensor([out[: d["position"]] + [d["plain_token"]]])], dim=-1)
        v = judge_divergence(plain, torch.cat([ids, torch.tensor([out])], dim=-1), ids.shape[1], referee, args.tolerance)
        verdicts.setdefault(r["method"], []).append(dict(v, prompt=r["prompt"]))
    for method, vs in verdicts.items():
        judged = [v for v in vs if v is not None]
        bad = [v["prompt"] for v in judged if not v["near_tie"]]
        print(f"{method}: {len(vs)} mismatches, {len(vs) - len(judged)} not judged (output not stored); "
              f"{len(judged) - len(bad)} near-ties, failures {bad}; largest gap "
              f"{max((v.get('max_gap', 0) for v in judged), default=0):.3f}, off-argmax positions "
              f"{sum(v.get('off_argmax', 0) for v in judged)}")
    out = args.results.with_name("rejudge.json")
    out.write_text(json.dumps({"tolerance": args.tolerance, "verdicts": verdicts}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
