"""The package's layers: each part imports only the parts below it.

The rule is written in ``docs/design.md`` (Layers: who may import whom) and here. A part
is a private subpackage of ``ctxstore`` (``_redis``, ``_layout``, ...), a
public module (``store``, ``models``, ...), ``integrations`` or ``workers``.
An import counts whether it sits at the top of a module or inside a function
(a lazy import still ties the two); an import under ``if TYPE_CHECKING:`` does
not, since it never runs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FOUNDATION = frozenset(
    {"errors", "_layout", "models", "settings", "tokens", "budget", "encryption", "embedded"}
)
"""How things are named, laid out, counted and configured: no I/O, no redis."""
OBSERVABILITY = frozenset({"metrics", "tracing"})
PURE = FOUNDATION | OBSERVABILITY | {"_plan", "_local"}
EDGE = FOUNDATION | {"_redis"}
PARTS = EDGE | PURE | {"_parts", "_tenant", "lease", "summary_queue"}
FACADE = PARTS | {"store", "summarizers", "recall"}
PUBLIC = FOUNDATION | OBSERVABILITY | {"store", "lease", "recall", "summarizers", "summary_queue"}
PUBLIC |= {"ctxstore", "testing"}

ALLOWED: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "_layout": frozenset({"errors", "models", "encryption"}),
    "models": frozenset({"errors", "_layout"}),
    "encryption": frozenset({"errors", "settings"}),
    "embedded": frozenset({"errors"}),
    "settings": frozenset({"errors", "_layout", "embedded"}),
    "tokens": frozenset({"errors"}),
    "budget": frozenset({"errors", "settings", "tokens"}),
    "metrics": FOUNDATION,
    "tracing": FOUNDATION | {"metrics"},
    # Pure planning and the local summarizer: the layout only, no I/O.
    "_plan": FOUNDATION,
    "_local": FOUNDATION,
    "summarizers": FOUNDATION | {"_local"},
    # The Redis edge: the only code that talks to redis-py.
    "_redis": FOUNDATION,
    # One tenant's I/O parts, over the edge.
    "_tenant": PARTS - {"_parts"},
    "lease": EDGE,
    "summary_queue": EDGE | OBSERVABILITY,
    "_parts": PARTS | {"summarizers"},
    # The facade and the public services over it.
    "store": FACADE,
    "recall": FACADE,
    "testing": PUBLIC,
    # The surface: public names only (and the CLI's own parts).
    "integrations": PUBLIC,
    "_cli": PUBLIC | {"workers"},  # the demo runs a worker in its own process
    "cli": PUBLIC | {"_cli", "workers"},
    "workers": PUBLIC,
    "ctxstore": PUBLIC | {"integrations"},
}
"""Which parts each part may import (besides itself)."""

EXCEPTIONS: dict[tuple[str, str], str] = {
    ("cli", "ctxstore._tenant.acl"): "`ctxstore acl` renders the tenant users' ACL file",
    ("cli", "ctxstore._redis.scripts"): "`ctxstore functions` loads the Lua library it names",
    ("cli", "ctxstore._redis.functions"): "`ctxstore functions` loads and prunes that library",
    ("_cli", "ctxstore._layout.formats"): "the demo counts tool pairs by id, as a view does",
}
"""Imports across the rule, by the module they reach, each with the reason it is there."""

REDIS_USERS = frozenset({"_redis", "testing", "workers", "summary_queue"})
"""The parts that may import redis-py itself."""


def part_of(module: str) -> str | None:
    """The part a dotted module name belongs to, or None outside the project."""
    top, *rest = module.split(".")
    if top == "workers":
        return "workers"
    if top != "ctxstore":
        return None
    return rest[0] if rest else "ctxstore"


def runtime_imports(path: Path) -> Iterator[tuple[str, int]]:
    """Each module a file imports outside ``if TYPE_CHECKING:``, with its line."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:  # `from ctxstore import tracing` imports a module
                sub = f"{node.module}.{alias.name}"
                yield (sub if _is_module(sub) else node.module), node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno


def _is_module(dotted: str) -> bool:
    path = REPO.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def modules() -> Iterator[tuple[str, Path]]:
    """Every module of the package and of workers/, by dotted name."""
    for path in sorted([*(REPO / "ctxstore").rglob("*.py"), *(REPO / "workers").rglob("*.py")]):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def crossings() -> list[str]:
    """Every import that breaks the rule, as ``file:line: part -> part``."""
    found = []
    for module, path in modules():
        source = part_of(module)
        assert source is not None
        for target, line in runtime_imports(path):
            where = f"{path.relative_to(REPO)}:{line}"
            if target.split(".")[0] == "redis" and source not in REDIS_USERS:
                found.append(f"{where}: {source} -> redis")
            into = part_of(target)
            if into is None or into == source:
                continue
            excepted = any(
                part == source and (target == reached or target.startswith(reached + "."))
                for part, reached in EXCEPTIONS
            )
            if into not in ALLOWED[source] and not excepted:
                found.append(f"{where}: {source} -> {into}")
    return found


def test_every_part_is_placed_in_the_rule() -> None:
    """A new subpackage or public module must be given its place before it is used."""
    parts = {part_of(module) for module, _ in modules()}
    assert parts <= set(ALLOWED), sorted(parts - set(ALLOWED))


def test_no_import_crosses_the_layers() -> None:
    """Each part imports only what the rule lets it (the foundation imports nothing above it)."""
    assert crossings() == []


def test_the_rule_catches_an_import_upward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check is live: a layout module importing the store is reported."""
    fake = tmp_path / "ctxstore" / "_layout"
    fake.mkdir(parents=True)
    (fake / "keys.py").write_text("from ctxstore.store import ContextStore\n")
    (tmp_path / "workers").mkdir()
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    assert crossings() == ["ctxstore/_layout/keys.py:1: _layout -> store"]
