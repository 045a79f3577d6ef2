"""A TCP proxy that counts the bytes a server sends back: what a sync really read from a store.

Not a fake: it forwards every byte both ways to the real server (seaweedfs) and only counts them,
so a test can say how many bytes came from the store without trusting the sync's own summary.
With ``rate`` it is a slow link: each connection's responses go at most ``rate`` bytes a second.
With ``cut_after`` it is a link that breaks: the first connection whose responses pass that many
bytes is closed there, in the middle of a body, once. With ``hold`` = (held, release) it is a store
that answers some requests late: a request whose bytes hold ``held`` is forwarded only once one
holding ``release`` has been (or after ``HOLD_SECONDS``, counted in ``hold_timeouts``).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

HOLD_SECONDS = 10.0
"""How long a held request waits for its release before it is forwarded anyway."""


class CountingProxy:
    """Listens on 127.0.0.1 (``port``) and forwards each connection to ``target`` (host, port)."""

    def __init__(
        self,
        target: tuple[str, int],
        rate: float | None = None,
        cut_after: int | None = None,
        hold: tuple[bytes, bytes] | None = None,
    ) -> None:
        self.target = target
        self.rate = rate
        self.cut_after = cut_after
        self.hold = hold
        self.released = threading.Event()
        self.hold_timeouts = 0  # held requests forwarded because their release never came
        self.cuts = 0  # connections cut so far (at most one)
        self.connections = 0  # connections accepted so far
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._downstream = 0
        self._closed = False
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def bytes_from_server(self) -> int:
        """Bytes the server sent (responses: headers and bodies) since start or the last reset."""
        with self._lock:
            return self._downstream

    def reset(self) -> None:
        with self._lock:
            self._downstream = 0

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def close_connections(self) -> None:
        """End every connection open now, as a server ends idle keep-alive connections."""
        with self._lock:
            sockets, self._open = self._open, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        slow = count and self.rate is not None
        cut_after = self.cut_after
        sent = 0
        try:
            while data := src.recv(4096 if slow else 1 << 16):
                if not count and self.hold is not None:
                    self._hold_or_release(data, self.hold)
                if count:
                    with self._lock:
                        cut = cut_after is not None and not self.cuts and sent + len(data) > cut_after
                        if cut and cut_after is not None:
                            self.cuts += 1
                            data = data[: cut_after - sent]
                        self._downstream += len(data)
                    if cut:
                        dst.sendall(data)
                        return  # the finally shuts both sockets: the body ends short
                sent += len(data)
                dst.sendall(data)
                if slow and self.rate:
                    time.sleep(len(data) / self.rate)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def _hold_or_release(self, request: bytes, hold: tuple[bytes, bytes]) -> None:
        held, release = hold
        if release in request:
            self.released.set()
        elif held in request and not self.released.wait(HOLD_SECONDS):
            with self._lock:
                self.hold_timeouts += 1


@contextlib.contextmanager
def counting_proxy(
    endpoint: str,
    rate: float | None = None,
    cut_after: int | None = None,
    hold: tuple[bytes, bytes] | None = None,
) -> Iterator[CountingProxy]:
    """A CountingProxy in front of ``endpoint`` (http://host:port); ``rate``: bytes a second per
    connection, at most; ``cut_after``: the first connection to pass that many bytes is cut there;
    ``hold``: (held, release), requests holding ``held`` wait for one holding ``release``."""
    host, _, port = endpoint.removeprefix("http://").rstrip("/").rpartition(":")
    proxy = CountingProxy((host, int(port)), rate, cut_after, hold)
    try:
        yield proxy
    finally:
        proxy.close()
