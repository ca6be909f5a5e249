"""`hf-dspark data`: regenerate answers to training prompts with the target itself.

The drafter must learn the target's own distribution, so original answers are discarded and each prompt
is answered by the target through its chat template, N times per prompt for a source given as `path:N`
(answer 0 greedy, the others sampled at temperature 0.7, top-p 0.9 by default), by the continuous-batching
sampler (`sampler.py`). Output is a folder of shards `part-NNNNN.jsonl.gz`, one JSON line per answer:
{"id": "<file stem>:<line>#<k>", "temperature", "top_p", "prompt_ids", "response_ids"}; `prompt_ids` is the
templated prompt (ending with the assistant header) and `response_ids` the generated tokens up to and
including EOS when one was produced. Runs are resumable: answers already in the folder are skipped.
"""

from __future__ import annotations

import gzip
import json
import random
import re
import shutil
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..io import prompts
from ..io.loading import load_target
from .sampler import Job, answer, by_length_in_windows
from .signals import StopSignal

GSM8K_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def normalize(text: str) -> str:
    """Key used to compare training prompts with evaluation prompts (suffix and whitespace ignored)."""
    text = text.replace(GSM8K_SUFFIX, "")
    return re.sub(r"\s+", " ", text).strip().lower()


def answer_prompts(path: str | Path, suffix: str | None = None) -> list[dict]:
    """A prompt file (io.prompts) → [{"id": "<file stem>:<line>", "prompt": prompt (+ suffix)}]; GSM8K files get
    the evaluation's reasoning suffix unless `suffix` says otherwise."""
    path = Path(path)
    if suffix is None:
        suffix = GSM8K_SUFFIX if "gsm8k" in path.name.lower() else ""
    return [{"id": key, "prompt": text if not suffix or text.endswith(suffix) else text + suffix}
            for key, text in prompts.read_prompts(path)]


def eval_keys(paths: list[str | Path]) -> set[str]:
    """The evaluation prompts of `paths` (prompt files, io.prompts: the prompts the package ever reads) as
    `normalize` keys."""
    return {normalize(text) for p in paths for _, text in prompts.read_prompts(p)}


def check_excluded(prompts: list[dict], exclude: list[str | Path]) -> None:
    """Refuse (ValueError) training prompts that also appear in an evaluation file."""
    if not exclude:
        return
    keys = eval_keys(exclude)
    leaked = [p["id"] for p in prompts if normalize(p["prompt"]) in keys]
    if leaked:
        raise ValueError(
            f"{len(leaked)} training prompts also appear in the evaluation file(s) {list(map(str, exclude))}, "
            f"e.g. {leaked[:5]}; remove them from the training set (never train on evaluation prompts)"
        )


def is_holdout(prompt_id: str) -> bool:
    """1 prompt in 20 (by a stable hash of its id) is never answered for training: calibration's held-out mix."""
    return zlib.crc32(prompt_id.encode()) % 20 == 0


def read_answers(path: str | Path) -> Iterator[dict]:
    """Answer records from a shard folder (`part-*.jsonl.gz` and the open `part-*.jsonl`), or one .jsonl/.jsonl.gz.

    A line cut by an interrupted write is skipped (that answer is simply redone on resume).
    """
    path = Path(path)
    files = sorted(path.glob("part-*.jsonl*")) if path.is_dir() else [path] if path.exists() else []
    for file in files:
        opener = gzip.open if file.suffix == ".gz" else open
        with opener(file, "rt") as f:
            for line in f:
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    pass


def done_ids(path: str | Path) -> set[str]:
    """Keys of the answers already in `path` (`"<file stem>:<line>#<sample>"`; old files: `"<stem>:<line>"`)."""
    return {r["id"] for r in read_answers(path) if "id" in r}


def prompt_of(answer_id: str) -> str:
    """`"gsm8k_train:12#3"` → `"gsm8k_train:12"` (the prompt an answer belongs to)."""
    return answer_id.split("#", 1)[0]


def source_of(answer_id: str) -> str:
    """`"gsm8k_train:12#3"` → `"gsm8k_train"` (the prompt file an answer came from)."""
    return prompt_of(answer_id).rsplit(":", 1)[0]


def parse_source(spec: str) -> tuple[str, int]:
    """`"path.jsonl:4"` → ("path.jsonl", 4) answers per prompt; a bare path means 1."""
    path, sep, n = spec.rpartition(":")
    if sep and n.isdigit() and path:
        if int(n) < 1:
            raise ValueError(f"{spec!r}: the number of answers per prompt must be ≥ 1")
        return path, int(n)
    return spec, 1


def plan(sources: list[str], exclude: list[str | Path] = (), seed: int = 0, temperature: float = 0.7,
         top_p: float = 0.9) -> list[tuple[str, dict, float]]:
    """The seeded, shuffled job list `[(answer id, prompt record, temperature)]` over `sources` (`path[:N]`).

    Answer 0 of a prompt is greedy (what greedy decoding is verified against), answers 1..N-1 are sampled at
    `temperature`/`top_p`; held-out prompts (`is_holdout`) are left out. The shuffle mixes the sources evenly,
    so a run stopped at any point holds every source in its planned share.
    """
    jobs = []
    for spec in sources:
        path, copies = parse_source(spec)
        prompts = [p for p in answer_prompts(path) if not is_holdout(p["id"])]
        check_excluded(prompts, list(exclude))
        jobs += [(f"{p['id']}#{k}", p, 0.0 if k == 0 else temperature) for p in prompts for k in range(copies)]
    random.Random(seed).shuffle(jobs)
    return jobs


def _drop_partial_line(path: Path) -> None:
    """A job killed mid-write leaves a line without its newline; appending to it would spoil the next answer too."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


class ShardWriter:
    """Appends answers to `<dir>/part-NNNNN.jsonl`; every `shard_size` answers that file is gzipped and closed.

    Finished shards never change again (commit them as they come); the open one is read back on resume.
    """

    def __init__(self, folder: str | Path, shard_size: int = 1000):
        self.folder, self.shard_size = Path(folder), shard_size
        self.folder.mkdir(parents=True, exist_ok=True)
        closed = sorted(self.folder.glob("part-*.jsonl.gz"))
        self.index = int(closed[-1].name[5:10]) + 1 if closed else 0
        self.count = sum(1 for _ in read_answers(self._open_path())) if self._open_path().exists() else 0
        _drop_partial_line(self._open_path())
        self.file = open(self._open_path(), "a")

    def _open_path(self) -> Path:
        return self.folder / f"part-{self.index:05d}.jsonl"

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self.file.flush()
        self.count += 1
        if self.count >= self.shard_size:
            self.seal()

    def seal(self) -> None:
        """Gzip the open shard (if it holds anything) and start the next one."""
        self.file.close()
        path = self._open_path()
        if self.count:
            with open(path, "rb") as src, gzip.open(path.with_suffix(".jsonl.gz"), "wb") as dst:
                shutil.copyfileobj(src, dst)
            path.unlink()
            self.index, self.count = self.index + 1, 0
        self.file = open(self._open_path(), "a")

    def close(self) -> None:
        self.file.close()


def run(sources: list[str], output: str, exclude: list[str] = (), limit: int | None = None, seed: int = 0,
        slots: int = 128, max_new_tokens: int = 256, temperature: float = 0.7, top_p: float = 0.9,
        dtype: str = "bfloat16", threads: int | None = None, model_path: str | None = None,
        shard_size: int = 1000) -> tuple[int, bool]:
    """Answer the planned jobs not yet in the shard folder `output` → (answers written, whether a SIGINT/SIGTERM
    stopped the run early; rerunning resumes it)."""
    if threads:
        torch.set_num_threads(threads)
    jobs = plan(sources, exclude, seed, temperature, top_p)[:limit]
    skip = done_ids(output)
    model, tok = load_target(model_path, getattr(torch, dtype), "cpu")
    todo = [Job(key, prompts.chat_ids(tok, p["prompt"]), temp, top_p) for key, p, temp in jobs if key not in skip]
    todo = by_length_in_windows(todo, 8 * slots)  # rows of similar length waste less attention and prefill padding
    eos = eos_ids(model)
    writer = ShardWriter(output, shard_size)
    bar = tqdm(total=len(todo), desc="answers", unit="ans")
    written, tokens, t0 = 0, 0, time.perf_counter()
    with StopSignal() as stop:  # SIGINT/SIGTERM: stop after the answer in hand, every written one kept
        try:
            for job, resp in answer(model, todo, eos, max_new_tokens, slots=slots, prefill_batch=max(1, slots // 8),
                                    seed=seed + len(skip)):
                writer.write({"id": job.key, "temperature": job.temperature,
                              "top_p": job.top_p if job.temperature else None, "dtype": dtype,
                              "prompt_ids": job.prompt_ids, "response_ids": resp})
                written, tokens = written + 1, tokens + len(resp)
                bar.update(1)
                bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - t0):.0f}", tokens=tokens)
                if stop.received:
                    break
        finally:
            writer.close()
            bar.close()
    return written, stop.received


def eos_ids(model) -> list[int]:
    """The model's EOS token ids as a list (generation_config holds an int, a list or None)."""
    eos = model.generation_config.eos_token_id
    return [] if eos is None else list(eos) if isinstance(eos, (list, tuple)) else [eos]

