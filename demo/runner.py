"""The one thread that runs every model call of the app, and the frames a page draws from its runs.

Each new thread that calls into torch's CPU kernels gets an OpenMP team of its own, and the teams of idle threads
keep spinning on the same cores; a page that ran each request's engine on a fresh thread decoded at about half the
speed of the same engine alone. So the models are loaded, warmed up and run on one long-lived thread (the main
thread under `python app.py`), and request handlers only hand it work and read what it produced, at the page's
frame rate: drawing never holds up a round.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")
_DONE = object()
FRAME_S = 0.5  # a page redraws a streaming run at most this often (twice a second)


class EngineThread:
    """Runs jobs one at a time, in order, on one thread: `serve` it on a thread of your own or `start` one."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def start(self) -> EngineThread:
        """Serve on a daemon thread of its own (tests, and pages served in-process)."""
        threading.Thread(target=self.serve, name="engine", daemon=True).start()
        return self

    def serve(self) -> None:
        """Run jobs forever on the calling thread."""
        self._thread = threading.current_thread()
        while True:
            future, fn = self._jobs.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as err:  # handed to the caller, which re-raises it
                    future.set_exception(err)

    def submit(self, fn: Callable[[], T]) -> Future:
        future: Future = Future()
        self._jobs.put((future, fn))
        return future

    def call(self, fn: Callable[[], T]) -> T:
        """`fn()` run on the engine thread (at once when called from it); its result or its exception."""
        if threading.current_thread() is self._thread:
            return fn()
        return self.submit(fn).result()

    def frames(self, events: Iterator[T], stop: threading.Event | None = None,
               interval: float = FRAME_S) -> Iterator[list[T]]:
        """Iterate `events` on the engine thread; yield what it produced since the last yield, at most once per
        `interval` seconds (the last batch at once). An exception raised by `events` is re-raised here. When the
        consumer goes away early (closed, cancelled), `stop` is set so the run ends at its next round."""
        inbox: queue.SimpleQueue = queue.SimpleQueue()

        def work() -> None:
            try:
                for event in events:
                    inbox.put(event)
                inbox.put(_DONE)
            except BaseException as err:
                inbox.put(err)

        self.submit(work)
        yield from _batches(inbox, stop, interval)


def _batches(inbox: queue.SimpleQueue, stop: threading.Event | None, interval: float) -> Iterator[list]:
    batch: list = []
    last, finished = 0.0, False  # the first event is drawn at once
    try:
        while True:
            try:
                item = inbox.get(timeout=max(0.0, last + interval - time.monotonic()) if batch else None)
            except queue.Empty:
                yield batch
                batch, last = [], time.monotonic()
                continue
            if item is _DONE or isinstance(item, BaseException):
                finished = True
                if batch:
                    yield batch
                if isinstance(item, BaseException):
                    raise item
                return
            batch.append(item)
            if time.monotonic() - last >= interval:
                yield batch
                batch, last = [], time.monotonic()
    finally:
        if stop is not None and not finished:
            stop.set()
