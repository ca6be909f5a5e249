"""What the browser tests share: Debian's Chromium, and app.py served on a free local port until the test ends."""

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
ROOT = Path(__file__).resolve().parents[2]
needs_chromium = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                    reason=f"{CHROMIUM} not installed (apt-get install -y chromium)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served_app(args: list[str], log: Path, wait_s: float):
    """Run `app.py *args` on 127.0.0.1 (offline) → its URL once it answers; stopped on exit. Fails the test with
    the app's log if it exits or does not serve within `wait_s` seconds."""
    port = _free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", GRADIO_SSR_MODE="false",
               PYTHONUNBUFFERED="1")
    cmd = [sys.executable, str(ROOT / "app.py"), *args, "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.time() + wait_s
        while True:
            if proc.poll() is not None:
                pytest.fail(f"app.py exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                pytest.fail(f"app.py did not serve {url} in time:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
