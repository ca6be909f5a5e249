"""The demo's own race (demo.session.race: DSpark, then plain generate, each timed alone) with the demo's models,
loop and warm-up as `hf-dspark demo` starts them, on its example prompt, the blog-post prompt of issue 38, the
README's GSM8K prompt and two chat prompts; greedy, default controls (scheduler + gate, n-gram drafts).

    .venv/bin/python research/demo_race.py [loop=auto] [max_new_tokens=64] [races=3]
"""
import statistics
import sys

import torch

from hf_dspark.demo.app import EXAMPLE, warm_up
from hf_dspark.demo.models import load_demo_models, use_loop
from hf_dspark.demo.session import MAX_PROMPT_TOKENS, demo_inputs, on_compute_thread, race

torch.set_num_threads(2)
loop = sys.argv[1] if len(sys.argv) > 1 else "auto"
new = int(sys.argv[2]) if len(sys.argv) > 2 else 64
races = int(sys.argv[3]) if len(sys.argv) > 3 else 3
models = on_compute_thread(load_demo_models)  # as the app: all torch work on its compute thread
on_compute_thread(use_loop, models, loop, MAX_PROMPT_TOKENS + 256)  # the page's longest request
on_compute_thread(warm_up, models)
print(models.info[-1])
prompts = [EXAMPLE,
           "Write a short, upbeat blog post about a weekend trip to the mountains.",
           "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
           "clips did Natalia sell altogether in April and May?",
           "What are some tips for staying productive when working from home?",
           "I want you to act as a travel guide. Suggest three places to visit in Lisbon."]
drafter = models.drafters["Markov"]
for text in prompts:
    inputs = demo_inputs(models.tokenizer, text, models.target.device)
    ratios, same, taus = [], True, []
    for _ in range(races):
        dspark, plain = race(models.target, inputs, dict(max_new_tokens=new, do_sample=False), drafter, "auto", True)
        ratios.append((len(dspark.recorder.ids) / dspark.elapsed) / (len(plain.recorder.ids) / plain.elapsed))
        same &= torch.equal(dspark.output, plain.output)
        taus.append(dspark.stats.tau)
    print(f"{text[:50]!r:54} races {' '.join(f'{r:.2f}x' for r in ratios)} median {statistics.median(ratios):.2f}x "
          f"tau {statistics.median(taus):.2f} loop {dspark.stats.loop} identical {same}", flush=True)
