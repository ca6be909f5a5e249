"""Stopping a long job cleanly: SIGTERM or SIGINT sets a flag the job checks between units of work."""

from __future__ import annotations

import signal
import threading


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
