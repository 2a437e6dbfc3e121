"""The public line: __all__ is sorted, complete, and importable."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import ctxstore


def test_all_is_sorted_and_exported() -> None:
    """__all__ is sorted and every name in it exists."""
    assert ctxstore.__all__ == sorted(ctxstore.__all__)
    for name in ctxstore.__all__:
        assert hasattr(ctxstore, name), name


def test_all_matches_the_imports() -> None:
    """The lazy exports, the names imported for type checkers and __all__ are one list."""
    tree = ast.parse(Path(ctxstore.__file__).read_text())
    (checking,) = [n for n in tree.body if isinstance(n, ast.If)]  # if TYPE_CHECKING:
    imported = {
        (alias.asname or alias.name, node.module)
        for node in checking.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert imported == set(ctxstore._EXPORTS.items())
    assert set(ctxstore._EXPORTS) == set(ctxstore.__all__)


def test_import_ctxstore_is_light() -> None:
    """`import ctxstore` loads neither anthropic nor arq, nor redis until a name is used."""
    code = (
        "import sys, ctxstore; "
        "print(sorted(m for m in ('anthropic', 'arq', 'redis') if m in sys.modules)); "
        "ctxstore.ContextStore; "
        "print(sorted(m for m in ('anthropic', 'arq') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[:2] == ["[]", "[]"]


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


def _module_imports(path: Path, package: Path) -> set[str]:
    """The ctxstore modules ``path`` imports at import time (not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for child in [node] if not isinstance(node, ast.If) else node.body:
            if isinstance(child, ast.ImportFrom) and child.module:
                if child.module == "ctxstore" or child.module.startswith("ctxstore."):
                    found.add(child.module)  # `from ctxstore._layout import keys` names a module
                    found.update(f"{child.module}.{a.name}" for a in child.names)
            elif isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.startswith("ctxstore."))
    return {name for name in found if name in _modules(package)}


def _modules(package: Path) -> dict[str, Path]:
    """Every module of the package, subpackages included, by dotted name."""
    named = {}
    for path in package.rglob("*.py"):
        parts = ("ctxstore", *path.relative_to(package).with_suffix("").parts)
        named[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return named


def test_no_module_of_the_package_imports_itself_back() -> None:
    """The modules' import-time graph has no cycle (jobs and store used to import each other)."""
    package = Path(ctxstore.__file__).parent
    graph = {
        name: _module_imports(path, package)
        for name, path in _modules(package).items()
        if name != "ctxstore"
    }
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, " -> ".join((*path, node))
        if node in done:
            return
        for target in graph.get(node, ()):
            visit(target, (*path, node))
        done.add(node)

    assert len(graph) > 60  # the walk saw the package and its subpackages
    for module in graph:
        visit(module, ())
