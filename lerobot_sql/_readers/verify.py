"""Decoding checks of a dataset's files, for ``lerobot-sql doctor`` (its opt-in ``decode=True`` checks, and the data
files it cannot read): every data file's pages read, every image cell decoded, every mp4 decoded front to back and
compared with its index (the pts of its demuxed packets), and a seek to its keyframes as the readers seek.

What no view can hold: the doctor gathers the files and clips through SQL and hands them here; this module reads
bytes only (PyAV, PIL, pyarrow), no DuckDB. Each finding is one dict, the doctor's violation row.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._format.layout import Layout
from .._storage.source import Source
from . import decode, video_index


def undecodable_data_files(src: Source, data_files) -> list[dict[str, Any]]:
    """The data files (and first row group) of ``data_files`` (paths relative to ``src``) pyarrow cannot decode:
    ``path``, ``row_group`` (None: the footer), ``error``."""
    bad = []
    for rel in data_files:
        try:
            with src.open(rel) as f:
                pf = pq.ParquetFile(f)
                for rg in range(pf.num_row_groups):
                    try:
                        pf.read_row_group(rg, use_threads=False)  # one thread: see Source.open
                    except (pa.ArrowException, OSError) as e:
                        bad.append({"path": rel, "row_group": rg, "error": f"{type(e).__name__}: {e}"})
                        break
        except (pa.ArrowException, OSError) as e:
            bad.append({"path": rel, "row_group": None, "error": f"{type(e).__name__}: {e}"})
    return bad


def undecodable_images(src: Source, layout: Layout, batch_rows: int = 64) -> list[dict[str, Any]]:
    """Decode every cell of every image feature in the data files (``layout``'s, read through ``src``) with PIL
    (``Image.open`` then ``load``: the whole image, as an item's ``np.asarray`` does).

    Returns:
        One dict per cell that fails, in file and row order: ``path`` (the data file, relative to the root),
        ``row`` (in the file), ``episode_index``, ``index`` (None where the file lacks the column), ``column``,
        ``error`` (what is wrong, the items' wording: "holds no image bytes", "is not a readable image (OSError:
        image file is truncated)"). A data file that does not read is left to ``data_files_decode``.
    """
    from PIL import Image

    out = []
    for rel in layout.data_files:
        try:
            with src.open(rel) as fh:
                pf = pq.ParquetFile(fh)
                names = pf.schema_arrow.names
                cols = [k for k in layout.image_keys if k in names]
                if not cols:
                    continue
                ids = [c for c in ("episode_index", "index") if c in names]
                row0 = 0
                # a few rows at a time: images can be large, and only one batch's bytes are held
                for batch in pf.iter_batches(batch_size=batch_rows, columns=ids + cols, use_threads=False):
                    where = {c: batch.column(c).to_pylist() for c in ids}
                    for c in cols:
                        arr = batch.column(c)
                        data = arr.field("bytes") if pa.types.is_struct(arr.type) else arr
                        for j, v in enumerate(data.to_pylist()):
                            if not isinstance(v, bytes):  # only a path (never opened: dataset text), or null
                                what = "holds no image bytes"
                            else:
                                try:
                                    with Image.open(io.BytesIO(v)) as img:
                                        img.load()
                                    continue
                                except Exception as e:  # PIL: UnidentifiedImageError, truncated (OSError), bombs
                                    what = f"is not a readable image ({type(e).__name__}: {e})"
                            out.append({"path": rel, "row": row0 + j,
                                        **{k: where[k][j] if k in where else None for k in ("episode_index", "index")},
                                        "column": c, "error": what})
                    row0 += batch.num_rows
        except (pa.ArrowException, OSError):
            continue
    return out


def undecodable_videos(src: Source, cache_dir, files: list[tuple[str, str, str]],
                       clips: dict[tuple[str, str], list[tuple]], progress: bool | None = None
                       ) -> list[dict[str, Any]]:
    """Decode every mp4 of ``files`` (``(video_key, path, codec)``, paths relative to ``src``;
    :func:`lerobot_sql._readers.decode.decode_every_frame`) and compare each with its video index (the pts of its
    demuxed packets, built or read under ``cache_dir``); then seek to up to
    :data:`~lerobot_sql._readers.decode.SEEK_PROBES` of its keyframes as the readers do
    (:func:`~lerobot_sql._readers.decode.probe_seeks`; on sample/multifile60, 11 mp4s: 704 seeks, about 0.2 s on top
    of the decode's 2 s). ``clips``: per (video_key, path), the file's episodes as :func:`compare_decode` takes
    them.

    Returns:
        One dict per mp4 that fails, in the order of ``files``: ``video_key``, ``path``, ``codec``, and
        :func:`compare_decode`'s row.
    """
    from tqdm.auto import tqdm

    out = []
    for key, rel, codec in tqdm(files, desc="decode videos", unit="file",
                                disable=(len(files) < 8) if progress is None else not progress):
        path = video_index.ensure_index(src, rel, cache_dir)
        want = np.sort(pq.read_table(path, columns=["pts"])["pts"].to_numpy())  # presentation order, sorted again
        got = decode.decode_every_frame(src, rel)
        seeks = decode.probe_seeks(src, rel, video_index.FrameIndex.load(path)) if got.time_base else None
        row = compare_decode(want, got, clips.get((key, rel), []), seeks)
        if row is not None:
            out.append({"video_key": key, "path": rel, "codec": codec, **row})
    return out


def compare_decode(want, got, clips: list[tuple], seeks: tuple[int, list[tuple]] | None = None
                    ) -> dict[str, Any] | None:
    """The violation row (without video_key, path, codec) of one mp4, or None when it decoded as indexed.

    Args:
        want: the index's pts, sorted (int64 numpy array). got: the file's
            :class:`~lerobot_sql._readers.decode.DecodedStream`.
        clips: (episode_index, first second, end second) of the file's episodes, each widened by half a frame.
        seeks: :func:`~lerobot_sql._readers.decode.probe_seeks`'s (keyframes probed, failures), or None (not run).
            A failed seek to a keyframe the forward pass did not output is left to that finding (missing frames).
    """
    tb = float(got.time_base) if got.time_base is not None else None
    d = got.pts
    bad = np.zeros(len(want), bool)  # index frames (presentation order) that did not come out as indexed
    outside: list[int] = []          # offending pts that are no index frame (extra ones)
    parts: list[str] = []

    def at(p) -> int:  # ordinal of pts p (or of the first frame after it) in presentation order
        return int(np.searchsorted(want, p))

    def sec(p) -> str:
        return f"{p * tb:.3f} s" if tb else "? s"

    n_late = 0
    if len(d) > 1:
        runmax = np.maximum.accumulate(d)
        late = np.flatnonzero(d[1:] <= runmax[:-1]) + 1  # output positions whose pts is not above all before it
        n_late = len(late)
        if n_late:
            # A late frame at pts p output after one at runmax: every frame presented from p to runmax is out of
            # order (reached by decoding forward, the later one comes first: "decoding skipped").
            for j in late:
                bad[at(d[j]):np.searchsorted(want, runmax[j - 1], side="right")] = True
            k = int(late[0])
            rng = np.flatnonzero(bad)
            parts.append(f"not in pts order from decoded frame {k} (pts {int(d[k])}, {sec(d[k])}, after pts "
                         f"{int(runmax[k - 1])}): {n_late} frame(s) late, {len(rng)} of frames {rng[0]}..{rng[-1]} "
                         "out of order")
            uniq, counts = np.unique(d, return_counts=True)
            if (counts > 1).any():
                parts.append(f"{int((counts > 1).sum())} pts output more than once (first pts "
                             f"{int(uniq[counts > 1][0])})")
    # Frames the container tells the decoder to drop (an edit list's lead-in) are indexed but never output, as meant.
    missing = np.setdiff1d(np.setdiff1d(want, d), got.discarded_pts)
    extra = np.setdiff1d(d, want)
    if len(missing):
        bad[np.searchsorted(want, missing)] = True
        parts.append(f"{len(missing)} indexed frame(s) never decoded (first: frame {at(missing[0])}, pts "
                     f"{int(missing[0])}, {sec(missing[0])})")
    if len(extra):
        outside += [int(p) for p in extra]
        parts.append(f"{len(extra)} decoded pts not in the index (first pts {int(extra[0])}, {sec(extra[0])})")
    if got.no_pts:
        parts.append(f"{got.no_pts} frame(s) decoded without a pts")
    if len(got.corrupt_pts):
        in_index = np.isin(got.corrupt_pts, want)
        bad[np.searchsorted(want, got.corrupt_pts[in_index])] = True
        parts.append(f"{len(got.corrupt_pts)} frame(s) flagged corrupt by the decoder (first pts "
                     f"{int(got.corrupt_pts[0])})")
    if got.error:
        if got.error_pts is not None:
            if got.error_pts in want:
                bad[at(got.error_pts)] = True
            else:
                outside.append(int(got.error_pts))
        where = f" (packet pts {got.error_pts})" if got.error_pts is not None else ""
        parts.append(f"{got.n_errors} decode error(s), the first after {got.frames_before_error} frame(s) "
                     f"output{where}")
    n_probed, failed = seeks or (0, [])
    decoded = set(d.tolist())
    failed = [f for f in failed if f[0] in decoded]
    if failed:
        asked = np.array([a for a, _, _ in failed], np.int64)
        bad[np.searchsorted(want, asked[np.isin(asked, want)])] = True
        a, g, err = failed[0]
        landed = f"pts {g} ({sec(g)}) decoded first" if g is not None else (err or "nothing decoded after it")
        parts.append(f"{len(failed)} of {n_probed} seeks to a keyframe decoded another frame first (first: keyframe "
                     f"pts {a} ({sec(a)}), {landed}): items read at random raise")
    if not parts:
        return None
    firsts = ([int(want[np.argmax(bad)])] if bad.any() else []) + outside
    first = min(firsts) if firsts else None
    if tb is None or first is None:  # it did not open (or nothing pins a frame): every episode of the file
        eps = sorted({ep for ep, _, _ in clips})
    else:
        want_s, out_s = want * tb, [p * tb for p in outside]
        eps = sorted(ep for ep, lo, hi in clips
                     if bad[np.searchsorted(want_s, lo):np.searchsorted(want_s, hi)].any()
                     or any(lo <= t < hi for t in out_s))
    return {"frame": None if first is None else at(first),
            "pts": first, "pts_s": None if first is None or tb is None else first * tb,
            "episodes": eps, "problem": "; ".join(parts), "frames_in_index": len(want),
            "frames_decoded": len(d) + got.no_pts, "n_out_of_order": n_late, "n_missing": len(missing),
            "n_extra": len(extra), "n_bad_seeks": len(failed), "error": got.error}
