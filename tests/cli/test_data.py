"""`hf-dspark data` stops cleanly on SIGINT and SIGTERM, also when started in the background (SIGINT inherited as
ignored): the answer in hand is written, the shard stays valid, one line says so, and the same command resumes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hf_dspark.training.data import is_holdout, read_answers

ROOT = Path(__file__).resolve().parents[2]
N_PROMPTS = 24  # enough that the job is still answering when the signal comes (answers are written one by one)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_answer_job_and_the_same_command_resumes(folders, tmp_path, sig):
    target, _ = folders
    prompts = tmp_path / "tiny_train.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [f"abc {i} def"]}) + "\n" for i in range(N_PROMPTS)))
    out = tmp_path / "answers"
    argv = [sys.executable, "-m", "hf_dspark.cli", "-q", "data", f"{prompts}:1", "-o", str(out), "--target",
            str(target), "--slots", "1", "--max-new-tokens", "48", "--dtype", "float32", "--threads", "1"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'kernels'}", "HF_HUB_OFFLINE": "1"}
    ignore_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731  what `cmd &` gives
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=ignore_sigint)
    deadline = time.time() + 120
    while not list(read_answers(out)) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-2000:]
    assert stdout.strip().startswith("stopped by a signal: wrote") and "Traceback" not in stderr
    first = [r["id"] for r in read_answers(out)]
    planned = sum(not is_holdout(f"tiny_train:{i}") for i in range(N_PROMPTS))  # the holdout is never answered
    assert 0 < len(first) < planned and len(set(first)) == len(first)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    ids = [r["id"] for r in read_answers(out)]
    assert len(ids) == len(set(ids)) == planned and ids[: len(first)] == first
