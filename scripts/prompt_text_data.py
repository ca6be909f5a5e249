"""Extra drafter-training records from prompt *text* (self-distillation on the target's own next-token law).

Target-regenerated answers are the best data but cost a full generation each (~20-90 tok/s on a shared 2-core
CPU). Any text gives the L1 term its real signal — the target's distribution at every position, computed on
the fly by `hf-dspark train` — so the train prompts themselves, rendered as user turns, are cheap extra data.
Output records have the `hf-dspark data` layout, with the user turn as the "response" (the loss mask).

    .venv/bin/python scripts/prompt_text_data.py data/prompts/train/*.jsonl -o out/data/prompt_text.jsonl \
        --exclude data/prompts/eval/gsm8k.jsonl data/prompts/eval/mbpp.jsonl
"""

import argparse
import json
from pathlib import Path

from hf_dspark.io.loading import default_target_path

SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("prompts", nargs="+")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--exclude", nargs="*", default=[])
    a = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_target_path())
    banned = {json.loads(l)["turns"][0].strip() for f in a.exclude for l in Path(f).read_text().splitlines() if l.strip()}
    head = tok("<|im_start|>user\n", add_special_tokens=False)["input_ids"]
    n = 0
    with open(a.output, "w") as out:
        for f in a.prompts:
            for i, line in enumerate(Path(f).read_text().splitlines()):
                text = json.loads(line)["turns"][0]
                if "gsm8k" in Path(f).stem:
                    text += SUFFIX
                if text.strip() in banned or text.replace(SUFFIX, "").strip() in banned:
                    continue
                body = tok(text + "<|im_end|>\n", add_special_tokens=False)["input_ids"]
                out.write(json.dumps({"id": f"text:{Path(f).stem}:{i}", "prompt_ids": head, "response_ids": body}) + "\n")
                n += 1
    print(f"wrote {n} records to {a.output}")


if __name__ == "__main__":
    main()
