"""Start `python app.py` on a free port for a test (or serve a page in-process), wait until it answers, and always
stop it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def close_blocks(blocks) -> None:
    """`blocks.close()`, once more when gradio's close raced its server's event loop: it sets the loop's asyncio
    stop event from this thread, and the loop may add a waiter meanwhile ("deque mutated during iteration"); the
    second call finds the event set and closes the server."""
    try:
        blocks.close()
    except RuntimeError:
        blocks.close()


@contextmanager
def served(blocks, **launch) -> Iterator[str]:
    """Yield the URL of `blocks` (a `gr.Blocks`) launched in this process on a free port (`launch`: more of
    `launch`'s options, e.g. the page's look); always close it."""
    port = free_port()
    blocks.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **launch)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        close_blocks(blocks)


@contextmanager
def running_app(log_path: Path, seconds: float = 180, root: Path = ROOT) -> Iterator[str]:
    """Yield the URL of a freshly started `root/app.py` (real default models); its output goes to `log_path`."""
    with app_process(log_path, seconds, root) as (url, _):
        yield url


@contextmanager
def app_process(log_path: Path, seconds: float = 180, root: Path = ROOT,
                args: tuple[str, ...] = ()) -> Iterator[tuple[str, int]]:
    """Yield (URL, pid) of a freshly started `root/app.py *args` once it answers; always stop it afterwards."""
    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, str(root / "app.py"), *args, "--port", str(port)], cwd=root,
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}/"
        try:
            deadline = time.monotonic() + seconds
            while True:
                assert proc.poll() is None, f"app.py exited early:\n{log_path.read_text()}"
                try:
                    if httpx.get(url, timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, f"app.py did not answer on {url} within {seconds} s"
                time.sleep(0.5)
            yield url, proc.pid
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
