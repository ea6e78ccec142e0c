"""Write benchmarks/README.md from its template and the current figures.

    python -m benchmarks.readme            # rewrite benchmarks/README.md
    python -m benchmarks.readme --check    # exit 1 if benchmarks/README.md is not what the files give

The page is ``readme_template.md`` with three kinds of placeholder, each alone on its line:

* ``{{table NAME}}``: the table ``NAME`` of ``results.json``;
* ``{{run NAME}}``: the line saying when, how and on what machine benchmark ``NAME`` ran (``results.json``, "runs");
* ``{{scale}}``: the Scale table, from ``scale.json`` as ``bench_scale.py run`` writes it.

A table in results.json is ``{"columns": [...], "rows": [...]}``. A column is ``{"label", "fmt", "align"}``: ``fmt``
is a ``str.format`` pattern (default ``{}``), ``align`` ``"r"`` for numbers. A cell is a number (``fmt.format(x)``),
a list of numbers (``fmt.format(*xs)``: several figures in one cell), a string (as written) or null (``-``).
A new measurement: rerun the benchmark, replace its rows and its run line in results.json, then run this module.
Plain Python: json and string formatting only, so it runs without the package's dependencies.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "readme_template.md"
RESULTS = HERE / "results.json"
SCALE = HERE / "scale.json"
README = HERE / "README.md"
PLACEHOLDER = re.compile(r"^\{\{(table|run|scale)(?: ([\w.]+))?\}\}$")


def cell(value, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return fmt.format(*value)
    return fmt.format(value)


def markdown_table(columns: list[dict], rows: list[list]) -> str:
    """A Markdown table: one header row, the alignment row, one line per row of cells."""
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"a row has {len(row)} cells for {len(columns)} columns: {row}")
    out = ["| " + " | ".join(c["label"] for c in columns) + " |",
           "|" + "|".join("---:" if c.get("align") == "r" else "---" for c in columns) + "|"]
    out += ["| " + " | ".join(cell(v, c.get("fmt", "{}")) for v, c in zip(row, columns)) + " |" for row in rows]
    return "\n".join(out)


# ---- Scale: the table of scale.json (bench_scale.py prints the same after a run) -----------------------------------
def _mb(b: float) -> str:
    if b < 1e6:
        return f"{b / 1e3:,.0f} kB"
    return f"{b / 1e6:,.0f} MB" if b < 1e9 else f"{b / 1e9:,.2f} GB"


def scale_table(results: list[dict]) -> str:
    """One column per dataset size, one row per measure, from the dicts ``bench_scale.py measure`` writes."""
    cols = [f"{r['episodes']:,} eps / {r['frames'] / 1e6:.1f}M frames" for r in results]
    rows: list[tuple[str, list[str]]] = []

    def q(name: str, label: str) -> None:
        rows.append((label, [f"{r[name]['s']:.3f} s ({r[name]['row_groups_scanned']:,}/"
                             f"{r[name]['row_groups_total']:,} RG, {_mb(r[name]['bytes_scanned'])})"
                             for r in results]))

    rows.append(("data files / Parquet size", [f"{r['data_files']} / {_mb(r['parquet_bytes'])}" for r in results]))
    rows.append(("connect", [f"{r['steps']['connect']['s']:.3f} s" for r in results]))
    rows.append(("connect, `parquet_metadata_cache` on", [f"{r['steps']['connect_metadata_cache']['s']:.3f} s"
                                                          for r in results]))
    q("q_episodes", "episode query (`length >= 390`)")
    q("q_frames_10ep", "frame query, 10 episodes (`episode_index BETWEEN`)")
    q("q_frames_tail", "frame query, `frame_index >= 390` (stats prune short episodes)")
    q("q_frames_scan", "frame query, value predicate (full scan)")
    rows.append(("same 4 queries, `parquet_metadata_cache` on", [
        " / ".join(f"{r[k]['s_metadata_cache']:.3f}" for k in ("q_episodes", "q_frames_10ep", "q_frames_tail",
                                                              "q_frames_scan")) + " s" for r in results]))
    rows.append(("manifest, 100 episodes", [f"{r['steps']['manifest_fixed']['s']:.3f} s "
                                            f"({r['manifest_fixed_rows']:,} rows; join reads "
                                            f"{r['manifest_fixed_scan']['row_groups_scanned']:,}/"
                                            f"{r['manifest_fixed_scan']['row_groups_total']:,} RG)"
                                            for r in results]))
    rows.append(("dataset() on it: Arrow cache build", [f"{r['steps']['dataset_fixed']['s']:.3f} s, "
                                                       f"{_mb(r['cache_fixed_bytes'])}" for r in results]))
    rows.append(("first item (`ds[0]`)", [f"{r['steps']['first_item']['s'] * 1e3:.1f} ms" for r in results]))
    rows.append(("2,000 random items", [f"{r['steps']['items_2000_random']['s']:.2f} s" for r in results]))
    rows.append(("manifest, every frame", [f"{r['steps']['manifest_full']['s']:.2f} s ({_mb(r['manifest_full_bytes'])}"
                                           f" in memory)" for r in results]))
    rows.append(("export_manifest, every frame", [f"{r['steps']['export_manifest_full']['s']:.2f} s "
                                                  f"({_mb(r['manifest_parquet_bytes'])})" for r in results]))
    rows.append(("shard_manifest, every frame, 8 ranks", [f"{r['steps']['shard_full_8']['s']:.2f} s"
                                                          for r in results]))
    if all("dataset_full" in r["steps"] for r in results):
        rows.append(("dataset() on every frame: Arrow cache build", [
            f"{r['steps']['dataset_full']['s']:.1f} s, {_mb(r['cache_full_bytes'])}" for r in results]))
        rows.append(("first item of it", [f"{r['steps']['first_item_full']['s'] * 1e3:.1f} ms" for r in results]))
    if all("spill_sort_1GB" in r for r in results):
        rows.append(("sort of every frame, memory_limit=1GB", [
            f"{r['steps']['spill_sort_1GB']['s']:.1f} s, spilled {_mb(r['spill_sort_1GB']['bytes_spilled'] or 0)}"
            for r in results]))
    rows.append(("peak RSS (whole run)", [_mb(r["peak_rss"]) for r in results]))
    columns = [{"label": "measure"}] + [{"label": c, "align": "r"} for c in cols]
    return markdown_table(columns, [[label, *vals] for label, vals in rows])


# ---- the page -----------------------------------------------------------------------------------------------------
def render(template: str, results: dict, scale: list[dict]) -> str:
    out = []
    for line in template.splitlines():
        m = PLACEHOLDER.match(line.strip())
        if not m:
            out.append(line)
            continue
        kind, name = m.groups()
        if kind == "scale":
            out.append(scale_table(scale))
        elif kind == "run":
            if name not in results["runs"]:
                raise KeyError(f"{TEMPLATE.name}: no run {name!r} in {RESULTS.name} (runs: {sorted(results['runs'])})")
            out.append(f"**Run.** {results['runs'][name]}.")
        else:
            if name not in results["tables"]:
                raise KeyError(f"{TEMPLATE.name}: no table {name!r} in {RESULTS.name} "
                               f"(tables: {sorted(results['tables'])})")
            t = results["tables"][name]
            out.append(markdown_table(t["columns"], t["rows"]))
    return "\n".join(out) + "\n"


def build() -> str:
    return render(TEMPLATE.read_text(), json.loads(RESULTS.read_text()), json.loads(SCALE.read_text()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.readme", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if README.md differs from what the files give")
    a = ap.parse_args(argv)
    page = build()
    if a.check:
        if README.exists() and README.read_text() == page:
            return 0
        print(f"{README}: stale; run `python -m benchmarks.readme` to rewrite it from {TEMPLATE.name}, "
              f"{RESULTS.name} and {SCALE.name}", file=sys.stderr)
        return 1
    README.write_text(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
