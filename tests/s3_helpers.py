"""A real S3 server on 127.0.0.1 (moto's `ThreadedMotoServer`) and a fault proxy in front of it: latency per request,
HTTP 503 SlowDown and dropped connections at chosen rates. Used by the object-storage tests and
`benchmarks/bench_object_storage.py`; nothing here reaches the network."""

from __future__ import annotations

import contextlib
import http.client
import random
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Faults:
    """What the proxy does to each request; change the fields while it runs."""

    latency_s: float = 0.0
    upload_bytes_per_s: float = 0.0
    """A request body of n bytes is held n / this many seconds before it is forwarded (0: no limit): an uplink."""
    slowdown_rate: float = 0.0
    """Share of requests answered 503 SlowDown without reaching the server."""
    drop_rate: float = 0.0
    """Share of requests whose connection is closed without an answer."""
    seed: int = 0
    requests: int = 0
    slowdowns: int = 0
    drops: int = 0
    bytes_out: int = 0
    """Response body bytes of GET requests passed back to clients."""

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()

    def draw(self) -> str:
        with self._lock:
            self.requests += 1
            x = self._rng.random()
            if x < self.slowdown_rate:
                self.slowdowns += 1
                return "slowdown"
            if x < self.slowdown_rate + self.drop_rate:
                self.drops += 1
                return "drop"
            return "pass"

    def count_bytes(self, n: int) -> None:
        with self._lock:
            self.bytes_out += n


def _handler(upstream_port: int, faults: Faults):
    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def setup(self) -> None:
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms delayed-ACK stalls

        def _forward(self) -> None:
            body = self._body()
            if faults.latency_s:
                time.sleep(faults.latency_s)
            if faults.upload_bytes_per_s and body:
                time.sleep(len(body) / faults.upload_bytes_per_s)
            action = faults.draw()
            if action == "drop":
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            if action == "slowdown":
                self.send_response(503)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(SLOWDOWN)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(SLOWDOWN)
                return
            conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
            skip = ("connection", "keep-alive", "transfer-encoding", "content-length", "expect")
            headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
            headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
            conn.close()
            if self.command == "GET":
                faults.count_bytes(len(data))
            self.send_response(response.status)
            for k, v in response.getheaders():
                if k.lower() not in ("connection", "transfer-encoding", "content-length", "keep-alive"):
                    self.send_header(k, v)
            head_length = response.getheader("Content-Length", "0")  # a HEAD answer has no body but the length
            self.send_header("Content-Length", head_length if self.command == "HEAD" else str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _body(self) -> bytes:
            """The request body, also when it comes in HTTP chunks (forwarded whole, with a Content-Length)."""
            if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))
            parts = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline().strip():  # trailers
                pass
            return b"".join(parts)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    return Proxy


@dataclass
class S3Endpoint:
    url: str
    """The proxy's endpoint (what clients use)."""
    server_url: str
    """moto's own endpoint, without faults."""
    faults: Faults

    def env(self) -> dict[str, str]:
        """The environment a dlx process needs to reach this server."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }


@contextlib.contextmanager
def s3_server(faults: Faults | None = None) -> Iterator[S3Endpoint]:
    """moto's S3 on a free loopback port behind the fault proxy; both stopped on exit."""
    from moto.server import ThreadedMotoServer

    port, proxy_port = free_port(), free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    faults = faults or Faults()
    proxy = ThreadingHTTPServer(("127.0.0.1", proxy_port), _handler(port, faults))
    proxy.daemon_threads = True
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield S3Endpoint(f"http://127.0.0.1:{proxy_port}", f"http://127.0.0.1:{port}", faults)
    finally:
        proxy.shutdown()
        proxy.server_close()
        thread.join()
        server.stop()


def make_bucket(endpoint: S3Endpoint, name: str) -> None:
    import boto3

    env = endpoint.env()
    client = boto3.client(
        "s3",
        endpoint_url=endpoint.server_url,
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
    )
    client.create_bucket(Bucket=name)


def apply_env(endpoint: S3Endpoint, monkeypatch) -> None:
    for key, value in endpoint.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
