"""Hostile clients many at once: one call per index from a few threads, the answers in order."""

import threading
from collections.abc import Callable
from typing import Any


def concurrently(send: Callable[[int], Any], count: int, threads: int | None = None) -> list[Any]:
    """`send(i)` for every i in range(count), from `threads` threads (one per call when None),
    each joined within two minutes; the answers in the order of i (None where one never came)."""
    answers: list[Any] = [None] * count
    workers = count if threads is None else threads

    def work(first: int) -> None:
        for i in range(first, count, workers):
            answers[i] = send(i)

    running = [threading.Thread(target=work, args=(t,)) for t in range(workers)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join(120)
    return answers
