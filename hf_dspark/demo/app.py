"""DSpark live demo (Gradio): watch the drafter draft, the scheduler trim and the target verify, token by token.

    hf-dspark demo                 # embedded SmolLM2 target + shipped drafter (untrained fallback, with a notice)
    python app.py --tiny           # (the repository's app.py) tiny seeded models, no download (the browser test)
    python app.py --target DIR --drafter DIR [--drafter-none DIR]

Runs unchanged as a Hugging Face Space through the repository's app.py (see docs/demo.md). Rendering lives in
render.py, the compute thread and generation in session.py, model loading in models.py; this file wires.
"""

from __future__ import annotations

import os
import threading

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr
import torch

from . import render as view
from .models import HEAD_LABELS, load_demo_models, use_loop
from .session import (
    MAX_PROMPT_CHARS,
    MAX_PROMPT_TOKENS,
    Request,
    check_request,
    demo_inputs,
    on_compute_thread,
    policy_for,
    race,
    sampling_kwargs,
    stream_generate,
)

EXAMPLE = "Explain speculative decoding in two sentences."


def build(models, max_new_tokens: int) -> gr.Blocks:
    tok, target = models.tokenizer, models.target
    gamma = next(d for d in models.drafters.values() if d is not None).config.block_size
    lock = threading.Lock()  # one generation at a time on this model (the queue also enforces it)
    profiles: dict = {}

    def decode(i: int) -> str:
        return tok.decode([i], skip_special_tokens=False)

    def profile_for(drafter):  # measured once per drafter (seconds), then cached on disk by decoding/profile.py
        if id(drafter) not in profiles:  # the profile of the loop its calls run on ("auto" resolved)
            profiles[id(drafter)] = on_compute_thread(drafter.options.profile_for, target, drafter)
        return profiles[id(drafter)]

    def drafter_for(req: Request):
        drafter = models.drafters.get(req.head) or models.drafters["Markov"]
        policy, desc, note = policy_for(req, drafter, profile_for)
        return drafter, policy, desc + (" + n-gram drafts" if req.ngram else ""), note

    def inputs_for(req: Request):
        return demo_inputs(tok, req.prompt, target.device), dict(max_new_tokens=req.max_new_tokens,
                                                                  **sampling_kwargs(req))

    def shown(req: Request, p, desc: str, note: str):
        """(answer html, stats html) of a DSpark Progress."""
        if p.error is not None:
            raise gr.Error(f"generation failed: {type(p.error).__name__}: {p.error}")
        fates = view.classify(p.recorder.first_ids, p.rounds, req.block)
        n = len(view.committed_ids(fates))
        return (view.answer_html(req.prompt, fates, decode, p.done, note),
                view.stats_html(p.stats, n, p.elapsed, req.block, desc))

    def request(prompt, max_new, temperature, top_p, block, scheduler, head, ngram) -> Request:
        try:
            return check_request(Request(prompt, max_new, temperature, top_p, block, scheduler, head, ngram), gamma,
                                 max_new_tokens)
        except ValueError as e:
            raise gr.Error(str(e))

    def on_generate(*controls):
        req = request(*controls)
        drafter, policy, desc, note = drafter_for(req)
        inputs, gen = inputs_for(req)
        for p in stream_generate(target, inputs, gen, drafter=drafter, policy=policy, lock=lock, ngram=req.ngram):
            yield (*shown(req, p, desc, note), "")

    def on_race(*controls):
        """session.race: DSpark, then plain generate, each timed alone; the stats panel's tokens/s and the race
        line are the same measurement."""
        req = request(*controls)
        drafter, policy, desc, note = drafter_for(req)
        inputs, gen = inputs_for(req)
        yield view.legend_html(), "", '<div class="dspark-race">racing: DSpark, then plain generate…</div>'
        dspark, plain = race(target, inputs, gen, drafter, policy, req.ngram, lock)
        answer, stats = shown(req, dspark, desc, note)
        if plain.error is not None:
            raise gr.Error(f"plain generate failed: {plain.error}")
        same = None if req.temperature > 0 else torch.equal(plain.output, dspark.output)
        line = view.race_html(len(dspark.recorder.ids) / dspark.elapsed, len(plain.recorder.ids) / plain.elapsed, same)
        yield answer, stats, line + view.plain_html(tok.decode(plain.recorder.ids, skip_special_tokens=True), True)

    with gr.Blocks(title="DSpark speculative decoding") as demo:
        gr.Markdown(f"## DSpark speculative decoding, live\n{view.esc(models.description)}. Each answer token is "
                    "coloured by its fate; hover a token for its round, position and predicted survival c vs outcome.")
        for note in models.notes:
            gr.HTML(f'<div class="untrained">{view.esc(note)}</div>')
        with gr.Row():
            with gr.Column(scale=2):
                prompt = gr.Textbox(label=f"Prompt (≤ {MAX_PROMPT_CHARS} characters)", value=EXAMPLE, lines=3,
                                    max_lines=8, max_length=MAX_PROMPT_CHARS, elem_id="prompt")
                with gr.Row():
                    go = gr.Button("Generate", variant="primary", elem_id="generate-btn")
                    race_btn = gr.Button("Race vs plain generate", elem_id="race-btn")
                temperature = gr.Slider(0, 1.5, value=0.0, step=0.05, label="temperature (0 = greedy)")
                top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="top-p")
                max_new = gr.Slider(1, max_new_tokens, value=min(64, max_new_tokens), step=1, label="max new tokens")
                block = gr.Slider(0, gamma, value=gamma, step=1,
                                  label=f"block size: drafts verified per round (drafter's γ = {gamma})")
                # Both start as the library's defaults (DecodingOptions()): what a user of generate() gets.
                scheduler = gr.Checkbox(value=True, elem_id="scheduler",
                                        label="scheduler + draft gate (choose ℓ from c_k and the device profile; "
                                              "plain steps where drafting does not pay)")
                ngram = gr.Checkbox(value=True, elem_id="ngram",
                                    label="n-gram drafts (copy from the context where its last 2-4 tokens repeat)")
                has_none = models.drafters.get("none") is not None
                head = gr.Radio(list(HEAD_LABELS), value="Markov", label="sequential head", interactive=has_none)
                for line in models.info:
                    gr.HTML(f'<div class="quiet-note">{view.esc(line)}</div>')
            with gr.Column(scale=3):
                # Pure CSS (render.CSS): folding hides discarded drafts at once, also in an answer already shown.
                gr.Checkbox(value=False, elem_id="fold-drafts", container=False,
                            label="fold rejected drafts away (read the answer as text)")
                answer = gr.HTML(view.legend_html(), elem_id="answer")
                stats = gr.HTML("", elem_id="stats")
                race_line = gr.HTML("", elem_id="race")
        controls = [prompt, max_new, temperature, top_p, block, scheduler, head, ngram]
        outputs = [answer, stats, race_line]
        # One shared concurrency group: generate and race never run at once, so no stream sees another's state.
        for trigger, fn in ((go.click, on_generate), (prompt.submit, on_generate), (race_btn.click, on_race)):
            trigger(fn, controls, outputs, concurrency_limit=1, concurrency_id="model")
    return demo


def warm_up(models) -> None:
    """One short run of each path, so the first visitor's race does not time one-off setup costs (a profile,
    compiling)."""
    inputs = models.tokenizer("Hi", return_tensors="pt").to(models.target.device)
    models.target.generate(**inputs, max_new_tokens=4, do_sample=False)
    for d in models.drafters.values():
        if d is not None:
            models.target.generate(**inputs, max_new_tokens=4, do_sample=False, assistant_model=d)


def main(args) -> None:
    if args.threads:
        on_compute_thread(torch.set_num_threads, args.threads)
    models = on_compute_thread(load_demo_models, args.target, args.drafter, args.drafter_none, args.tiny,
                               args.tiny_steps, args.device)
    on_compute_thread(use_loop, models, args.loop, MAX_PROMPT_TOKENS + args.max_new_tokens)
    on_compute_thread(warm_up, models)  # on the compiled loop, this loads (or compiles) its graph
    demo = build(models, args.max_new_tokens)
    demo.queue(max_size=args.queue_size, default_concurrency_limit=1)
    demo.launch(server_name=args.host, server_port=args.port, css=view.CSS, show_error=True)

