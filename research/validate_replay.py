"""Check `hf-dspark replay` against real `generate` rounds on SmolLM2: for every (prompt, drafter) of a saved
greedy `hf-dspark bench` results.json, replay the output that generate committed and compare the rounds'
(accepted, committed) one by one.

    .venv/bin/python research/validate_replay.py out/bench_greedy/results.json --ablation out/dflash_pruned \
        --limit 8 --max-new-tokens 128
"""

import argparse
import json

import torch

from hf_dspark.eval.bench import load_prompts
from hf_dspark import DSparkDrafter
from hf_dspark.io.loading import load_default_drafter, load_default_target
from hf_dspark.eval.replay import slot_scores, walk

ap = argparse.ArgumentParser()
ap.add_argument("results")
ap.add_argument("--ablation")
ap.add_argument("--limit", type=int, default=8)
ap.add_argument("--max-new-tokens", type=int, default=128)
ap.add_argument("--eval", default="data/prompts/eval")
args = ap.parse_args()
torch.set_num_threads(1)
model, tok = load_default_target(dtype=torch.float32)
drafters = {"dspark": load_default_drafter(model)}
if args.ablation:
    drafters["dflash-ablation"] = DSparkDrafter.from_pretrained(args.ablation, target=model)
rows = json.load(open(args.results))["rows"]
prompts = load_prompts([f"{args.eval}/gsm8k.jsonl", f"{args.eval}/mbpp.jsonl"], args.limit)
same = diff = 0
for name, dr in drafters.items():
    for i, (_, text) in enumerate(prompts):
        row = next(r for r in rows if r["prompt"] == i and r["method"] == name)
        pids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                       return_tensors="pt", return_dict=True)["input_ids"]
        with torch.no_grad():  # the prefill's token is not in the rounds
            first = model(pids).logits[0, -1].argmax().item()
        resp = [first] + [t for r in row["rounds"] for t in r["new_tokens"]]
        P = pids.shape[1]
        s = slot_scores(dr, pids[0].tolist(), resp)
        mine = [(r.accepted, r.committed) for r in
                walk(lambda a, j: bool(s["match"][a - P, j]), P, P + len(resp), args.max_new_tokens, dr.config.block_size)]
        real = [(r["accepted"], r["committed"]) for r in row["rounds"]]
        same, diff = same + (mine == real), diff + (mine != real)
        print(f"{name} prompt {i}: generate τ {sum(c for _, c in real) / len(real):.3f}, replay τ "
              f"{sum(c for _, c in mine) / len(mine):.3f}, rounds {'identical' if mine == real else 'DIFFERENT'}")
print(f"identical {same}, different {diff}")
raise SystemExit(1 if diff else 0)
