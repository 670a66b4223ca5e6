"""Run the engine's event iterator in a worker thread so rendering never slows the decoding it measures."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


def in_background(events: Iterator[T], stop: threading.Event | None = None, interval: float = 0.2) -> Iterator[list[T]]:
    """Yield the events produced since the last yield, at most once per `interval` seconds (the last batch at once).

    An exception raised by `events` is re-raised here. When the consumer goes away early (closed, cancelled),
    `stop` is set so the worker's engine run ends at its next round.
    """
    inbox: queue.Queue = queue.Queue()

    def work() -> None:
        try:
            for event in events:
                inbox.put(event)
            inbox.put(_DONE)
        except BaseException as err:  # handed to the consumer, which re-raises it
            inbox.put(err)

    threading.Thread(target=work, name="engine-run", daemon=True).start()
    batch: list[T] = []
    last, finished = 0.0, False
    try:
        while True:
            wait = max(0.0, last + interval - time.monotonic()) if batch else None
            try:
                item = inbox.get(timeout=wait)
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
