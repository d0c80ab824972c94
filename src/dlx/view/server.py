"""The page on 127.0.0.1, following running jobs: Python's standard-library HTTP server, two routes.

`/` is the page without data; `/data.json` is the payload, the run folders read again (what grew since the last read)
at most once per half refresh period whoever asks. Only this machine can connect; from another one, forward the port
over SSH (`ssh -L PORT:127.0.0.1:PORT HOST`) and open the same address there. Ctrl-C or SIGTERM stops it.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from dlx.errors import UserError
from dlx.view.page import page_html, payload_json
from dlx.view.payload import Viewer

HOST = "127.0.0.1"


class LivePayload:
    """The payload's JSON, rebuilt when it is older than half the refresh period; one reader at a time."""

    def __init__(self, viewer: Viewer, say: Callable[[str], None]) -> None:
        self.viewer, self.say = viewer, say
        self.lock = threading.Lock()
        self.text = ""
        self.read_at = -float("inf")

    def json(self) -> str:
        with self.lock:
            if time.monotonic() - self.read_at >= (self.viewer.refresh_s or 0) / 2:
                self.viewer.refresh()
                for line in self.viewer.problems.unprinted():
                    self.say(line)
                self.text = payload_json(self.viewer.payload())
                self.read_at = time.monotonic()
            return self.text


def make_server(viewer: Viewer, port: int, say: Callable[[str], None]) -> ThreadingHTTPServer:
    """The server bound to 127.0.0.1:`port` (0: a free port); UserError when the port is taken."""
    live = LivePayload(viewer, say)
    page = page_html(None).encode("utf-8")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/", "/index.html"):
                self._send(page, "text/html; charset=utf-8")
            elif path == "/data.json":
                self._send(live.json().encode("utf-8"), "application/json")
            else:
                self.send_error(404)

        def _send(self, body: bytes, kind: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per request would bury the problems worth reading

    try:
        server = ThreadingHTTPServer((HOST, port), Handler)
    except OSError as e:
        raise UserError(
            f"--port {port}: cannot listen on {HOST}:{port} ({e.strerror}); pick another --port, or leave "
            "it out for a free one"
        ) from None
    server.daemon_threads = True
    return server


def serve(viewer: Viewer, port: int, say: Callable[[str], None] = print) -> None:
    """Serve until Ctrl-C or SIGTERM; the address and the SSH-tunnel line first, then each new problem as it is met."""
    server = make_server(viewer, port, say)
    bound = server.server_address[1]
    say(f"dlx view: http://{HOST}:{bound}/ (following {len(viewer.places)} run(s); Ctrl-C stops)")
    say(f"from another machine: ssh -L {bound}:{HOST}:{bound} THIS_HOST, then open the same address there")
    sys.stdout.flush()
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.server_close()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
