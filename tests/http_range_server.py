"""A loopback HTTP server for remote-dataset tests and benchmarks: serves a folder with Range support, no listing.

Fault injection (``server.faults``) and a throttle (``server.rate_bps``, ``server.latency_s``) are attributes of the
running server; ``server.log`` records every GET as (path, start, end, bytes sent) (a 412 as (path, 0, 0, 0)).
Conditional GETs (``If-Match``, ``If-Unmodified-Since``) are honoured.
"""

from __future__ import annotations

import contextlib
import email.utils
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep test output clean
        pass

    def setup(self):
        super().setup()
        # As real servers do: without it, Nagle's algorithm holds the body behind the headers until the client's
        # delayed ACK (~40 ms), which would make every small request look twice the link latency.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _wait(self) -> None:
        """One link latency before an answer (every answer: HEAD, 4xx and 412 cost a round trip too)."""
        if self.server.latency_s:
            time.sleep(self.server.latency_s)

    def _file(self) -> Path | None:
        rel = self.path.split("?", 1)[0].lstrip("/")
        p = (self.server.root / rel).resolve()
        if not str(p).startswith(str(self.server.root.resolve())) or not p.is_file():
            return None
        return p

    @staticmethod
    def _etag(p: Path) -> str:
        st = p.stat()
        return f'"{st.st_size:x}-{st.st_mtime_ns:x}"'

    def _precondition_failed(self, p: Path) -> bool:
        """Answer 412 when ``If-Match`` names no current ETag or the file was modified after ``If-Unmodified-Since``
        (RFC 9110 13.1.1, 13.1.4), as S3, nginx and CDNs do."""
        im = self.headers.get("If-Match")
        failed = False
        if im is not None and im.strip() != "*":
            failed = self._etag(p) not in [t.strip() for t in im.split(",")]
        ius = self.headers.get("If-Unmodified-Since")
        if im is None and ius is not None:
            with contextlib.suppress(TypeError, ValueError):
                failed = int(p.stat().st_mtime) > email.utils.parsedate_to_datetime(ius).timestamp()
        if failed:
            with self.server.lock:  # logged before answering: a test may look as soon as its client has the 412
                self.server.log.append((str(p.relative_to(self.server.root)), 0, 0, 0))
            self._wait()
            self.send_response(412)
            self.send_header("Content-Length", "0")
            self.end_headers()
        return failed

    def _headers(self, p: Path, status: int, length: int, extra: dict | None = None) -> None:
        st = p.stat()
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", self._etag(p))
        self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
        self.send_header("Content-Type", "application/octet-stream")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()

    def _fault(self) -> bool:
        f = self.server.faults
        if f.get("status", 0) > 0:
            f["status"] -= 1
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return True
        if f.get("delay", 0) > 0:
            f["delay"] -= 1
            time.sleep(f.get("delay_s", 2.0))
        return False

    def do_HEAD(self):
        self._wait()
        p = self._file()
        if p is None:
            self.send_error(404)
            return
        if self._fault():
            return
        self._headers(p, 200, p.stat().st_size)

    def do_GET(self):
        p = self._file()
        if p is None:
            self._wait()
            self.send_error(404)
            return
        if self._fault() or self._precondition_failed(p):
            return
        size = p.stat().st_size
        start, end, status, extra = 0, size, 200, {}
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            if a == "":
                start, end = max(0, size - int(b)), size
            else:
                start, end = int(a), (min(int(b) + 1, size) if b else size)
            status, extra = 206, {"Content-Range": f"bytes {start}-{end - 1}/{size}"}
        truncate = self.server.faults.get("truncate", 0) > 0 and end - start > 1
        if truncate:
            self.server.faults["truncate"] -= 1
        self._wait()
        self._headers(p, status, end - start, extra)
        with open(p, "rb") as f:
            f.seek(start)
            todo = end - start if not truncate else (end - start) // 2
            sent = 0
            while sent < todo:
                chunk = f.read(min(64 << 10, todo - sent))
                self.server.pace(len(chunk))
                try:
                    self.wfile.write(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent += len(chunk)
        with self.server.lock:
            self.server.log.append((str(p.relative_to(self.server.root)), start, end, sent))
        if truncate:
            self.close_connection = True


class RangeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: str | os.PathLike, rate_bps: float = 0, latency_s: float = 0):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = Path(root)
        self.faults: dict = {}
        self.rate_bps, self.latency_s = rate_bps, latency_s
        self.log: list[tuple[str, int, int, int]] = []
        self.lock = threading.Lock()
        self._free_at = 0.0
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    def pace(self, n: int) -> None:
        """Hold a sender until ``n`` more bytes fit the link's rate (one token bucket for all connections)."""
        if not self.rate_bps:
            return
        with self.lock:
            start = max(time.monotonic(), self._free_at)
            self._free_at = start + n * 8 / self.rate_bps
        time.sleep(max(0.0, self._free_at - time.monotonic()))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def bytes_sent(self) -> int:
        with self.lock:
            return sum(e[3] for e in self.log)

    def __enter__(self) -> "RangeServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()
