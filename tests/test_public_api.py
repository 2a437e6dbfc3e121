"""The public line: __all__ is sorted, complete, and importable."""

from __future__ import annotations

import ast
from pathlib import Path

import ctxstore


def test_all_is_sorted_and_exported() -> None:
    """__all__ is sorted and every name in it exists."""
    assert ctxstore.__all__ == sorted(ctxstore.__all__)
    for name in ctxstore.__all__:
        assert hasattr(ctxstore, name), name


def test_all_matches_the_imports() -> None:
    """Every name __init__ imports is in __all__, and nothing else is."""
    tree = ast.parse(Path(ctxstore.__file__).read_text())
    imported = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert imported == set(ctxstore.__all__)


def test_errors_have_one_root() -> None:
    """Every exported exception derives from CtxstoreError."""
    for name in ctxstore.__all__:
        value = getattr(ctxstore, name)
        if isinstance(value, type) and issubclass(value, BaseException):
            assert issubclass(value, ctxstore.CtxstoreError), name


def test_workers_import_only_public_names() -> None:
    """workers/ imports from ctxstore only names in ctxstore.__all__ (or public modules)."""
    root = Path(ctxstore.__file__).parent.parent / "workers"
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("ctxstore")
            ):
                parts = node.module.split(".")
                assert not any(p.startswith("_") for p in parts), f"{path}: {node.module}"
                for alias in node.names:
                    assert not alias.name.startswith("_"), f"{path}: {alias.name}"
