"""A TCP proxy of the tests' own between replicas and Redis that can break a connection at the
worst moment: after a command ran in Redis and before its reply reaches the replica (a Redis
restart, a network blip). Threads, one pair per connection; every socket and thread is closed
when the proxy stops."""

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress


class DropProxy:
    """Forwards 127.0.0.1:`port` to Redis (or any server) on `target`. `drop(*marks, times=n)`:
    the next `n` commands whose bytes hold every one of `marks` run, and their connection is
    closed before the reply is forwarded; `dropped` counts them, `replied` the bytes forwarded
    back to the clients."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.dropped = 0
        self.replied = 0
        self._marks: tuple[bytes, ...] = ()
        self._times = 0
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def drop(self, *marks: bytes, times: int = 1) -> None:
        with self._lock:
            self._marks, self._times = marks, times

    def _armed(self, data: bytes) -> bool:
        with self._lock:
            if self._times and all(mark in data for mark in self._marks):
                self._times -= 1
                return True
            return False

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # stopped
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self._lock:
                self._sockets.update((client, upstream))
            doomed = threading.Event()  # a command ran: its reply is never forwarded
            for args in ((client, upstream, doomed, True), (upstream, client, doomed, False)):
                thread = threading.Thread(target=self._pump, args=args, daemon=True)
                self._threads.append(thread)
                thread.start()

    def _pump(self, source: socket.socket, sink: socket.socket, doomed: threading.Event,
              commands: bool) -> None:  # fmt: skip
        try:
            while data := source.recv(1 << 16):
                if commands and self._armed(data):
                    doomed.set()
                elif not commands and doomed.is_set():
                    self.dropped += 1
                    break  # the reply of the doomed command: the connection breaks instead
                self.replied += 0 if commands else len(data)
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            _close(end)

    def stop(self) -> None:
        _close(self._listener)
        with self._lock:
            for end in self._sockets:
                _close(end)
        for thread in self._threads:
            thread.join(timeout=5)


def _close(end: socket.socket) -> None:
    with suppress(OSError):
        end.shutdown(socket.SHUT_RDWR)
    end.close()


@contextmanager
def drop_proxy(target: int) -> Iterator[DropProxy]:
    proxy = DropProxy(target)
    try:
        yield proxy
    finally:
        proxy.stop()
