"""The node's HTTP server: an aiohttp application on its own event loop thread.

The socket is bound first (so a port in use is a clear error, and port 0 yields the real
port before the application is built); ``start`` then serves the application until
``close``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable

from aiohttp import web

from effectlog.errors import BackendUnavailable

logger = logging.getLogger(__name__)
#: How long requests still in flight at close may finish before they are cancelled (a
#: request waiting for an offset may wait for 60 s; a stop must not).
SHUTDOWN_S = 0.5


class HttpServer:
    """Binds ``host:port`` at construction; serves what ``start``'s factory builds."""

    def __init__(self, host: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as exc:
            self._sock.close()
            raise BackendUnavailable(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        self._sock.listen(256)
        self._sock.setblocking(False)
        self.host = host
        self.port = int(self._sock.getsockname()[1])
        self.loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, factory: Callable[[], web.Application]) -> HttpServer:
        """Build the application on the server's loop and serve it from a thread."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            try:
                self._runner = web.AppRunner(factory(), access_log=None, handle_signals=False,
                                             shutdown_timeout=SHUTDOWN_S)
                self.loop.run_until_complete(self._runner.setup())
                self.loop.run_until_complete(web.SockSite(self._runner, self._sock).start())
            except BaseException as exc:  # reported to start()'s caller
                failure.append(exc)
                ready.set()
                return
            ready.set()
            self.loop.run_forever()
            self.loop.run_until_complete(self._runner.cleanup())
            self._cancel_pending()
            self.loop.close()

        self._thread = threading.Thread(target=serve, name="http", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        logger.info("query API on %s", self.url)
        return self

    def _cancel_pending(self) -> None:
        """Cancel what is still pending (a request waiting for an offset, a handler waiting
        on a broker that is gone) and let it finish, so no task is destroyed pending."""
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))

    def close(self) -> None:
        """Stop serving; open connections are closed."""
        if self._thread is None:
            self._sock.close()
            return
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
        self._thread = None
        self._sock.close()
