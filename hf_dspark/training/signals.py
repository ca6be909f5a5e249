"""Stopping a long job cleanly: SIGTERM or SIGINT sets a flag the job checks between units of work; a training run
also stops before a step that would pass its time limit (`must_stop`)."""

from __future__ import annotations

import signal
import threading
import time

import torch


class StopSignal:
    """Within the block, SIGTERM and SIGINT set `received` instead of killing the process: the job finishes its unit of
    work (a training step, an answer), saves and returns. Installed explicitly, so a job started in the background
    (where SIGINT is inherited as ignored) stops on it too. A second signal acts as the handler before did."""

    def __init__(self):
        self.received, self._old = False, {}

    def __enter__(self) -> "StopSignal":
        if threading.current_thread() is threading.main_thread():  # only the main thread may install handlers
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.received = True
        signal.signal(signum, self._old.pop(signum))

    def __exit__(self, *exc) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._old.clear()


def must_stop(acc, t0: float, steps_done: int, limit_min: float | None, signalled: bool) -> bool:
    """Before the next step of a run started at `t0` (perf_counter) under accelerator `acc`: a stop signal arrived,
    or the next step would pass the time limit (every process agrees, so all of them save the same step)."""
    elapsed = time.perf_counter() - t0
    late = bool(limit_min) and elapsed + elapsed / max(1, steps_done) > 60 * limit_min
    if acc.num_processes == 1:
        return signalled or late
    # a signal may reach one process only; one scalar all-reduce a step is small beside the gradients' own
    return bool(acc.reduce(torch.tensor(float(signalled or late), device=acc.device), "max") > 0)
