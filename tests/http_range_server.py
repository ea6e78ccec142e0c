"""A loopback HTTP server for remote-dataset tests and benchmarks: serves a folder with Range support, no listing.

Fault injection (``server.faults``) and a throttle (``server.rate_bps``, ``server.latency_s``) are attributes of the
running server; ``server.log`` records every GET as (path, start, end, bytes sent) (a 412 as (path, 0, 0, 0)).
Conditional GETs (``If-Match``, ``If-Unmodified-Since``) are honoured.

Faults (keys of ``server.faults``): ``status`` (n answers 503), ``truncate`` (n bodies cut in half), ``delay`` (n
answers wait ``delay_s``); and, for as long as they are set, ``rotating_etag`` (every answer, HEAD or GET, carries a
new ETag for the same bytes, as a farm of nodes tagging differently: an ``If-Match`` never matches),
``no_validators`` (no ETag, no Last-Modified), ``no_content_range`` (a 206 without its Content-Range header),
``range_shift`` (a 206's body starts this many bytes after the range asked for; announced in Content-Range unless
``no_content_range``), ``range_total`` (a 206's Content-Range announces this total size instead of the file's),
``ignore_conditions`` (no 412: ``If-Match`` / ``If-Unmodified-Since`` are not evaluated, as Python's http.server),
``etag_on_head_only`` (GET answers carry Last-Modified but no ETag), ``lm_on_head_only`` (GET answers carry no
Last-Modified), ``etag_on_get_only`` / ``lm_on_get_only`` (HEAD answers carry no ETag / no Last-Modified),
``weak_etag`` (every ETag weak, ``W/"..."``).

``HubServer`` (at the end) is the same server with a minimal Hugging Face Hub API face in front of the same folder,
for lerobot's ``LeRobotDataset(repo_id)`` with ``HF_ENDPOINT`` pointing at it.
"""

from __future__ import annotations

import contextlib
import email.utils
import hashlib
import json
import os
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep test output clean
        pass

    # Requests being answered are counted (from the parsed request line to the end of the answer, not while a
    # keep-alive connection idles), so that ``server.log`` can wait for them: a client holds an answer's last byte a
    # moment before the server's thread logs it, and a test reading the log right after a read could miss it.
    def parse_request(self):
        ok = super().parse_request()
        if ok:
            with self.server.answering:
                self.server.busy += 1
            self._counted = True
        return ok

    def handle_one_request(self):
        self._counted = False
        self._rotated = None  # a keep-alive connection's next request gets its own rotating ETag
        try:
            super().handle_one_request()
        finally:
            if self._counted:
                with self.server.answering:
                    self.server.busy -= 1
                    self.server.answering.notify_all()

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

    def _extra_headers(self, p: Path) -> dict:
        """Headers a subclass adds to every file answer (none here)."""
        return {}

    def _answer_etag(self, p: Path) -> str:
        """The ETag of this answer: the file's (``_etag``), or under ``faults["rotating_etag"]`` a new one per request
        for the same bytes (computed once per request, so its 412 test and its headers agree)."""
        if not self.server.faults.get("rotating_etag"):
            return self._etag(p)
        if getattr(self, "_rotated", None) is None:
            with self.server.lock:
                self.server.tags_given += 1
                n = self.server.tags_given
            self._rotated = self._etag(p)[:-1] + f'-node{n}"'
        return self._rotated

    def _precondition_failed(self, p: Path) -> bool:
        """Answer 412 when ``If-Match`` names no current ETag or the file was modified after ``If-Unmodified-Since``
        (RFC 9110 13.1.1, 13.1.4), as S3, nginx and CDNs do."""
        if self.server.faults.get("ignore_conditions"):  # a static server that evaluates no condition
            return False
        im = self.headers.get("If-Match")
        failed = False
        if im is not None and im.strip() != "*":
            failed = self._answer_etag(p) not in [t.strip() for t in im.split(",")]
        ius = self.headers.get("If-Unmodified-Since")
        if im is None and ius is not None:
            with contextlib.suppress(TypeError, ValueError):
                failed = int(p.stat().st_mtime) > email.utils.parsedate_to_datetime(ius).timestamp()
        if failed:
            with self.server.lock:  # logged before answering: a test may look as soon as its client has the 412
                self.server._log.append((str(p.relative_to(self.server.root)), 0, 0, 0))
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
        if not self.server.faults.get("no_validators"):
            f = self.server.faults
            if not (f.get("etag_on_head_only") and self.command == "GET") \
                    and not (f.get("etag_on_get_only") and self.command == "HEAD"):
                self.send_header("ETag", ("W/" if f.get("weak_etag") else "") + self._answer_etag(p))
            if not (f.get("lm_on_head_only") and self.command == "GET") \
                    and not (f.get("lm_on_get_only") and self.command == "HEAD"):
                self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
        self.send_header("Content-Type", "application/octet-stream")
        for k, v in {**self._extra_headers(p), **(extra or {})}.items():
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
        with self.server.lock:
            self.server.heads.append(str(p.relative_to(self.server.root)))
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
        start, end, status, extra, shift = 0, size, 200, {}, 0
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            if a == "":
                start, end = max(0, size - int(b)), size
            else:
                start, end = int(a), (min(int(b) + 1, size) if b else size)
            status, extra = 206, {"Content-Range": f"bytes {start}-{end - 1}/{size}"}
            # the body of other bytes, as many as asked for (a proxy off by some bytes; zeros past the file's end)
            shift = self.server.faults.get("range_shift", 0)
            if shift:
                extra["Content-Range"] = f"bytes {start + shift}-{end - 1 + shift}/{size}"
            if "range_total" in self.server.faults:
                extra["Content-Range"] = f"bytes {start}-{end - 1}/{self.server.faults['range_total']}"
            if self.server.faults.get("no_content_range"):
                del extra["Content-Range"]
        truncate = self.server.faults.get("truncate", 0) > 0 and end - start > 1
        if truncate:
            self.server.faults["truncate"] -= 1
        self._wait()
        self._headers(p, status, end - start, extra)
        with open(p, "rb") as f:
            f.seek(start + shift)
            todo = end - start if not truncate else (end - start) // 2
            sent = 0
            while sent < todo:
                n = min(64 << 10, todo - sent)
                chunk = f.read(n).ljust(n, b"\0")
                self.server.pace(len(chunk))
                try:
                    self.wfile.write(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent += len(chunk)
        with self.server.lock:
            self.server._log.append((str(p.relative_to(self.server.root)), start, end, sent))
        if truncate:
            self.close_connection = True


class RangeServer(ThreadingHTTPServer):
    daemon_threads = True
    handler_class: type = _Handler

    def __init__(self, root: str | os.PathLike, rate_bps: float = 0, latency_s: float = 0):
        super().__init__(("127.0.0.1", 0), self.handler_class)
        self.root = Path(root)
        self.faults: dict = {}
        self.rate_bps, self.latency_s = rate_bps, latency_s
        self._log: list[tuple[str, int, int, int]] = []
        self.busy = 0  # requests being answered (_Handler.parse_request to the end of the answer)
        self.answering = threading.Condition()
        self.heads: list[str] = []  # the files asked for by HEAD (what an fsspec info() sends first)
        self.tags_given = 0  # rotating ETags handed out (faults["rotating_etag"])
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

    @property
    def log(self) -> list[tuple[str, int, int, int]]:
        """Every GET as (path, start, end, bytes sent), once the requests being answered are done (at most 5 s)."""
        self.settle()
        return self._log

    def settle(self, timeout_s: float = 5.0) -> None:
        """Wait until no request is being answered (at most ``timeout_s``): then every answer a client has
        received is in the log."""
        with self.answering:
            self.answering.wait_for(lambda: self.busy == 0, timeout=timeout_s)

    def bytes_sent(self) -> int:
        self.settle()
        with self.lock:
            return sum(e[3] for e in self._log)

    def __enter__(self) -> "RangeServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()


# --- A minimal Hugging Face Hub API face on the same server -----------------------------------------------------------
#
# Enough of the Hub for huggingface_hub's snapshot_download / hf_hub_download (2.4 under lerobot 0.4.4, 1.33 under
# lerobot 0.6.1) and lerobot's codebase-version check, with HF_ENDPOINT pointing here. Each folder under the root
# that holds meta/info.json is a dataset repo "<any namespace>/<folder name>" with one commit: branch "main" and the
# tag of its info.json codebase_version ("v3.0"). Endpoints, every one paced and delayed like the file answers:
#   GET  /api/datasets/{repo}[/revision/{rev}]   repo info: id, sha, siblings
#   GET  /api/datasets/{repo}/refs                 branches and tags
#   GET  /api/datasets/{repo}/tree/{rev}[/{path}]  folder listing (?recursive=true: every file and folder below)
#   HEAD/GET /datasets/{repo}/resolve/{rev}/{path} the file, with ETag (the blob id), X-Repo-Commit, Range
# JSON answers are logged as ("api:<url path>", 0, n, n), so bytes_sent() counts them too.


class _HubHandler(_Handler):

    def _repo(self, parts: list[str]) -> Path | None:
        """The repo folder named by ``parts[0:2]`` ("namespace/name"), None when there is none."""
        if len(parts) < 2:
            return None
        d = (self.server.root / parts[1]).resolve()
        if d.parent != self.server.root.resolve() or not (d / "meta" / "info.json").is_file():
            return None
        return d

    @staticmethod
    def _files(repo: Path) -> list[Path]:
        return sorted(p for p in repo.rglob("*") if p.is_file())

    @staticmethod
    def _etag(p: Path) -> str:
        # a git-blob-like id of the file's state (40 hex, so huggingface_hub takes it for a blob id, not an LFS
        # sha256 it would check the content against); it changes when the file does, as If-Match needs
        st = p.stat()
        return '"' + hashlib.sha1(f"{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest() + '"'

    def _sha(self, repo: Path) -> str:
        """The repo's one commit: a hash of every file's path, size and mtime (a new commit when a file changes)."""
        h = hashlib.sha1()
        for p in self._files(repo):
            st = p.stat()
            h.update(f"{p.relative_to(repo)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
        return h.hexdigest()

    def _tag(self, repo: Path) -> str:
        return json.loads((repo / "meta" / "info.json").read_text()).get("codebase_version", "v3.0")

    def _resolves(self, repo: Path, rev: str) -> bool:
        return rev in ("main", self._tag(repo), self._sha(repo))

    def _parts(self) -> tuple[list[str], dict]:
        u = urllib.parse.urlsplit(self.path)
        parts = [urllib.parse.unquote(x) for x in u.path.split("/") if x]
        return parts, urllib.parse.parse_qs(u.query)

    def _file(self) -> Path | None:
        parts, _ = self._parts()
        if len(parts) >= 6 and parts[0] == "datasets" and parts[3] == "resolve":
            repo = self._repo(parts[1:3])
            if repo is None or not self._resolves(repo, parts[4]):
                return None
            p = (repo / "/".join(parts[5:])).resolve()
            return p if str(p).startswith(str(repo) + os.sep) and p.is_file() else None
        return super()._file()  # the plain file face stays

    def _extra_headers(self, p: Path) -> dict:
        parts, _ = self._parts()
        if parts[:1] == ["datasets"]:
            repo = self._repo(parts[1:3])
            if repo is not None:
                return {"X-Repo-Commit": self._sha(repo)}
        return {}

    def send_error(self, code, message=None, explain=None):
        if code == 404:
            with self.server.lock:
                self.server.missed.append((self.command, self.path))
        super().send_error(code, message, explain)

    def _send_json(self, status: int, obj, error_code: str | None = None) -> None:
        if status == 404:
            with self.server.lock:
                self.server.missed.append((self.command, self.path))
        body = json.dumps(obj).encode()
        self._wait()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if error_code:  # huggingface_hub maps these to RepositoryNotFoundError, RevisionNotFoundError, ...
            self.send_header("X-Error-Code", error_code)
        self.end_headers()
        self.server.pace(len(body))
        self.wfile.write(body)
        with self.server.lock:
            self.server._log.append(("api:" + urllib.parse.urlsplit(self.path).path, 0, len(body), len(body)))

    def _api(self, parts: list[str], query: dict) -> None:
        repo = self._repo(parts[2:4])
        if repo is None:
            self._send_json(404, {"error": "Repository not found"}, "RepoNotFound")
            return
        rest, sha, name = parts[4:], self._sha(repo), f"{parts[2]}/{parts[3]}"
        if rest[:1] == ["refs"]:
            target = {"targetCommit": sha}
            self._send_json(200, {"branches": [{"name": "main", "ref": "refs/heads/main", **target}],
                                  "tags": [{"name": self._tag(repo), "ref": f"refs/tags/{self._tag(repo)}", **target}],
                                  "converts": []})
            return
        if rest and rest[0] in ("revision", "tree") and (len(rest) < 2 or not self._resolves(repo, rest[1])):
            self._send_json(404, {"error": "Invalid rev id"}, "RevisionNotFound")
            return
        if not rest or rest[0] == "revision":
            files = self._files(repo)
            self._send_json(200, {"id": name, "sha": sha, "private": False, "gated": False, "disabled": False,
                                  "tags": [], "siblings": [{"rfilename": str(p.relative_to(repo))} for p in files],
                                  "usedStorage": sum(p.stat().st_size for p in files)})
            return
        if rest[0] == "tree":
            base = (repo / "/".join(rest[2:])).resolve()
            if not base.is_dir() or not (base == repo or str(base).startswith(str(repo) + os.sep)):
                self._send_json(404, {"error": "Entry not found"}, "EntryNotFound")
                return
            recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
            entries = []
            for p in sorted(base.rglob("*") if recursive else base.iterdir()):
                rel = str(p.relative_to(repo))
                if p.is_dir():
                    entries.append({"type": "directory", "oid": hashlib.sha1(rel.encode()).hexdigest(), "size": 0,
                                    "path": rel})
                elif p.is_file():
                    entries.append({"type": "file", "oid": self._etag(p).strip('"'), "size": p.stat().st_size,
                                    "path": rel})
            self._send_json(200, entries)
            return
        self._send_json(404, {"error": f"not served here: {self.path}"})

    def do_GET(self):
        parts, query = self._parts()
        if parts[:2] == ["api", "datasets"]:
            self._api(parts, query)
            return
        super().do_GET()


class HubServer(RangeServer):
    """``RangeServer`` plus the Hub API face above: ``HF_ENDPOINT=server.url`` and ``LeRobotDataset("x/<folder>")``
    downloads ``root/<folder>`` through huggingface_hub, over the same throttle, latency and log. ``server.log`` also
    records every GET answer to a ``/api/`` URL; ``server.missed`` every request answered 404 (method, path), which
    shows an endpoint a newer huggingface_hub calls and this face lacks."""

    handler_class = _HubHandler

    def __init__(self, root: str | os.PathLike, rate_bps: float = 0, latency_s: float = 0):
        super().__init__(root, rate_bps, latency_s)
        self.missed: list[tuple[str, str]] = []
