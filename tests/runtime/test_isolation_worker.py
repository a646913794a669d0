"""A fallback worker is killed once, whoever asks: a run's thread whose run was cancelled and
shutdown's FallbackPool.close may both ask at the same moment (CI saw the second close of the
connection fail with EBADF at shutdown)."""

import threading

from service.engines.workers.pool import LIMITS, FallbackPool, Worker
from service.settings import Settings


def test_kill_from_two_threads_closes_the_connection_once() -> None:
    pool = FallbackPool(Settings())
    worker = Worker(pool.limits, pool.transport_directory())
    closes: list[int] = []
    close = worker.conn.close
    worker.conn.close = lambda: (closes.append(1), close())[1]  # type: ignore[method-assign]
    start = threading.Barrier(2)

    def kill() -> None:
        start.wait()
        worker.kill()

    threads = [threading.Thread(target=kill) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    worker.kill()  # and once more, after both
    assert closes == [1]
    assert not worker.alive() and worker.conn.closed
    assert set(pool.limits) == set(LIMITS)
    pool.close()
