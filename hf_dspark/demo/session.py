"""One demo generation: request limits, the verify policy from the controls, and generate() on the demo's compute
thread, whose progress is polled (a streamer for the committed tokens, `drafter.last_stats.rounds` for the fates).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field

import torch
from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from ..io import prompts

MAX_PROMPT_CHARS = 2000
MAX_PROMPT_TOKENS = 512
MAX_NEW_TOKENS = 256

# All of the demo's torch work (loading, warm-up, profiles, every generate) runs on one thread. libgomp, torch's
# OpenMP, cuts its threads' spin-wait to almost nothing once it manages more threads than there are CPUs, so a
# generate() on a fresh thread while the loading thread still holds its OpenMP team runs its small parallel regions
# up to 2x slower on a 2-CPU machine: DSpark's rounds more than plain steps (docs/demo.md).
_COMPUTE: list = []  # [(executor, thread id)] once started
_COMPUTE_LOCK = threading.Lock()


def _compute() -> tuple[ThreadPoolExecutor, int]:
    """(the compute thread's executor, its thread id), started on first use; the lock keeps two first callers
    (handler threads) from starting two."""
    with _COMPUTE_LOCK:
        if not _COMPUTE:
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-dspark-compute")
            _COMPUTE.append((pool, pool.submit(threading.get_ident).result()))
        return _COMPUTE[0]


def on_compute_thread(fn, *args, **kwargs):
    """fn(*args, **kwargs) run on the demo's compute thread (directly if already there); returns its result."""
    pool, ident = _compute()
    if threading.get_ident() == ident:
        return fn(*args, **kwargs)
    return pool.submit(fn, *args, **kwargs).result()


@dataclass
class Request:
    prompt: str
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    block: int = 7  # drafts the verifier may see per round (≤ the drafter's γ)
    scheduler: bool = True  # the library's default policy ("auto": scheduler + draft gate on the device profile)
    head: str = "Markov"
    ngram: bool = True  # DecodingOptions.ngram_drafts (the library's default): copy drafts where the context repeats


def check_request(req: Request, block_size: int, max_new_tokens: int = MAX_NEW_TOKENS) -> Request:
    """Validate and clamp what a browser (or the API) sent; raises ValueError with a user-facing reason."""
    if not isinstance(req.prompt, str) or not req.prompt.strip():
        raise ValueError("Type a prompt first.")
    if len(req.prompt) > MAX_PROMPT_CHARS:
        raise ValueError(f"The prompt is {len(req.prompt)} characters; the limit is {MAX_PROMPT_CHARS}.")
    req.max_new_tokens = max(1, min(int(req.max_new_tokens), max_new_tokens))
    req.temperature = max(0.0, min(float(req.temperature), 2.0))
    req.top_p = max(0.05, min(float(req.top_p), 1.0))
    req.block = max(0, min(int(req.block), block_size))
    return req


def policy_for(req: Request, drafter, profile_fn=None):
    """(a DecodingOptions.verify_policy value, readable description, note or '') for the controls.

    With the scheduler box and the full block: the library's default policy, "auto" (the scheduler and its draft
    gate on the device profile; without a confidence head, the profile's reach behind the same gate). Block
    size below γ verifies at most that many drafts; the scheduler (needs a confidence head) picks ℓ from c_k and
    may verify fewer. Both rules look only at c_1..c_k, so their min stays lossless."""
    gamma = drafter.config.block_size
    if req.scheduler and req.block >= gamma:
        if profile_fn:
            profile_fn(drafter)  # measured before generate, so not in its timing
        return "auto", "scheduler + draft gate (default)", ""
    if req.scheduler and drafter.confidence_head is None:
        note = "this drafter has no confidence head: scheduler off"
        return req.block, f"static ℓ={req.block}", note
    if not req.scheduler:
        return ("all" if req.block >= gamma else req.block), f"static ℓ={req.block}", ""
    profile = profile_fn(drafter) if profile_fn else None  # measured before generate, so not in its timing
    if profile is None:
        return req.block, f"static ℓ={req.block}", "no device profile: scheduler off"
    cap, sampled = req.block, req.temperature > 0
    return (lambda conf: min(cap, profile.verify_length(conf, sampled))), f"scheduler, ℓ ≤ {cap}", ""


def demo_inputs(tok, prompt: str, device) -> dict:
    """generate() inputs for a demo prompt (io.prompts.chat_inputs), refused past MAX_PROMPT_TOKENS."""
    inputs = prompts.chat_inputs(tok, prompt, device)
    if inputs["input_ids"].shape[1] > MAX_PROMPT_TOKENS:
        raise ValueError(f"The prompt is {inputs['input_ids'].shape[1]} tokens; the limit is {MAX_PROMPT_TOKENS}.")
    return inputs


def sampling_kwargs(req: Request) -> dict:
    if req.temperature <= 0:
        return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    return {"do_sample": True, "temperature": req.temperature, "top_p": req.top_p, "top_k": None}


class Recorder(BaseStreamer):
    """A transformers streamer that keeps the generated ids (the first put is the prompt) and when they came."""

    def __init__(self):
        self.puts = 0
        self.ids: list[int] = []
        self.first_ids: list[int] = []  # the target's prefill token(s): committed before any DSpark round
        self.done = False

    def put(self, value):
        self.puts += 1
        if self.puts == 1:
            return  # the prompt
        ids = value.reshape(-1).tolist()
        if self.puts == 2:
            self.first_ids = ids
        self.ids.extend(ids)

    def end(self):
        self.done = True


@dataclass
class Progress:
    recorder: Recorder
    stats: object | None  # DSparkStats of this run, once the candidate generator exists
    elapsed: float  # seconds so far; once done, the generate() call's own time (what the race compares)
    done: bool
    output: torch.Tensor | None = None
    error: BaseException | None = None
    rounds: list = field(default_factory=list)  # a snapshot of stats.rounds


def stream_generate(model, inputs: dict, gen_kwargs: dict, drafter=None, policy="all", poll: float = 0.15,
                    lock: threading.Lock | None = None, ngram: bool = False, live: bool = True) -> Iterator[Progress]:
    """Run generate (with `drafter` as assistant under verify `policy` and `ngram` drafts, or plain) on the compute
    thread; yield a Progress every `poll` s (only if `live`) and once at the end, whose `elapsed` is the generate()
    call's own time, timed on that thread. A race runs both sides with live=False: rendering while the other side
    decodes would tax whichever side shows more. `lock` serialises generations on one model: the drafter's last_stats
    are per model. If the consumer goes away (a closed browser tab), the run is cancelled."""
    rec, cancel = Recorder(), _Cancel()
    box: dict = {}

    def work():
        try:
            kw = dict(gen_kwargs, streamer=rec, stopping_criteria=StoppingCriteriaList([cancel]))
            if drafter is not None:
                kw.update(assistant_model=drafter, dspark_options=dataclasses.replace(
                    drafter.options, verify_policy=policy, ngram_drafts=ngram))
            t = time.perf_counter()
            with torch.no_grad():
                box["out"] = model.generate(**inputs, **kw)
            box["seconds"] = time.perf_counter() - t
        except BaseException as e:  # noqa: BLE001 -- shown to the user, not lost in the thread
            box["error"] = e
        finally:
            rec.done = True

    pool, ident = _compute()
    if threading.get_ident() == ident:
        raise RuntimeError("stream_generate polls the compute thread: call it from another thread")
    with lock or _NoLock():
        if drafter is not None:
            drafter.last_stats = None  # so the poller can tell this run's stats from the previous one's
        t0 = time.perf_counter()
        job = pool.submit(work)
        try:
            while not job.done():
                wait_for([job], timeout=poll if live else None)
                if not job.done():
                    stats = drafter.last_stats if drafter is not None else None
                    rounds = list(stats.rounds) if stats is not None else []
                    yield Progress(rec, stats, time.perf_counter() - t0, False, rounds=rounds)
            elapsed = box.get("seconds", time.perf_counter() - t0)
            stats = drafter.last_stats if drafter is not None else None
            yield Progress(rec, stats, elapsed, True, box.get("out"), box.get("error"),
                           rounds=list(stats.rounds) if stats is not None else [])
        finally:
            cancel.stop = True  # no-op after a normal end; stops an abandoned run at its next round
            wait_for([job])


def race(model, inputs: dict, gen_kwargs: dict, drafter, policy, ngram: bool,
         lock: threading.Lock | None = None) -> tuple[Progress, Progress]:
    """(DSpark's final Progress, plain generate's) on the same request, DSpark first, each timed alone on the compute
    thread with nothing rendered meanwhile (live=False): the tokens/s the demo shows for either run is the one
    the race compares."""
    dspark = list(stream_generate(model, inputs, gen_kwargs, drafter=drafter, policy=policy, lock=lock,
                                  ngram=ngram, live=False))[-1]
    plain = list(stream_generate(model, inputs, gen_kwargs, lock=lock, live=False))[-1]
    return dspark, plain


class _Cancel(StoppingCriteria):
    def __init__(self):
        self.stop = False

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), self.stop, dtype=torch.bool, device=input_ids.device)


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
