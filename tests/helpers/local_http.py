# SPDX-License-Identifier: Apache-2.0
"""A throwaway HTTP server on 127.0.0.1 for client tests: a fake endpoint answering with a test's handler."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextlib.contextmanager
def local_http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    """Serve `handler` on a free loopback port in a daemon thread; yields the port, shuts down on exit."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
