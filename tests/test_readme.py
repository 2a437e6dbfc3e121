"""Every Python example in the README runs, as written, against this run's Redis.

Each ```python block is compiled with top-level ``await`` allowed and run with
``CTXSTORE_*`` pointing at the test server and this test's key prefix. The
few names a block leaves to the reader (the model call, the Amplifier
coordinator) are provided; a block that needs a package this environment
lacks is skipped here and runs in the other environment ``make test`` uses.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

from ctxstore import Settings

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks() -> list[tuple[int, str]]:
    """The README's Python blocks, with the line each starts on."""
    text = README.read_text()
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in BLOCK.finditer(text)]


NEEDS = {
    "amplifier_core": r"\bctxstore\.amplifier\b",
    "agents": r"\bctxstore\.integrations\.openai_agents\b|^(from|import) agents\b",
    "langchain_core": r"\bctxstore\.integrations\.langchain\b|\blangchain_core\b",
}
"""The optional package each kind of block needs, by what it imports."""


def needed(source: str) -> list[str]:
    """The optional packages a block needs."""
    return [package for package, uses in NEEDS.items() if re.search(uses, source, re.MULTILINE)]


def test_the_readme_has_python_examples() -> None:
    """The extraction finds the SDK example (so the test below cannot pass on nothing)."""
    assert any("ContextStore.from_settings" in source for _, source in python_blocks())


@pytest.mark.parametrize(("line", "source"), python_blocks(), ids=lambda v: str(v)[:12])
async def test_a_readme_example_runs(
    line: int, source: str, settings: Settings, monkeypatch: pytest.MonkeyPatch, tenant: str
) -> None:
    """The block runs to its end with only the reader's own names filled in."""
    for package in needed(source):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"needs {package} (installed in the other environment)")
    assert settings.redis_url is not None
    monkeypatch.setenv("CTXSTORE_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("CTXSTORE_KEY_PREFIX", f"{settings.key_prefix}-readme-{tenant}")
    monkeypatch.setenv("CTXSTORE_QUEUE_NAME", f"{settings.key_prefix}-readme-{tenant}:summaries")
    sent: list[Any] = []
    namespace: dict[str, Any] = {"call_the_model": sent.append, "__name__": "readme"}
    if "coordinator" in source:
        from amplifier_core.testing import MockCoordinator

        namespace["coordinator"] = MockCoordinator()
    code = compile(source, f"README.md:{line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, namespace)
    if result is not None:
        await result
    if "call_the_model" in source:
        assert sent and sent[0], "the example sent the model nothing"
    if "cleanup" in namespace:
        await namespace["cleanup"]()
