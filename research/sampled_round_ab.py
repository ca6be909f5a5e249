"""The cost of a sampled round, old way against new, in one process: DSpark's own loop at T = 1 with its samplers as
they are (drafts drawn on the draft vocabulary's columns, `loop.rejection_sample` and `heads.draw` with one uniform per
token) and as they were (full-vocabulary rows, transformers' `_speculative_sampling` and `torch.multinomial`),
alternating per prompt, each call seeded by its prompt's index.

    .venv/bin/python research/sampled_round_ab.py data/prompts/eval/gsm8k.jsonl data/prompts/eval/mbpp.jsonl \
        [--limit 6] [--max-new-tokens 128] [--threads 2]

Both ways draw from the same laws but consume the random stream differently, so their rounds differ; compare
milliseconds per round and tokens per second over many calls. The first prompt is a warm-up (not counted).
"""

import argparse
import json
import subprocess
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("prompts", nargs="+")
    ap.add_argument("--limit", type=int, default=6, help="prompts per file")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from transformers.generation.utils import _speculative_sampling

    from hf_dspark.decoding import loop
    from hf_dspark.io.loading import load_target_and_drafter
    from hf_dspark.io.prompts import chat_inputs, read_prompts
    from hf_dspark.model import heads

    model, tok, drafter, _ = load_target_and_drafter(None, None, "float32", "cpu")
    new = {"rs": loop.rejection_sample, "row_wise": heads._row_wise, "draw": loop.draw}

    def old_rejection_sample(drafts, q_logits, scores):
        valid, _ = _speculative_sampling(drafts.view(1, -1), q_logits[None], drafts.shape[0], scores[None])
        return valid

    old = {"rs": old_rejection_sample, "row_wise": lambda processor: False,
           "draw": lambda z: torch.multinomial(z.softmax(-1), 1).view(-1)}

    def use(way):
        loop.rejection_sample, heads._row_wise, loop.draw = way["rs"], way["row_wise"], way["draw"]

    prompts = [p for f in a.prompts for _, p in list(read_prompts(f))[: a.limit]]
    acc = {w: dict(wall=0.0, draft=0.0, rounds=0, tokens=0) for w in ("old", "new")}
    for i, prompt in enumerate(prompts):
        inputs = chat_inputs(tok, prompt)
        for name in (("new", "old") if i % 2 == 0 else ("old", "new")):
            use(new if name == "new" else old)
            torch.manual_seed(i)
            t0 = time.perf_counter()
            out = model.generate(**inputs, assistant_model=drafter, do_sample=True, temperature=1.0,
                                 max_new_tokens=a.max_new_tokens)
            wall = time.perf_counter() - t0
            if i == 0:
                continue
            stats, s = drafter.last_stats, acc[name]
            s["wall"] += wall
            s["rounds"] += len(stats.rounds)
            s["tokens"] += out.shape[1] - inputs["input_ids"].shape[1]
            s["draft"] += sum(r.draft_time for r in stats.rounds)
    use(new)
    info = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    cpu = " ".join(fields.get(k, "?").strip() for k in ("Model name", "CPU family", "Model"))
    record = {"cpu": cpu, "threads": a.threads, "calls": len(prompts) - 1, "max_new_tokens": a.max_new_tokens,
              "loop": drafter.last_stats.loop}
    for name, s in acc.items():
        record[name] = {"tokens_per_s": s["tokens"] / s["wall"], "ms_per_round": 1e3 * s["wall"] / s["rounds"],
                        "drafter_ms_per_round": 1e3 * s["draft"] / s["rounds"], "tau": s["tokens"] / s["rounds"],
                        "rounds": s["rounds"]}
    record["new_over_old_tokens_per_s"] = record["new"]["tokens_per_s"] / record["old"]["tokens_per_s"]
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
