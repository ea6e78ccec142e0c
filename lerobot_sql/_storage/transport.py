"""The network side of remote reads: retries, and range reads pinned to the version of a file first seen.

Every network call goes through :func:`call`: retried with exponential backoff on 5xx answers, resets, truncated
bodies and timeouts, then :class:`RemoteIOError` naming the URL and byte range. Several range reads at once over
HTTP make their first try in one round on fsspec's IO loop (:func:`pinned_get_many`); a failed one is then retried
by :func:`call` alone, its round's try counted as the first. Range reads go through
:func:`pinned_get`, which looks the backend's way of pinning a version up in ``PINNERS`` (keyed by protocol: HTTP
``If-Match`` / ``If-Unmodified-Since``, S3 version id / ``IfMatch``); a file that changes on the server mid-run then
raises :class:`FileChangedError` instead of mixing versions in the cache. A new backend is one entry in ``PINNERS``;
a protocol without one is read unpinned.

Plain functions over an fsspec filesystem: the cache of fetched bytes is :mod:`lerobot_sql._storage.pieces`, the
fsspec face :mod:`lerobot_sql._storage.remote`.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
import re
import time
from typing import Any, Callable

from ..errors import FileChangedError, MissingFileError, RemoteIOError

STALL_S = 20.0                  # an HTTP answer may pause this long (headers, or between body bytes)
MIN_RATE = 32 << 10              # ... and must deliver a body at this average rate (bytes/s) after STALL_S
WHOLE_MAX = 64 << 20             # a file of a server that ignores Range is fetched whole up to this size
CHECK_BYTES = 64 << 10           # bytes at each end of an untagged file hashed into its identity
FETCH_THREADS = 16               # parallel range requests of one fetch_each (or pinned_get_many) call
_CONTENT_RANGE = re.compile(r"bytes (\d{1,20})-(\d{1,20})/(\d{1,20}|\*)")  # a 206's single range (RFC 9110 14.4)


class Truncated(OSError):
    """The server sent fewer bytes than asked for: retried."""


class Stalled(OSError):
    """The server stopped sending (no byte for ``stall_s``) or sends slower than ``min_rate``: retried once."""


class Lying(OSError):
    """The server's answer contradicts the request (a Content-Length or Content-Range for other bytes): not
    retried, another try gets the same answer."""


def protocol(fs: Any) -> str:
    """The first protocol name of an fsspec filesystem (``"https"``, ``"s3"``, ``"file"`` ...)."""
    return fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]


def retryable(e: BaseException) -> bool:
    """True for errors a second try may cure: 5xx/408/429 answers, resets, timeouts, truncated bodies."""
    if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotImplementedError, TypeError,
                      KeyError, MissingFileError, Lying)):
        return False
    status = getattr(e, "status", None) or getattr(e, "status_code", None)
    if status is None:
        resp = getattr(e, "response", None)
        status = getattr(resp, "status_code", None) if resp is not None and not isinstance(resp, dict) else None
        if isinstance(resp, dict):
            status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
        return False
    return True


def precondition_failed(e: BaseException) -> bool:
    """True for an HTTP 412 / S3 ``PreconditionFailed`` answer (the If-Match / If-Unmodified-Since test failed)."""
    for x in (e, e.__cause__, e.__context__):
        if x is None:
            continue
        status = getattr(x, "status", None) or getattr(x, "status_code", None)
        resp = getattr(x, "response", None)
        if isinstance(resp, dict):
            status = status or resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if resp.get("Error", {}).get("Code") == "PreconditionFailed":
                return True
        if status == 412 or "PreconditionFailed" in str(x) or "Precondition Failed" in str(x):
            return True
    return False


def version_of(info: dict) -> dict:
    """What pins the bytes of the version described by ``info`` (a target's raw ``info()``): the S3 version id, a
    strong ETag (a weak ``W/`` one cannot be used with If-Match), the Last-Modified date. Missing keys are left out."""
    out = {}
    vid = info.get("VersionId") or info.get("version_id")
    if vid and vid != "null":
        out["version_id"] = str(vid)
    etag = info.get("ETag") or info.get("etag")
    if isinstance(etag, str) and etag and not etag.startswith("W/"):
        out["etag"] = etag if etag.startswith('"') else f'"{etag}"'
    elif isinstance(etag, str) and etag:  # not sent as a condition, but compared with each answer's own
        out["weak_etag"] = etag
    lm = info.get("Last-Modified")
    if isinstance(lm, str) and lm:
        out["last_modified"] = lm
    return out


def version_named(pin: dict) -> str:
    """The version a pin holds, for messages: its version id, ETag or Last-Modified date (described or seen first)."""
    for k in ("version_id", "etag", "weak_etag", "last_modified", "seen_etag", "seen_last_modified"):
        if pin.get(k):
            return f"{'Last-Modified ' if 'modified' in k else ''}{pin[k]}"
    return f"its size of {pin.get('size')} bytes" if pin.get("size") is not None else "the version first read"


def identity_of(info: dict) -> str:
    """size + the strongest content tag fsspec reports (ETag, blob id, LFS sha256, last commit, mtime)."""
    lfs = info.get("lfs") or {}
    tag = (info.get("ETag") or info.get("etag") or info.get("blob_id") or (lfs.get("sha256") if isinstance(lfs, dict)
           else None) or info.get("last_commit") or info.get("LastModified") or info.get("Last-Modified")
           or info.get("mtime") or info.get("updated") or "")
    if isinstance(tag, dict):
        tag = tag.get("oid") or json.dumps(tag, sort_keys=True, default=str)
    return f"{info.get('size')}-{str(tag).strip(chr(34))}"


def call(what: str, fn: Callable, *args: Any, retries: int, backoff_s: float,
         on_attempt: Callable[[], None] = lambda: None, failed: BaseException | None = None):
    """``fn(*args)`` with up to ``retries`` more tries (backoff ``backoff_s * 2**k`` seconds, jittered) on a
    retryable error; ``on_attempt()`` before each try (the request counter). ``failed``: the error of a first try
    made and counted elsewhere (one span of :func:`pinned_get_many`), taken as this call's first try.

    Raises:
        RemoteIOError: after the last try, naming ``what`` and the last error (chained).
        FileNotFoundError: passed through (unless fsspec's HTTP ``info()`` wrapped a network failure in it).
        FileChangedError: passed through (another try cannot bring the old version back).
    """
    last: BaseException | None = None
    stalls = 0
    for attempt in range(retries + 1):
        try:
            if attempt == 0 and failed is not None:
                raise failed
            on_attempt()
            return fn(*args)
        except FileNotFoundError as e:
            # fsspec's HTTP info() reports any failure (a 503, a reset) as FileNotFoundError: look underneath.
            cause = e.__cause__
            if cause is None or isinstance(cause, FileNotFoundError) or not retryable(cause):
                raise
            last = cause  # a 5xx, a refused connection: a network failure, not a missing file
            if attempt == retries:
                break
            time.sleep(backoff_s * (2 ** attempt) * (1 + 0.25 * random.random()))
            continue
        except FileChangedError:
            raise  # another try cannot bring the old version back
        except Exception as e:  # noqa: BLE001 - any library's transport error; classified below
            last = e
            stalls += isinstance(e, Stalled)
            # A stalled server costs stall_s (or more) per try: one more try, not `retries` more.
            if not retryable(e) or attempt == retries or stalls > 1:
                break
            time.sleep(backoff_s * (2 ** attempt) * (1 + 0.25 * random.random()))
    # A server contradicting the request is not the network's fault nor the file's: say whose it is.
    advice = (LYING_ADVICE if isinstance(last, Lying)
              else "Check the network and credentials (storage_options), then retry")
    raise RemoteIOError(f"{what}: failed after {attempt + 1} attempt(s): {type(last).__name__}: {last}. "
                        f"{advice}; the cache holds nothing partial from this read.") from last


LYING_ADVICE = ("The server's answer is at fault, not the file (re-downloading would not help): retry; if it "
                "persists, read the dataset from another mirror, or without the proxy in between (unset "
                "HTTP_PROXY/HTTPS_PROXY when storage_options pass client_kwargs={'trust_env': True})")


def info_with_validators(fs: Any, path: str) -> dict:
    """``fs.info(path)``, and for HTTP the same facts from one HEAD of our own: ``size``, ``ETag`` and
    ``Last-Modified`` on every fsspec release.

    Why: fsspec's HTTP ``info()`` reports Last-Modified only since 2025.9; before (our floor, 2024.2) a file was
    pinned by its ETag alone, and a 412 could not be told apart from a server farm's rotating ETags by the date
    (:meth:`RemoteFS._same_bytes_new_etag`): a changed file was taken for unstable ETags and its new bytes read. The
    HEAD runs on fsspec's own aiohttp session (its headers, auth, redirects) as fsspec's does; an answer without a
    usable size (no Content-Length, or a compressed one) falls back to ``fs.info`` (which then tries a GET).

    Raises:
        FileNotFoundError: a 404 (or what ``fs.info`` raises where it is asked).
        aiohttp.ClientError, OSError, asyncio.TimeoutError: the HEAD failed (a 5xx, a reset): :func:`call` retries.
    """
    if protocol(fs) not in ("http", "https"):
        return fs.info(path)
    from fsspec.asyn import sync

    async def head() -> dict | None:
        session = await fs.set_session()
        kw = dict(getattr(fs, "kwargs", {}) or {})
        h = {**(kw.pop("headers", None) or {}), "Accept-Encoding": "identity"}
        async with session.head(fs.encode_url(path), headers=h, allow_redirects=True, **kw) as r:
            if r.status == 404:
                raise FileNotFoundError(path)
            if r.status in (405, 501):  # HEAD not allowed here: fsspec's info() tries a GET
                return None
            r.raise_for_status()  # a 5xx, a 429: retried by the caller (call) like any read
            if r.headers.get("Content-Encoding", "identity") not in ("identity", ""):
                return None
            n = r.headers.get("Content-Length")
            if n is None or not n.isdigit():
                return None
            out = {"name": path, "size": int(n), "type": "file", "url": str(r.url)}
            for k in ("ETag", "Last-Modified"):
                if r.headers.get(k):
                    out[k] = r.headers[k]
            return out

    got = sync(fs.loop, head)
    return got if got is not None else fs.info(path)


def describe(fs: Any, path: str, *, url: str, trust_etag: bool = True, stall_s: float = STALL_S,
             min_rate: float = MIN_RATE) -> dict:
    """One ``info()`` of ``path`` on the remote, as the cache keeps it: ``name``, ``size``, ``type``, ``identity``
    (:func:`identity_of`) and what pins the version (:func:`version_of`). ``trust_etag=False`` (a server whose
    ETags change for unchanged bytes): the ETag is left out of both, as if the server gave none.

    A plain HTTP file that nothing tags (no strong ETag, no Last-Modified) gets a CRC of its first and last
    ``CHECK_BYTES`` (a Parquet footer, an mp4's moov box) in its identity: otherwise a change of the same size
    would keep serving the old cached bytes; a change elsewhere alone stays unnoticed (docs/remote).
    """
    i = info_with_validators(fs, path)
    if not trust_etag:
        i = {k: v for k, v in i.items() if k.lower() != "etag"}
    out = {"name": path, "size": i.get("size"), "type": i.get("type", "file"), "identity": identity_of(i),
           **version_of(i), **({} if trust_etag else {"seen_etag": None})}
    http_file = protocol(fs) in ("http", "https") and out["type"] == "file" and isinstance(out["size"], int) \
        and out["size"] > 0
    n = out.get("size")

    def span(a: int, b: int) -> bytes:  # (its answer's validators are learned into the pin: _check_validators)
        data, whole = http_get(fs, path, a, b, {}, n, url=url, stall_s=stall_s, min_rate=min_rate, pinned=out)
        return data[a:b] if whole else data

    has_tag, has_lm = bool(out.get("etag") or out.get("weak_etag")), bool(out.get("last_modified"))
    if http_file and ((has_tag and not has_lm) or (has_lm and not has_tag and "seen_etag" not in out)):
        # HEAD gave one kind of validator: what its range answers carry is learned now, with the pin, from one
        # byte. A server giving the other kind on range answers (and ignoring conditions) would otherwise have
        # them learned at a process's first read, from whatever version the file is then (hostile review 14, F1).
        # Its headers only: a server ignoring Range would send the whole file (hostile review 15)
        http_get(fs, path, 0, 1, {}, n, url=url, stall_s=stall_s, min_rate=min_rate, pinned=out, headers_only=True)
    if http_file and not (out.get("etag") or out.get("last_modified")):
        head = span(0, min(n, CHECK_BYTES))
        tail = span(max(0, n - CHECK_BYTES), n) if n > CHECK_BYTES else b""
        import zlib

        out["identity"] += f"-crc{zlib.crc32(tail, zlib.crc32(head)):08x}"
    return out


def http_get(fs, path: str, a: int, b: int, headers: dict, size: int | None, *, url: str,
             stall_s: float = STALL_S, min_rate: float = MIN_RATE, pinned: dict | None = None,
             headers_only: bool = False) -> tuple[bytes, bool]:
    """:func:`http_get_async` run on fsspec's IO loop (blocking the calling thread until it is done)."""
    from fsspec.asyn import sync

    return sync(fs.loop, http_get_async, fs, path, a, b, headers, size, url=url, stall_s=stall_s, min_rate=min_rate,
                pinned=pinned, headers_only=headers_only)


async def http_get_async(fs, path: str, a: int, b: int, headers: dict, size: int | None, *, url: str,
                         stall_s: float = STALL_S, min_rate: float = MIN_RATE,
                         pinned: dict | None = None, headers_only: bool = False) -> tuple[bytes, bool]:
    """Bytes [a, b) by one ranged GET on fsspec's aiohttp session, checking the answer as it comes (a coroutine
    of fsspec's IO loop, ``fs.loop``). ``headers_only``: the answer's validators are checked (and learned into
    ``pinned``), its body is not read: ``(b"", False)`` (a server ignoring Range would send the whole file).

    Returns ``(data, whole)``: ``whole`` when the server ignored Range and sent the whole file, which ``data``
    then is (the caller keeps it, so no later read or retry fetches it again).

    * The headers must announce exactly the bytes asked for (206 with that Content-Length and Content-Range):
      a server announcing more than it sends would otherwise hold each read until the socket timeout, for every
      retry. Any other announcement raises at once, before the body (:class:`Lying`, not retried), a 206 without
      Content-Range too (its body could be any bytes). A Content-Range giving another total size than ``size``
      (the size pinned) is :class:`FileChangedError`: the file changed on the server.
    * The body must keep coming: no pause over ``stall_s`` and, past ``stall_s``, at least ``min_rate`` bytes/s
      on average (:class:`Stalled`, retried once). A server dripping a byte every few seconds never trips a socket
      read timeout by itself.
    * A server that ignores Range (200 and the whole file): the whole file is read up to ``WHOLE_MAX`` bytes; a
      larger file raises (:class:`Lying`).
    """
    import asyncio

    import aiohttp

    async def body(r, n: int) -> bytes:
        # One timer for the whole body (the average rate) and aiohttp's sock_read timer for pauses (it re-arms on
        # every packet anyway): a timer per chunk read cost ~0.15 ms of a worker's CPU per chunk, and a widened
        # 256 KiB request arrives in several chunks.
        budget = stall_s + n / min_rate
        try:
            return await asyncio.wait_for(r.content.readexactly(n), timeout=budget)
        except asyncio.IncompleteReadError as e:
            raise Truncated(f"{url}: the connection closed after {len(e.partial)} of {n} bytes") from None
        except aiohttp.ServerTimeoutError:  # sock_read: nothing for stall_s
            raise Stalled(f"{url}: the server stopped sending after {r.content.total_bytes} of {n} bytes (nothing "
                          f"for {stall_s:g} s)") from None
        except asyncio.TimeoutError:  # the whole body's budget
            raise Stalled(f"{url}: the server sent {r.content.total_bytes} of {n} bytes in {budget:.0f} s (less "
                          f"than {min_rate / 1024:.0f} KiB/s)") from None

    async def get():
        session = await fs.set_session()
        kw = dict(getattr(fs, "kwargs", {}) or {})
        h = {**(kw.pop("headers", None) or {}), **headers, "Range": f"bytes={a}-{b - 1}"}
        # the answer may pause stall_s at most (headers, or between body bytes), or less if the session says so
        t = kw.pop("timeout", None) or session.timeout
        kw["timeout"] = aiohttp.ClientTimeout(total=t.total, connect=t.connect, sock_connect=t.sock_connect,
                                              sock_read=min(t.sock_read or stall_s, stall_s))
        async with session.get(fs.encode_url(path), headers=h, **kw) as r:
            if r.status == 404:
                raise FileNotFoundError(url)
            r.raise_for_status()  # 412 -> FileChangedError in pinned_get; 5xx -> retried
            _check_validators(r.headers, headers, pinned if pinned is not None else {}, url, a, b)
            if headers_only:
                return b"", False
            n = r.content_length
            if r.status == 200:
                total = n if n is not None else size
                if total is None or (size is not None and total != size):
                    raise Lying(f"{url}: asked for bytes {a}-{b}, the server answered 200 with "
                                f"{total} bytes, not the file's {size}")
                if total > WHOLE_MAX and not (a == 0 and b == total):
                    raise Lying(f"{url}: the server ignores Range requests (answered 200 with the whole "
                                f"{total}-byte file for bytes {a}-{b}); files over {WHOLE_MAX} bytes are "
                                "not fetched whole. Use a server or mirror that supports Range")
                return await body(r, total), True
            if r.status != 206:
                raise Lying(f"{url}: unexpected HTTP status {r.status} for bytes {a}-{b}")
            # A 206 must say which bytes it holds (RFC 9110 14.4): without Content-Range a body shifted by a byte
            # would be cached as the range asked for, and blamed on the file when it fails to parse.
            cr = r.headers.get("Content-Range")
            if cr is None:
                raise Lying(f"{url}: asked for bytes {a}-{b}, the server answered 206 without Content-Range, so "
                            "which bytes its body holds is unknown (a misconfigured server or proxy)")
            m = _CONTENT_RANGE.fullmatch(cr.strip())
            if (n is not None and n != b - a) or m is None or (int(m[1]), int(m[2])) != (a, b - 1):
                raise Lying(f"{url}: asked for bytes {a}-{b} ({b - a} bytes), the server announced "
                            f"Content-Length {n}, Content-Range {cr}; it sends other bytes than "
                            "asked for (a misconfigured server or proxy)")
            if m[3] != "*" and size is not None and int(m[3]) != size:
                # the only sign of a change a server without validators gives mid-run: reading on would mix sizes
                raise FileChangedError(
                    f"{url}: the file changed on the server during this run (the answer for bytes {a}-{b} gives "
                    f"its size as {m[3]} bytes, this session first read {size}); nothing of the new version was "
                    "kept, so no item mixes two versions. Connect again to read the new version")
            return await body(r, b - a), False

    try:
        return await get()
    except aiohttp.ServerTimeoutError:  # sock_read before the headers (body() names its own)
        raise Stalled(f"{url}: no answer to the request for bytes {a}-{b} within {stall_s:g} s") from None


class PreconditionIgnored(Exception):
    """A server answered a conditional GET with bytes of another version than the one asked for (it ignores
    ``If-Match`` / ``If-Unmodified-Since``): taken as its 412 would be (:func:`precondition_failed`). ``kind``: the
    validator that differed, ``"etag"`` or ``"last_modified"``."""

    status = 412

    def __init__(self, message: str, kind: str = "etag"):
        super().__init__(message)
        self.kind = kind


def _check_validators(got, sent: dict, pinned: dict, url: str, a: int, b: int) -> None:
    """Refuse an answer whose ``ETag`` is not the version the request's ``If-Match`` named, or the weak ETag
    ``pinned`` (the version first described) holds, or the ETag this file's first answer carried; or, when no ETag
    of it was compared, whose ``Last-Modified`` is not the one ``If-Unmodified-Since`` named, ``pinned`` holds (when
    the answer carries no ETag) or this file's first answer carried. A server that does not evaluate conditions
    (Python's ``http.server``, some static hosts) would otherwise hand a running dataset the new bytes of a file
    changed at the same size, mixed with the old ones it holds; and one whose HEAD and GET answers carry different
    kinds of validator (Last-Modified on HEAD, ETag on GET, or the reverse) would leave nothing to compare but what
    its own answers said first, which ``pinned`` learns here (``seen_etag`` / ``seen_last_modified``; a key present
    as None is never learned: a server whose ETags are unstable). An answer with neither validator cannot be
    judged: the server's If-Match is then what pins the version.

    Raises:
        PreconditionIgnored: naming both versions (a 412 for :func:`pinned_get`: FileChangedError, after the
            remote checks a server farm's unstable ETags).
    """
    def tag(v):  # weak or strong, quoted or not (a lenient server's `ETag: abc`): the same version
        return v.strip().removeprefix("W/").strip('"') if v else v

    want = tag(sent.get("If-Match") or pinned.get("weak_etag") or pinned.get("seen_etag"))
    have = tag(got.get("ETag"))
    if have and not want and "seen_etag" not in pinned:
        pinned["seen_etag"] = have  # the version this file's answers carry from now on
    if want and have and want != have:
        raise PreconditionIgnored(f"{url}: Precondition Failed: asked for bytes {a}-{b} of ETag {want}, the server "
                                  f"answered with ETag {have} (it ignores If-Match)")
    if want and have:
        return
    have = got.get("Last-Modified")
    want = sent.get("If-Unmodified-Since") or (pinned.get("last_modified") if not got.get("ETag") else None) \
        or pinned.get("seen_last_modified")
    if have and not want and not pinned.get("last_modified") and "seen_last_modified" not in pinned:
        pinned["seen_last_modified"] = have.strip()
    if want and have and str(want).strip() != have.strip():
        raise PreconditionIgnored(f"{url}: Precondition Failed: asked for bytes {a}-{b} of the version of {want}, "
                                  f"the server answered with Last-Modified {have} (it ignores If-Unmodified-Since)",
                                  kind="last_modified")


def s3_get(fs, path: str, a: int, b: int, etag: str) -> bytes:
    """A ranged S3 GetObject with ``IfMatch`` (s3fs's cat_file takes no conditions)."""
    from fsspec.asyn import sync

    bucket, key, _ = fs.split_path(path)

    async def get():
        resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={a}-{b - 1}", IfMatch=etag)
        try:
            return await resp["Body"].read()
        finally:
            resp["Body"].close()

    return sync(fs.loop, get)


def _http_conditions(pin: dict) -> dict:
    """``If-Match`` with a strong ETag, else ``If-Unmodified-Since`` with the Last-Modified date, else none."""
    return ({"If-Match": pin["etag"]} if pin.get("etag")
            else {"If-Unmodified-Since": pin["last_modified"]} if pin.get("last_modified") else {})


def _pin_http(fs, path: str, a: int, b: int, pin: dict, **kw: Any) -> tuple[bytes, bool]:
    return http_get(fs, path, a, b, _http_conditions(pin), pin.get("size"), pinned=pin, **kw)


async def _pin_http_async(fs, path: str, a: int, b: int, pin: dict, **kw: Any) -> tuple[bytes, bool]:
    return await http_get_async(fs, path, a, b, _http_conditions(pin), pin.get("size"), pinned=pin, **kw)


def _pin_s3(fs, path: str, a: int, b: int, pin: dict, **kw: Any) -> tuple[bytes, bool]:
    """The version id when the bucket is versioned, else ``IfMatch`` with the ETag (s3fs), else unpinned."""
    if pin.get("version_id"):
        return fs.cat_file(path, start=a, end=b, version_id=pin["version_id"]), False
    if pin.get("etag") and hasattr(fs, "_call_s3"):
        return s3_get(fs, path, a, b, pin["etag"]), False
    return fs.cat_file(path, start=a, end=b), False


def _unpinned(fs, path: str, a: int, b: int, pin: dict, **kw: Any) -> tuple[bytes, bool]:
    return fs.cat_file(path, start=a, end=b), False


# protocol -> how a range read is pinned to the version in ``pin`` (the cached info): (data, whole file?).
PINNERS: dict[str, Callable[..., tuple[bytes, bool]]] = {
    "http": _pin_http, "https": _pin_http, "s3": _pin_s3, "s3a": _pin_s3,
}
# ... and the coroutine of fsspec's IO loop doing the same, for the protocols whose reads run there: several range
# reads are then one round on the loop (pinned_get_many) instead of one thread and one loop hop each.
ASYNC_PINNERS: dict[str, Callable[..., Any]] = {"http": _pin_http_async, "https": _pin_http_async}


def pinned_get(fs, path: str, a: int, b: int, pin: dict, *, url: str, stall_s: float = STALL_S,
               min_rate: float = MIN_RATE) -> tuple[bytes, bool]:
    """Bytes [a, b) of the version of ``path`` described by ``pin`` (its first :func:`describe`), by the
    protocol's entry in ``PINNERS`` (other protocols: unpinned). The server refuses (412) once the file changed.

    Returns:
        ``(data, whole)`` as :func:`http_get` (``whole`` only from a server that ignores Range).

    Raises:
        FileChangedError: the file no longer matches ``pin``; no bytes of the new version were read.
    """
    try:
        return PINNERS.get(protocol(fs), _unpinned)(fs, path, a, b, pin, url=url, stall_s=stall_s,
                                                   min_rate=min_rate)
    except Exception as e:  # noqa: BLE001 - each library reports a 412 its own way
        changed = _changed(e, pin, url, a, b)
        if changed is not None:
            raise changed from e
        raise


def _changed(e: BaseException, pin: dict, url: str, a: int, b: int) -> FileChangedError | None:
    """The FileChangedError for a pinned read of bytes [a, b) that failed with ``e``, when ``e`` is the server's
    412 (the version pinned is gone); else None."""
    if not precondition_failed(e):
        return None
    return FileChangedError(
        f"{url}: the file changed on the server during this run (it no longer matches "
        f"{version_named(pin)}, the version first read); bytes {a}-{b} were not read, so no item mixes two versions. Connect again to read the "
        "new version")


def pinned_get_many(fs, spans: list[tuple[str, int, int, dict, str]], *, stall_s: float = STALL_S,
                    min_rate: float = MIN_RATE) -> list[tuple[Any, BaseException | None]] | None:
    """One try of :func:`pinned_get` for each ``(path, a, b, pin, url)`` of ``spans``, all in one round on fsspec's
    IO loop (at most ``FETCH_THREADS`` requests at once), for a protocol in ``ASYNC_PINNERS``; None for the others
    (the caller then reads the spans in threads, :func:`fetch_each`).

    Why: a range read in a thread of its own pays that thread's hand-off, a hop onto the loop and back, and the GIL
    passed between them, on top of the request itself: measured here ~0.3 ms of CPU per 16 KiB request over a
    throttled 100 Mbit/s loopback link, ~40% of the request's cost. A pipelined batch asks for a few ranges of a
    few files at once.

    Returns:
        ``((data, whole), None)`` or ``(None, exception)`` per span, in order; a 412 is already a
        FileChangedError. Nothing is retried here: the caller retries each failed span by itself (:func:`call`
        with ``failed=``).
    """
    pinner = ASYNC_PINNERS.get(protocol(fs))
    if pinner is None:
        return None
    import asyncio

    from fsspec.asyn import sync

    async def one(gate: asyncio.Semaphore, path: str, a: int, b: int, pin: dict, url: str):
        async with gate:
            try:
                return await pinner(fs, path, a, b, pin, url=url, stall_s=stall_s, min_rate=min_rate), None
            except Exception as e:  # noqa: BLE001 - classified by the caller's retry (call)
                changed = _changed(e, pin, url, a, b)
                if changed is not None:
                    changed.__cause__ = e
                    return None, changed
                return None, e

    async def every():
        gate = asyncio.Semaphore(FETCH_THREADS)
        return await asyncio.gather(*(one(gate, *span) for span in spans))

    return sync(fs.loop, every)


def _try(fn, arg):
    """(fn(arg), None) or (None, the exception): parallel fetches report failures after the others are stored."""
    try:
        return fn(arg), None
    except BaseException as e:  # noqa: BLE001 - re-raised by the caller
        return None, e


_POOL: tuple[int, Any] | None = None


def _pool():
    """The process's fetch threads (re-created after a fork: a pool's threads do not survive one)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), concurrent.futures.ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="lsql-fetch"))
    return _POOL[1]


def fetch_each(fn: Callable[[tuple[int, int]], bytes], spans: list[tuple[int, int]]) -> list[tuple[Any, Any]]:
    """``fn(span)`` for each span, at most ``FETCH_THREADS`` at once (one span: in this thread). Returns
    ``(data, None)`` or ``(None, exception)`` per span, in order: a failure is raised by the caller after the
    other spans are stored."""
    if len(spans) == 1:
        return [_try(fn, spans[0])]
    return list(_pool().map(lambda g: _try(fn, g), spans))
