"""Constants and comparison helpers shared by the tests (imported by name: ``from helpers import ...``).

Kept out of conftest.py because pytest loads every conftest.py under the module name ``conftest``: a test that
imports from ``conftest`` could get tests/faults/conftest.py instead.

Two tiers of test data (tests/README.md):

* **In the repo** (first tier, always present): the datasets lerobot's own writer produced from synthetic content,
  in ``sample/`` (``small20`` is also the demo's and the README's sample), their lerobot reference items in
  ``tests/data/reference/`` and the frame-identity code ``tests/data/framecode.py``. ``DATASETS / name`` and
  ``load_reference(name)`` read these.
* **External real-data corpus** (second tier): the sets fetched from other public repositories (``REAL_SETS``) and
  the G1 reference items, never committed. They live in ``$LSQL_SHARED`` (default ``../shared`` beside the repo);
  ``real_root(name)`` / ``load_reference("g1_real_v30")`` skip the test with ``REAL_SKIP_REASON`` when it is absent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
TEST_DATA = REPO / "tests" / "data"
DATASETS = REPO / "sample"                      # the generated sets shipped in the repo (one copy of small20)
REFERENCE = TEST_DATA / "reference"             # lerobot 0.4.4's items for the shipped sets
FRAMECODE = TEST_DATA / "framecode.py"
SAMPLE = DATASETS / "small20"

SHARED = Path(os.environ.get("LSQL_SHARED", REPO.parent / "shared"))
REAL_DATASETS = SHARED / "datasets"
REAL_REFERENCE = SHARED / "reference"
REAL_SETS = frozenset({"g1_real_v30", "g1_real_v21", "record-test", "oc_models_meta_only",
                       "aloha_sim_transfer_cube_human_prerelease_meta_only"})
REAL_SKIP_REASON = f"external real-data corpus not found at {REAL_DATASETS}; set LSQL_SHARED"

# The lerobot peer: an interpreter with lerobot 0.4.4 for the tests that compare with lerobot live (the corpus
# folder's tools/install_peer.sh DIR makes one; CI installs it). $LSQL_PEER_PYTHON, else a venv named peer beside
# the checkout (as the corpus is); missing, those tests skip naming LSQL_PEER_PYTHON.
PEER_PYTHON = os.environ.get("LSQL_PEER_PYTHON") or str(REPO.parent / "peer" / "bin" / "python")

# Every set with lerobot reference items; g1_real_v30's are in the real-data corpus (second tier).
REFERENCE_SETS = ["small20", "multifile60", "h264_20", "img5_extras", "g1_real_v30"]


def real_corpus_present() -> bool:
    return REAL_DATASETS.is_dir()


def need_real_corpus() -> None:
    """Skip the calling test (second tier) when the external real-data corpus is absent."""
    if not real_corpus_present():
        pytest.skip(REAL_SKIP_REASON)


def real_root(name: str) -> Path:
    """Root of the real (fetched) dataset NAME in the external corpus; skips the test when the corpus is absent."""
    assert name in REAL_SETS, f"{name} is not a real-data set: use DATASETS / {name!r}"
    need_real_corpus()
    return REAL_DATASETS / name


def data_root(name: str) -> Path:
    """Root of dataset NAME, shipped or real: for tests parametrized over both tiers (a real one skips if absent)."""
    return real_root(name) if name in REAL_SETS else DATASETS / name


def load_reference(name: str):
    """(json dict, npz) of lerobot's reference items for NAME (tests/data/reference, or the corpus for real sets)."""
    if name in REAL_SETS:
        need_real_corpus()
        base = REAL_REFERENCE
    else:
        base = REFERENCE
    return json.loads((base / f"{name}.json").read_text()), np.load(base / f"{name}.npz")


def exp_bounds(root: Path, mode_options: dict) -> dict[str, float]:
    """{feature key: absolute bound} for the values of an item that lerobot computes through a transcendental
    function, whose last bit depends on the CPU (tests/README.md, "Exact and bounded comparisons").

    Only depth videos quantized with ``use_log`` and read in metres qualify: lerobot 0.6.1 dequantizes them with
    torch's vectorised ``exp_`` (then ``sub_(shift)``), and torch picks its SIMD kernel by CPU (AVX2, AVX-512), whose
    results may differ in the last bit. That is at most 1 ulp of the exponential's output (at most ``depth_max +
    shift`` metres), plus the subtraction's own rounding of at most 1 ulp of the same magnitude: the bound is 2 ulp
    of float32(depth_max + shift) (1.9e-6 m for lerobot's defaults 10 m and 3.5). In mm the values are rounded to
    whole millimetres, and PNG / TIFF depth images are divided by 1000 (correctly rounded everywhere): exact."""
    if mode_options.get("depth_output_unit") != "m":
        return {}
    info = json.loads((Path(root) / "meta" / "info.json").read_text())
    out = {}
    for key, ft in info["features"].items():
        fi = ft.get("info") or {}
        if ft.get("dtype") == "video" and fi.get("is_depth_map") and fi.get("video.use_log", True):
            top = float(fi.get("video.depth_max", 10.0)) + float(fi.get("video.shift", 3.5))
            out[key] = 2 * float(np.spacing(np.float32(top)))
    return out


def assert_item_equals_reference(item: dict, ref_json_item: dict, npz, mode: str,
                                 bounds: dict[str, float] | None = None) -> None:
    """Comparison of one of our items with lerobot's (keys, dtypes, shapes, values, task): exact, except the keys
    in ``bounds`` (``exp_bounds``: floats computed through ``exp``, within the stated absolute bound)."""
    idx = ref_json_item["index"]
    spec = ref_json_item[mode]
    prefix = f"{mode}/{idx}/"
    expected_keys = {k[len(prefix):] for k in npz.files if k.startswith(prefix)} | {"task"}
    assert set(item) == expected_keys, f"index {idx} {mode}: keys differ: {set(item) ^ expected_keys}"
    assert item["task"] == spec["scalars"]["task"]
    for key, meta in spec["keys"].items():
        ours = item[key]
        assert str(ours.dtype).removeprefix("torch.") == meta["dtype"], (idx, key, ours.dtype)
        assert list(ours.shape) == meta["shape"], (idx, key, ours.shape)
        ref = npz[meta["npz"]]
        got = ours.numpy()
        if meta.get("stored_dtype") == "uint8":
            # lerobot computes float32(u8)/255; compare in that exact form.
            ref = ref.astype(np.float32) / np.float32(255)
        if bounds and key in bounds:
            np.testing.assert_allclose(got, ref, rtol=0, atol=bounds[key], err_msg=f"index {idx} {mode} {key}")
        else:
            np.testing.assert_array_equal(got, ref, err_msg=f"index {idx} {mode} {key}")


def assert_items_equal(a: dict, b: dict) -> None:
    """Two items hold the same keys, and equal values: tensors of the same dtype bit for bit, other values by ==."""
    import torch

    assert set(a) == set(b)
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def decode_planar_and_packed(src, rel: str, cache_dir, rows=(3, 50, 51)):
    """Frames ``rows`` of mp4 ``rel`` decoded twice: by the pool (planar GBR conversion where it was checked equal)
    and by a decoder forced onto packed rgb24; (planar, packed) uint8 (N, 3, H, W) arrays, for tests comparing the
    two conversions."""
    from lerobot_sql._readers import decode, video_index

    index = video_index.FrameIndex.load(video_index.ensure_index_arrow(src, rel, cache_dir))
    rows = np.array(rows)
    a = decode.DecoderPool(src).decode_chw(index, rows)
    f = decode._OpenFile(src, rel, 1)
    f.planar = False  # force the packed rgb24 path
    b = np.empty_like(a)
    f.decode_into(index, rows, b, 2)
    return a, b


def rename_column(name: str, rename: dict) -> str:
    """A data or meta/episodes column name with every feature name in ``rename`` replaced (the feature's own
    column, and its ``videos/<key>/...`` and ``stats/<feature>/...`` columns)."""
    if name in rename:
        return rename[name]
    for kind in ("videos/", "stats/"):
        if name.startswith(kind):
            feat, rest = name[len(kind):].rsplit("/", 1)
            if feat in rename:
                return f"{kind}{rename[feat]}/{rest}"
    return name


def rename_parquet_columns(path: Path, rename: dict) -> None:
    """Rewrite the Parquet file at ``path`` with its columns renamed by :func:`rename_column`."""
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    meta = t.schema.metadata
    t = t.rename_columns([rename_column(c, rename) for c in t.column_names])
    pq.write_table(t.replace_schema_metadata(meta), path)


def renamed_copy(orig: Path, dst: Path, rename: dict) -> Path:
    """A copy of the v3 dataset ``orig`` with the features in ``rename`` renamed everywhere lerobot stores a
    feature's name (info.json, data and meta/episodes columns, the videos/<key>/ folders)."""
    import shutil

    shutil.copytree(orig, dst)
    info = json.loads((dst / "meta/info.json").read_text())
    info["features"] = {rename.get(k, k): v for k, v in info["features"].items()}
    (dst / "meta/info.json").write_text(json.dumps(info, indent=2))
    for f in sorted(dst.glob("data/*/*.parquet")) + sorted(dst.glob("meta/episodes/*/*.parquet")):
        rename_parquet_columns(f, rename)
    for old, new in rename.items():
        if (dst / "videos" / old).is_dir():
            (dst / "videos" / old).rename(dst / "videos" / new)
    stats = dst / "meta/stats.json"
    if stats.exists():
        stats.write_text(json.dumps({rename.get(k, k): v for k, v in json.loads(stats.read_text()).items()}))
    return dst


def shortened_vector_copy(orig: Path, dst: Path, feature: str, n: int) -> Path:
    """A copy of the v3 dataset ``orig`` whose vector ``feature`` keeps only its first ``n`` elements (info.json
    shape and names, the data files' values), as a dataset of another robot would have it."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.copytree(orig, dst)
    info = json.loads((dst / "meta/info.json").read_text())
    info["features"][feature]["shape"] = [n]
    info["features"][feature]["names"] = info["features"][feature]["names"][:n]
    (dst / "meta/info.json").write_text(json.dumps(info))
    for f in dst.glob("data/*/*.parquet"):
        t = pq.read_table(f)
        col = pa.array([v[:n] for v in t[feature].to_pylist()], pa.list_(pa.float32()))
        pq.write_table(t.set_column(t.column_names.index(feature), feature, col), f)
    return dst


def extra_feature_copy(orig: Path, dst: Path, name: str, dtype: str = "float32") -> Path:
    """A copy of the v3 dataset ``orig`` (small20-like: a float32 (6,) ``observation.state``) with one more feature,
    ``name`` of shape [6], declared in info.json and stored in the data files: ``observation.state * 2 + 1`` as
    ``dtype`` (``bool``: ``observation.state > 0``), so that its values are told apart from every other key's."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.copytree(orig, dst)
    info = json.loads((dst / "meta/info.json").read_text())
    info["features"][name] = {"dtype": dtype, "shape": [6], "names": None}
    (dst / "meta/info.json").write_text(json.dumps(info, indent=2))
    for f in dst.glob("data/*/*.parquet"):
        t = pq.read_table(f)
        state = t["observation.state"].combine_chunks().flatten().to_numpy(zero_copy_only=False)
        values = state > 0 if dtype == "bool" else (state * 2 + 1).astype(dtype)
        col = pa.FixedSizeListArray.from_arrays(pa.array(values), 6)
        pq.write_table(t.append_column(name, col), f)
    return dst


def feature_values(root: Path, name: str, index: int) -> np.ndarray:
    """The values of feature ``name`` at frame ``index`` in the data files of ``root``, read with pyarrow alone."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    for f in sorted(Path(root).glob("data/*/*.parquet")):
        t = pq.read_table(f, columns=["index", name])
        hit = t.filter(pc.equal(t["index"], index))
        if hit.num_rows:
            return np.asarray(hit[name][0].as_py())
    raise KeyError(index)

FRONT_MP4 = "videos/observation.images.front/chunk-000/file-000.mp4"
WRIST_MP4 = "videos/observation.images.wrist/chunk-000/file-000.mp4"


def muxed_copy(orig: Path, dst: Path, streams: list[str], audio: bool = False) -> Path:
    """A writable copy of small20-like ``orig`` whose front camera's mp4 holds the video streams of ``streams``
    (relative mp4 paths of ``orig``), stream-copied in that order (no re-encode), and with ``audio`` a second of
    silent AAC after them. ``streams=[WRIST_MP4, FRONT_MP4]``: the wrist camera muxed as stream 0, the front as
    stream 1, as a recorder muxing all cameras into one file writes it."""
    import shutil

    import av

    shutil.copytree(orig, dst)
    for p in dst.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    out_path = dst / FRONT_MP4
    out_path.unlink()
    with contextlib.ExitStack() as stack:
        inputs = [stack.enter_context(av.open(str(orig / rel))) for rel in streams]
        out = stack.enter_context(av.open(str(out_path), "w", format="mp4"))
        # opaque: the packets are copied, so no encoder is needed (AV1's decoder name, libdav1d, has none)
        pairs = [(c, c.streams.video[0], out.add_stream_from_template(c.streams.video[0], opaque=True))
                 for c in inputs]
        sound = out.add_stream("aac", rate=16000) if audio else None
        for c, s_in, s_out in pairs:
            for pkt in c.demux(s_in):
                if pkt.dts is None:  # the demuxer's final empty packet
                    continue
                pkt.stream = s_out
                out.mux(pkt)
        if sound is not None:
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 16000), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 16000, 0
            for pkt in [*sound.encode(frame), *sound.encode(None)]:
                out.mux(pkt)
    return dst


# ---- the command line, in-process ------------------------------------------------------------------------------------
class CliResult:
    """What one ``lerobot-sql`` run gave: ``returncode``, ``stdout``, ``stderr`` (text), as subprocess.run's."""

    def __init__(self, args: list[str], returncode: int, stdout: str, stderr: str):
        self.args, self.returncode, self.stdout, self.stderr = args, returncode, stdout, stderr

    def __repr__(self) -> str:
        return f"CliResult({self.args!r}, returncode={self.returncode}, stdout={self.stdout!r}, stderr={self.stderr!r})"


_LINK_POOL: dict[Path, Path] = {}


def linked_copy(src: Path, dst: Path) -> Path:
    """A copy of dataset folder ``src`` at ``dst`` whose files are hard links, cheap for tests that replace one or two
    files (unlink the file first, then write it: never write through a link).

    The links point into a private copy of ``src`` made once per test process, never at ``src`` itself: a new link
    changes its inode's ctime, which is part of a local file's identity (``_storage.source.local_identity``), so
    linking the shipped sets would make another test process reading them at that moment see "the file changed
    after the dataset was opened"."""
    import atexit
    import shutil
    import tempfile

    src = Path(src).resolve()
    pool = _LINK_POOL.get(src)
    if pool is None:
        base = Path(tempfile.mkdtemp(prefix="lsql_link_pool_"))
        atexit.register(shutil.rmtree, base, True)
        pool = _LINK_POOL[src] = base / src.name
        shutil.copytree(src, pool)
    shutil.copytree(pool, dst, copy_function=os.link)
    return Path(dst)


def wall_clock(root: Path, factor: float, fps: float = 30, seed: int = 0) -> None:
    """Rewrite every data file's timestamps under ``root`` as a clock running at ``factor`` times real time plus
    +-4 ms of jitter (0 at each episode's start): over small20's episodes (up to 13 s) 0.9 lags up to 1.3 s behind
    frame_index / fps, 1.1 runs up to 1.3 s ahead. The videos keep their frames on the fps grid, as lerobot writes
    them, so each clip holds exactly ``length`` frames at k / fps (what ``align="frame_index"`` reads)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    for path in sorted(Path(root).glob("data/**/*.parquet")):
        t = pq.read_table(path)
        fi = t["frame_index"].to_numpy()
        ts = np.where(fi > 0, fi / fps * factor + rng.uniform(-0.004, 0.004, len(fi)), 0.0).astype(np.float32)
        i = t.column_names.index("timestamp")
        pq.write_table(t.set_column(i, "timestamp", pa.array(ts, t.schema.field(i).type)), path)


@dataclasses.dataclass
class CtrlC:
    """What :func:`ctrl_c_from_outside` saw: the exit code, both streams, the seconds from the last signal sent
    before "interrupted" appeared to it (None: never), and how many signals were sent."""
    returncode: int
    stdout: str
    stderr: str
    secs: float | None
    sent: int


def as_from_a_terminal() -> None:
    """``preexec_fn`` for a child that a test sends Ctrl-C: in the child before exec, SIGINT at its default action
    and not blocked, as a shell starts a foreground command. A child inherits both from the process that starts it: a
    test worker whose SIGINT is ignored or blocked (left so by an earlier test, or by how the worker was started)
    passes that on, and the child then never acts on the signal (a process started with SIGINT ignored, e.g. `cmd &`
    from a script, keeps it ignored: Python installs no handler, and neither does lerobot_sql)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if hasattr(os, "sched_setscheduler"):  # Linux: a real-time parent's policy is inherited
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def ctrl_c_from_outside(args: list[str], *, stdin: str | None = None, start_after: str | None = None,
                        env: dict | None = None, limit_s: float = 200) -> CtrlC:
    """Run ``python ARGS`` and send it SIGINT as a terminal's Ctrl-C does, from this process, after a second and then
    every 5 s until it says "interrupted" (stdout or stderr) or exits (``start_after``: only once that text came on its stdout, e.g. a first
    statement's result). Returns a :class:`CtrlC`.

    Why from outside: a sender thread inside the process (the earlier helper) needs the GIL to send, and with two
    DuckDB threads on a loaded machine the query's main thread held it for the whole query: the signal was never
    sent, and the test failed in the fast tier while passing alone."""
    import signal
    import subprocess
    import sys
    import threading
    import time

    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    p = subprocess.Popen([sys.executable, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, cwd=REPO, preexec_fn=as_from_a_terminal)
    out: list[str] = []
    err: list[str] = []
    seen = {"started": start_after is None, "interrupted": None}

    def read(stream, into, key):
        for line in stream:
            into.append(line)
            if key == "out" and start_after is not None and start_after in line:
                seen["started"] = True
            if "interrupted" in line and seen["interrupted"] is None:
                seen["interrupted"] = time.monotonic()

    readers = [threading.Thread(target=read, args=(p.stdout, out, "out"), daemon=True),
               threading.Thread(target=read, args=(p.stderr, err, "err"), daemon=True)]
    for t in readers:
        t.start()
    if stdin:
        p.stdin.write(stdin)
    p.stdin.close()
    sent: list[float] = []
    t0 = time.monotonic()
    try:
        while p.poll() is None and seen["interrupted"] is None and time.monotonic() - t0 < limit_s:
            # the first signal a second after the start, then one every 5 s: a signal sent after the process said
            # "interrupted" but before this side read it would land in its exit (Python's handlers are gone by then:
            # killed by SIGINT, -2); 5 s leaves the readers time to see the word first
            waited = 0.0
            while waited < (1.0 if not sent else 5.0) and p.poll() is None and seen["interrupted"] is None:
                time.sleep(0.05)
                waited += 0.05
            if seen["started"] and seen["interrupted"] is None and p.poll() is None:
                sent.append(time.monotonic())
                p.send_signal(signal.SIGINT)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    for t in readers:
        t.join(10)
    at = seen["interrupted"]
    before = [t for t in sent if at is not None and t <= at]
    return CtrlC(p.returncode, "".join(out), "".join(err), (at - before[-1]) if before else None, len(sent))


def run_cli(*args, stdin: str | None = None, cwd: Path | None = None, env: dict | None = None,
            merge_stderr: bool = False) -> CliResult:
    """Run ``lerobot-sql ARGS`` in this process: ``lerobot_sql.cli.main(argv)`` with stdin, stdout and stderr
    swapped for in-memory pipes (not terminals, as for a child with captured output), ``cwd`` and ``env`` applied
    for the call and restored after, argparse's SystemExit turned into the exit code. ``merge_stderr`` sends both
    streams to one pipe (what a user sees with ``2>&1``). The few behaviours that need a real process (the console
    script, ``python -m``, signals from outside, a terminal, a broken pipe) keep their subprocess tests."""
    import io
    import sys
    import warnings

    from lerobot_sql.cli import main

    argv = [str(a) for a in args]
    out_b, err_b = io.BytesIO(), io.BytesIO()
    out = io.TextIOWrapper(out_b, encoding="utf-8", write_through=True)
    err = out if merge_stderr else io.TextIOWrapper(err_b, encoding="utf-8", write_through=True)
    inp = io.TextIOWrapper(io.BytesIO((stdin or "").encode()), encoding="utf-8")
    saved = sys.stdin, sys.stdout, sys.stderr
    old_cwd = os.getcwd()
    old_env = {k: os.environ.get(k) for k in (env or {})}
    code: int
    try:
        os.chdir(cwd or REPO)
        for k, v in (env or {}).items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        sys.stdin, sys.stdout, sys.stderr = inp, out, err
        # a fresh filter state (as a new interpreter's): main() installs its warning printer, and warnings an
        # earlier test already showed are shown again (the filters' change resets each module's registry)
        with warnings.catch_warnings():
            warnings.resetwarnings()
            warnings.simplefilter("default")
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", category)  # as Python's own defaults outside __main__
            try:
                code = main(argv)
            except SystemExit as e:  # argparse (usage errors, --help, --version)
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except (OSError, ValueError):
                pass
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
        os.chdir(old_cwd)
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    text = out_b.getvalue().decode("utf-8", "replace")
    return CliResult(argv, int(code or 0), text, text if merge_stderr else err_b.getvalue().decode("utf-8", "replace"))


MP4_CONTAINERS = (b"moov", b"trak", b"mdia", b"minf", b"stbl", b"edts", b"dinf")


def mp4_boxes(buf: bytes) -> list:
    """An mp4's boxes as ``[type, payload]`` lists, container boxes' payloads parsed into such lists (32-bit
    sizes, as FFmpeg writes them): edit them, then :func:`write_mp4_boxes`. Inserting into a moov written before its
    mdat moves the media; FFmpeg and PyAV write the moov last."""
    import struct

    out, off = [], 0
    while off + 8 <= len(buf):
        size, typ = struct.unpack_from(">I4s", buf, off)
        body = buf[off + 8:off + size]
        out.append([typ, mp4_boxes(body) if typ in MP4_CONTAINERS else body])
        off += size
    return out


def write_mp4_boxes(boxes: list) -> bytes:
    import struct

    out = b""
    for typ, body in boxes:
        body = write_mp4_boxes(body) if isinstance(body, list) else body
        out += struct.pack(">I4s", 8 + len(body), typ) + body
    return out


def mp4_child(boxes: list, *path: bytes) -> list:
    """The payload list of the first box of each type along ``path`` (``mp4_child(top, b"moov", b"trak")``)."""
    for typ in path:
        boxes = next(b for b in boxes if b[0] == typ)[1]
    return boxes


def language_copy(orig: Path, dst: Path, persistent: dict, events: dict, inferred: bool = False) -> Path:
    """A copy of the v3 dataset ``orig`` with lerobot 0.6's two language columns added to its data files, in exactly
    the Arrow types of lerobot 0.6.1's ``datasets/language.py`` (``tool_calls`` a list of ``pa.json_()``) and declared
    in info.json as its ``language_feature_info()`` does, filled as its annotation writer fills them.

    Args:
        persistent: episode_index -> list of message dicts (role, content, style, timestamp, camera, tool_calls):
            written on every frame of that episode (lerobot broadcasts an episode's persistent slice).
        events: (episode_index, frame_index) -> list of message dicts without timestamp: written on that frame.
        inferred: the types pyarrow infers from the messages instead (``pa.array(rows)``), as lerobot 0.6.1's
            annotation writer (``annotations/steerable_pipeline/writer.py``, ``_materialize_table``) leaves them:
            ``tool_calls`` a list of structs, or nulls where no message has one.
    """
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    # pa.json_() came in pyarrow 19; an older pyarrow (the floor, 16) reads lerobot's json columns as their storage
    # type, a string, which is what it writes here
    json_t = pa.json_() if hasattr(pa, "json_") else pa.string()
    with_ts = [pa.field("role", pa.string(), nullable=False), pa.field("content", pa.string()),
               pa.field("style", pa.string()), pa.field("timestamp", pa.float32(), nullable=False),
               pa.field("camera", pa.string()), pa.field("tool_calls", pa.list_(json_t))]
    no_ts = [f for f in with_ts if f.name != "timestamp"]

    def column(rows: list[list[dict]], fields) -> pa.Array:
        if inferred:  # the writer's dicts, keys in its order (_normalize_row), types left to pyarrow
            return pa.array([[{f.name: m.get(f.name) for f in fields} for m in row] for row in rows])
        msgs = [m for row in rows for m in row]
        calls = [m.get("tool_calls") for m in msgs]
        flat = [json.dumps(c) for cs in calls for c in (cs or [])]
        offsets, n = [], 0
        for cs in calls:
            offsets.append(n)
            n += len(cs or [])
        offsets.append(n)
        mask = pa.array([c is None for c in calls])
        storage = pa.array(flat, pa.string())
        values = pa.ExtensionArray.from_storage(json_t, storage) if isinstance(json_t, pa.BaseExtensionType) \
            else storage
        call_arr = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values, mask=mask)
        arrays = [call_arr if f.name == "tool_calls" else pa.array([m.get(f.name) for m in msgs], f.type)
                  for f in fields]
        structs = pa.StructArray.from_arrays(arrays, fields=fields)
        row_offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(row_offsets), structs)

    shutil.copytree(orig, dst)
    info = json.loads((dst / "meta/info.json").read_text())
    info["features"]["language_persistent"] = {"dtype": "language", "shape": [1], "names": None}
    info["features"]["language_events"] = {"dtype": "language", "shape": [1], "names": None}
    (dst / "meta/info.json").write_text(json.dumps(info, indent=2))
    for f in sorted(dst.glob("data/*/*.parquet")):
        t = pq.read_table(f)
        eps, frames = t["episode_index"].to_pylist(), t["frame_index"].to_pylist()
        pers = [persistent.get(e, []) for e in eps]
        evs = [events.get((e, i), []) for e, i in zip(eps, frames)]
        t = t.append_column("language_persistent", column(pers, with_ts))
        t = t.append_column("language_events", column(evs, no_ts))
        pq.write_table(t, f)
    return dst
