"""The package's import graph keeps the stage order of docs/architecture.md: no upward edge, no cycle.

An AST walk of every module of ``lerobot_sql/`` collects its imports of the package, at module level and inside
functions alike (a lazy import is still a dependency; it only hides a cycle from the interpreter). Imports under
``if TYPE_CHECKING:`` are no edge for the stage rules (a type named in an annotation) but count for cycles: two
modules that name each other's types are one room in two files (the export writers and the Exporter were). Each module
belongs to a stage; ``ALLOWED`` says which stages (or single modules) a stage may import. The edges, cycles and
cross-module private imports that break the rules today are listed in ``KNOWN_*``: a new one fails the test, and
so does a listed one that no longer exists, so the lists can only shrink (delete the entry with the fix).

The stages are docs/architecture.md's ("Module map"). A new module must be given a stage in ``PACKAGE_STAGE`` or
``STAGE_TOP`` (the test says so), which is the moment to decide where it belongs. torch is a folder rule: only modules
under ``lerobot_sql/torch/`` (the training wing) and the demo import it.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "lerobot_sql"

# package -> stage: every module of a private stage package belongs to that stage
PACKAGE_STAGE = {
    "_storage": "storage",   # where bytes live; knows no dataset format
    "_format": "format",     # what the files mean; no DuckDB
    "_readers": "readers",   # read a manifest's bytes; no SQL
    "_query": "query",       # SQL text; sqlglot only
    "_catalog": "catalog",   # DuckDB: the connection's views and macros, its lock-down
    "_plan": "plan",         # query result -> manifest
    "export": "feature",     # the export package: a feature over a manifest
    "view": "feature",       # the clip page: a feature over a manifest (its mp4s written by export.clip_writer)
    "cli": "cli",            # the command line
    "torch": "adapter",      # the training wing: the torch side, after the manifest, files only
}
# module -> stage: every top-level module, and a module of a package whose stage is not its package's (checked first)
STAGE_TOP = {
    "errors": "errors", "_version": "errors",  # the leaves everyone may import
    "_settings": "errors",  # the LSQL_* environment variables, parsed in one place (it raises SettingError)
    # the lerobot-train driver sits in the wing's folder but is a user of the facade (it connects), as the demo is
    "torch.train": "cli",
    # features built over a Database or a manifest
    "prefetch": "feature", "doctor": "feature", "nearest": "feature", "display": "feature", "stats": "feature",
    # the facade (``_sql``: the check-then-run face and the Result that db and collection share)
    "__init__": "facade", "db": "facade", "collection": "facade", "_sql": "facade",
    # the old import paths kept for a release, each in the stage of what it re-exports (docs/sql.md showed
    # `from lerobot_sql import library` in 0.1; the docs named the wing's public modules at the top before torch/)
    "library": "query",
    "dataset": "adapter", "samplers": "adapter", "shard": "adapter", "ray_data": "adapter", "meta": "adapter",
    "train": "cli",
    # the demo: a user of the facade
    "demo": "cli",
}


def stage_of(mod: str) -> str | None:
    head = mod.split(".")[0]
    return STAGE_TOP.get(mod) or PACKAGE_STAGE.get(head)


# stage -> what it may import: stage names, or single module names (allowing that module only, not its stage).
# Imports within one stage are allowed (cycles are checked apart).
ALLOWED = {
    "errors": set(),
    "storage": {"errors"},
    # _query.sqltext: how DuckDB compares names (sql_key), by which info.json's features may not collide as columns
    "format": {"storage", "errors", "_query.sqltext"},
    "readers": {"format", "storage", "errors"},
    "query": {"errors"},
    # _readers.tabular: the data files' footers, parsed once per process by their one owner (the frames view's
    # repeated-rows check reads their statistics; the dataset reads the same footers); _readers.episode_facts: the
    # numpy pass behind the episode_quality view, built on first read as video_frames is from the video index
    # _query.narrowing: the bounds a query's WHERE puts on frames (read from DuckDB's parse tree, no DuckDB call),
    # whose row groups the catalog reads in the view's place (_catalog.frames_part)
    "catalog": {"_readers.video_index", "_readers.tabular", "_readers.episode_facts", "_query.sqltext",
                "_query.narrowing", "format", "storage", "errors"},
    "plan": {"catalog", "_readers.tabular", "_query.sqltext", "format", "storage", "errors"},
    # of the planner, only the manifest's definition and the dealing of its rows to ranks (numpy, no DuckDB; shard and
    # samplers share it); storage only for the Source type the readers take; the frames' rules (_plan.clips, numpy),
    # which a large whole-episode selection checks per row group where a process first reads it
    "adapter": {"_plan.manifest", "_plan.partition", "_plan.clips", "readers", "format", "storage", "errors"},
    # "db only as a type": under `if TYPE_CHECKING:`, which the walk skips
    "feature": {"plan", "readers", "catalog", "query", "format", "storage", "errors"},
    "facade": {"catalog", "plan", "query", "readers", "format", "storage", "errors"},
    "cli": set(PACKAGE_STAGE.values()) | set(STAGE_TOP.values()),
}
# The facade delegates to features and builds datasets inside its methods (lazily, so `import lerobot_sql` stays
# light); a module-level import of them would not be a delegate.
LAZY_ALLOWED = {"facade": {"adapter", "feature"}}
# Per-module narrowing of the stage rule: module -> the only package modules it may import.
ONLY = {"cli.shell": {"errors", "cli.output"}}
# Edges no rule allows even lazily: the facade builds its views through the catalog, never through a feature
# (`Database.doctor()`, a delegate, would be allowed again by removing the entry).
FORBIDDEN = {("db", "doctor")}

# Today's broken rules: only deletions allowed here.
KNOWN_EDGES: set[tuple[str, str]] = set()
KNOWN_CYCLES: set[frozenset] = set()
# (importer, module, name): a private name of one module imported by another.
KNOWN_PRIVATE: set[tuple[str, str, str]] = set()
# Third-party packages a stage must never import (module level or lazily).
NEVER = {
    "storage": {"duckdb", "sqlglot", "torch", "av"},
    "format": {"duckdb", "sqlglot", "torch", "av"},
    "readers": {"duckdb", "sqlglot"},
    "query": {"duckdb", "torch", "av"},
    "catalog": {"torch"},
    "plan": {"torch", "av"},
    "adapter": {"duckdb", "sqlglot"},
}
# torch belongs to the training wing, a folder: only modules under lerobot_sql/torch/ import it, and besides them the
# demo (a user of the wing). Every other module stays importable without torch.
TORCH_FOLDER = "torch"
TORCH_USERS = {"demo"}


def in_torch_folder(mod: str) -> bool:
    return mod == TORCH_FOLDER or mod.startswith(TORCH_FOLDER + ".")


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _walk(tree: ast.AST, lazy: bool = False, type_only: list | None = None):
    """Yield (node, lazy) for every import statement, skipping `if TYPE_CHECKING:` blocks; their imports are
    appended to ``type_only`` when it is given."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            if type_only is not None:
                type_only.extend(n for n, _ in _walk(ast.Module(body=node.body, type_ignores=[]), lazy))
            for n in node.orelse:
                yield from _walk(ast.Module(body=[n], type_ignores=[]), lazy, type_only)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, lazy
        inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield from _walk(node, inner, type_only)


@functools.lru_cache(maxsize=1)
def _graph():
    """edges: {(importer, imported): lazy_only}; private: {(importer, module, name)}; external: {(module, top)};
    attr_private: {(importer, module, attr)} for `module._name` uses of a package module bound by an import."""
    mods = _modules()
    edges, private, external, attr_private = {}, set(), set(), set()
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        pkg_parts = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")
        if name == "__init__":
            pkg_parts = []
        aliases = {}  # local name -> package module it is bound to

        def add(target: str, lazy: bool, name: str = name) -> None:
            if target == name:
                return
            edges[(name, target)] = edges.get((name, target), True) and lazy

        for node, lazy in _walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    top = a.name.split(".")[0]
                    if top != "lerobot_sql":
                        external.add((name, top))
                        continue
                    target = ".".join(a.name.split(".")[1:]) or "__init__"
                    add(target, lazy)
                    if a.asname:
                        aliases[a.asname] = target
                continue
            if node.level:
                base = pkg_parts[: len(pkg_parts) - (node.level - 1)] if node.level > 1 else list(pkg_parts)
                mod = ".".join(base + (node.module.split(".") if node.module else []))
            elif node.module and node.module.split(".")[0] == "lerobot_sql":
                mod = ".".join(node.module.split(".")[1:])
            else:
                if node.module and node.module != "__future__":
                    external.add((name, node.module.split(".")[0]))
                continue
            for a in node.names:
                sub = f"{mod}.{a.name}" if mod else a.name
                if sub in mods:  # `from . import video`: the submodule
                    add(sub, lazy)
                    aliases[a.asname or a.name] = sub
                else:  # a name defined in `mod`
                    add(mod or "__init__", lazy)
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        private.add((name, mod or "__init__", a.name))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                    and node.attr.startswith("_") and not node.attr.startswith("__"):
                attr_private.add((name, aliases[node.value.id], node.attr))
    return mods, edges, private, external, attr_private


def _target(name: str, node: ast.Import | ast.ImportFrom, mods) -> list[str]:
    """The package modules one import statement of module ``name`` names (none for other packages)."""
    path = mods[name]
    pkg_parts = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")
    if name == "__init__":
        pkg_parts = []
    if isinstance(node, ast.Import):
        return [".".join(a.name.split(".")[1:]) or "__init__" for a in node.names
                if a.name.split(".")[0] == "lerobot_sql"]
    if node.level:
        base = pkg_parts[: len(pkg_parts) - (node.level - 1)] if node.level > 1 else list(pkg_parts)
        mod = ".".join(base + (node.module.split(".") if node.module else []))
    elif node.module and node.module.split(".")[0] == "lerobot_sql":
        mod = ".".join(node.module.split(".")[1:])
    else:
        return []
    return [f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else (mod or "__init__") for a in node.names]


@functools.lru_cache(maxsize=1)
def _type_only_edges() -> set[tuple[str, str]]:
    """(importer, imported) for every import under ``if TYPE_CHECKING:``: no edge for the stage rules, but a cycle
    through one is a cycle."""
    mods = _modules()
    out = set()
    for name, path in mods.items():
        found: list = []
        for _ in _walk(ast.parse(path.read_text(), str(path)), type_only=found):
            pass
        out |= {(name, t) for node in found for t in _target(name, node, mods) if t != name}
    return out


def _allowed(src: str, dst: str, lazy: bool) -> bool:
    if (src, dst) in FORBIDDEN:
        return False
    if src in ONLY:
        return dst in ONLY[src]
    s, d = stage_of(src), stage_of(dst)
    rule = ALLOWED[s] | (LAZY_ALLOWED.get(s, set()) if lazy else set())
    return s == d or d in rule or dst in rule


def _cycles(edges) -> set[frozenset]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on, out = {}, {}, [], set(), set()

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.add(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_stage():
    mods, *_ = _graph()
    missing = sorted(m for m in mods if stage_of(m) is None)
    assert not missing, f"give these modules a stage (PACKAGE_STAGE or STAGE_TOP, tests/test_layering.py): {missing}"
    gone = sorted(set(STAGE_TOP) - set(mods)) + sorted(set(PACKAGE_STAGE) - set(mods))
    assert not gone, f"STAGE_TOP / PACKAGE_STAGE name modules that no longer exist: {gone}"


def test_no_upward_edge():
    _, edges, *_ = _graph()
    bad = sorted((a, b) for (a, b), lazy in edges.items() if not _allowed(a, b, lazy))
    new = [e for e in bad if e not in KNOWN_EDGES]
    assert not new, f"imports that break the stage order (stage {[(stage_of(a), stage_of(b)) for a, b in new]}): {new}"
    gone = sorted(KNOWN_EDGES - set(bad))
    assert not gone, f"fixed: delete these from KNOWN_EDGES so they cannot come back: {gone}"


def test_no_import_cycle():
    _, edges, *_ = _graph()
    found = _cycles(set(edges) | _type_only_edges())
    new = [sorted(c) for c in found if c not in KNOWN_CYCLES]
    typed = sorted({e for e in _type_only_edges() if any(set(e) <= c for c in found)})
    assert not new, f"new import cycles (direct, lazy or TYPE_CHECKING imports; type-only edges: {typed}): {new}"
    gone = [sorted(c) for c in KNOWN_CYCLES - found]
    assert not gone, f"fixed or changed: update KNOWN_CYCLES to what remains: {gone}; found {[sorted(c) for c in found]}"


def test_no_private_name_crosses_a_module():
    _, _, private, _, attr_private = _graph()
    found = private | attr_private
    new = sorted(found - KNOWN_PRIVATE)
    assert not new, f"private names used outside their module (make them public or move the code): {new}"
    gone = sorted(KNOWN_PRIVATE - found)
    assert not gone, f"fixed: delete these from KNOWN_PRIVATE: {gone}"


def test_stages_keep_off_their_forbidden_libraries():
    _, _, _, external, _ = _graph()
    bad = sorted((m, lib) for m, lib in external if lib in NEVER.get(stage_of(m) or "", set()))
    assert not bad, f"a stage imports a library it must not (see NEVER): {bad}"


def test_torch_only_in_the_training_wing():
    _, _, _, external, _ = _graph()
    bad = sorted(m for m, lib in external if lib == "torch" and not in_torch_folder(m) and m not in TORCH_USERS)
    assert not bad, f"modules outside lerobot_sql/torch/ import torch (see TORCH_FOLDER, TORCH_USERS): {bad}"


# Old import paths kept for one release (re-exports that warn): nothing of ours imports through them, so they can go
# without a change elsewhere (tests/test_moved_paths.py imports each on purpose, by name).
OLD_PATHS = {"library", "dataset", "samplers", "shard", "ray_data", "meta", "train"}


def _old_path_imports(tree: ast.AST) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[:2] in (["lerobot_sql", o] for o in OLD_PATHS)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] == "lerobot_sql" and len(parts) > 1 and parts[1] in OLD_PATHS:
                out.append(node.module)
            elif node.module == "lerobot_sql":
                out += [f"lerobot_sql.{a.name}" for a in node.names if a.name in OLD_PATHS]
    return out


def test_nothing_imports_through_an_old_path():
    mods, edges, *_ = _graph()
    bad = sorted((a, b) for a, b in edges if b in OLD_PATHS and a not in OLD_PATHS)
    assert not bad, f"package modules import an old path (import the new home): {bad}"
    found = {p.name: _old_path_imports(ast.parse(p.read_text(), str(p)))
             for d in ("tests", "benchmarks") for p in sorted((PKG.parent / d).glob("*.py"))}
    assert {k: v for k, v in found.items() if v} == {}, "import the new home instead (lerobot_sql.torch.*)"


def test_no_two_modules_share_a_basename():
    """A traceback or a grep names one file: no two modules share a basename (``__init__`` aside), except the old
    paths, which re-export a module of the same name for one release."""
    by_name: dict[str, list[str]] = {}
    for mod, path in _modules().items():
        if path.name != "__init__.py" and mod not in OLD_PATHS:
            by_name.setdefault(path.stem, []).append(mod)
    shared = {k: sorted(v) for k, v in by_name.items() if len(v) > 1}
    assert shared == {}, f"modules sharing a basename (name each after what it holds): {shared}"


def test_the_walk_sees_lazy_imports_and_type_checking_blocks():
    """The walk itself: a lazy import is an edge, a TYPE_CHECKING import is not, relative levels resolve."""
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .db import Database\n"
                     "def f():\n    from . import video\n    from ..x import y\n")
    got = [(n.module, [a.name for a in n.names], n.level, lazy) for n, lazy in _walk(tree)]
    assert got == [("typing", ["TYPE_CHECKING"], 0, False), (None, ["video"], 1, True), ("x", ["y"], 2, True)]
    typed: list = []
    assert len(list(_walk(tree, type_only=typed))) == 3 and [(n.module, n.level) for n in typed] == [("db", 1)]
    assert ("export.data_writer", "export.lerobot") not in _type_only_edges()  # the writers take an ExportTarget
    _, edges, *_ = _graph()
    assert edges[("db", "export")] is True          # lazy, inside a method
    assert edges[("db", "_catalog.connection")] is False  # module level
    assert ("torch.dataset", "db") not in edges    # the adapter never sees the facade
    assert not _allowed("torch.dataset", "db", True) and not _allowed("_catalog.views", "_plan.resolve", False)
    assert _allowed("db", "export", True) and not _allowed("db", "export", False)


def test_pyproject_names_every_package():
    """setuptools' explicit ``packages`` list decides what a wheel holds: a subpackage missing from it would import
    in an editable checkout (the tests) and be absent from every real install."""
    tomllib = __import__("pytest").importorskip("tomllib")
    listed = set(tomllib.loads((PKG.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    tree = {"lerobot_sql" + "".join("." + x for x in p.parent.relative_to(PKG).parts)
            for p in PKG.rglob("__init__.py") if "__pycache__" not in p.parts}
    assert tree - listed == set(), f"add to pyproject.toml [tool.setuptools] packages: {sorted(tree - listed)}"
