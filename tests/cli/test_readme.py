"""The README's examples run as written, and its commands parse and run.

Each ```python block is run as a script of its own (it is complete: imports,
``asyncio.run``), with no ``CTXSTORE_*`` setting, twice in a row, on one
embedded Redis for every block, as a reader trying them in turn on the
embedded default would (it keeps its data): the second run prints
what the first did (an example collides neither with its own earlier data
nor with another's). A block that needs a package this environment lacks is
skipped here and runs in the other environment ``make test`` uses. Each ``ctxstore``
command line the README shows is parsed by the CLI's own parser, and the read
commands of the recorded session run against a session of ours. The README
stays a user's document (at most 550 lines, its links to docs/ resolve), and
neither it nor docs/ speaks of issue numbers, seed documents, owners or
blocked work.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.config import REPO

from ctxstore import ContextStore, Settings
from ctxstore.cli import _parser
from ctxstore.embedded import stop_embedded

README = REPO / "README.md"
TEXT = README.read_text()
CTXSTORE = str(Path(sys.executable).with_name("ctxstore"))

NEEDS = {
    "amplifier_core": r"\bctxstore\.integrations\.amplifier\b|\bamplifier_core\b",
    "agents": r"\bctxstore\.integrations\.openai_agents\b|^(from|import) agents\b",
    "langchain_core": r"\bctxstore\.integrations\.langchain\b|\blangchain_core\b",
}
"""The optional package each kind of block needs, by what it imports."""

PLACEHOLDERS = {
    "SESSION": "conv-42",
    "T": "acme",
    "N": "5",
    "M": "claude-sonnet-4-5",
    "F": "out.acl",
    "QUERY": "KeyError",
}


SAYS = {
    "call_the_model": ["sending 2 messages", "2 messages stored"],
    "amplifier_core": ["1 messages in the session"],
}
"""Lines a block prints, by what it calls: what a reader expects of it on every run."""

ENTRY_ID = re.compile(r"\b\d{13}-\d+\b")
"""A stream entry id: the time it was written, so each run's differ."""


def blocks() -> list[tuple[str, int, str]]:
    """The README's fenced blocks: (language, the line the code starts on, the code)."""
    found: list[tuple[str, int, str]] = []
    language: str | None = None
    start, code = 0, []
    for number, line in enumerate(TEXT.splitlines(), 1):
        if not line.startswith("```"):
            code.append(line)
        elif language is None:
            language, start, code = line[3:].strip(), number + 1, []
        else:
            found.append((language, start, "\n".join(code) + "\n"))
            language = None
    return found


def python_blocks() -> list[tuple[int, str]]:
    """The README's Python blocks, with the line each starts on."""
    return [(start, code) for language, start, code in blocks() if language == "python"]


def command_lines() -> list[str]:
    """Every ``ctxstore ...`` line in the README's code blocks, placeholders filled in."""
    lines = []
    for language, _, code in blocks():
        if language not in ("", "sh", "text"):
            continue
        for raw in code.replace("\\\n", " ").splitlines():
            line = raw.strip().removeprefix("$ ")
            line = re.sub(r"^(CTXSTORE_\w+=\S+\s+)+", "", line)
            if not line.startswith("ctxstore "):
                continue
            words = shlex.split(line.split("  #")[0].split("   ")[0])
            words = [w.strip("[]") for w in words]  # a synopsis' optional parts, all given
            words = [PLACEHOLDERS.get(w, w) for w in words if w not in ("", "...")]
            lines.append(shlex.join(words))
    return lines


async def _a_session(settings: Settings) -> None:
    async with ContextStore.from_settings(settings, tenant="acme") as store:
        await store.append("conv-42", {"role": "user", "content": "Fix the failing test."})


def env_for(settings: Settings, prefix: str) -> dict[str, str]:
    """A process environment on the test server, under ``prefix``."""
    assert settings.redis_url is not None
    return {k: v for k, v in os.environ.items() if not k.startswith("CTXSTORE_")} | {
        "CTXSTORE_REDIS_URL": settings.redis_url,
        "CTXSTORE_KEY_PREFIX": prefix,
        "CTXSTORE_QUEUE_NAME": f"{prefix}:summaries",
    }


def test_the_readme_has_examples_and_commands() -> None:
    """The extraction finds the SDK example and the commands (the tests below test something)."""
    assert any("ContextStore.from_settings" in source for _, source in python_blocks())
    assert {"sessions", "status", "view", "limits", "worker"} <= {
        line.split()[1] for line in command_lines()
    }


@pytest.fixture(scope="module")
def embedded_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A reader's environment: no ``CTXSTORE_*``, so one embedded Redis for every block."""
    home = tmp_path_factory.mktemp("reader-home")
    yield {k: v for k, v in os.environ.items() if not k.startswith("CTXSTORE_")} | {
        "XDG_DATA_HOME": str(home)
    }
    stop_embedded(home / "ctxstore")


@pytest.mark.parametrize(("line", "source"), python_blocks(), ids=lambda v: str(v)[:12])
def test_a_readme_example_runs_as_written(
    line: int, source: str, embedded_home: dict[str, str]
) -> None:
    """Run twice on the embedded default, a block exits 0 and prints the same, as it says."""
    for package, uses in NEEDS.items():
        if re.search(uses, source, re.MULTILINE) and importlib.util.find_spec(package) is None:
            pytest.skip(f"needs {package} (installed in the other environment)")
    printed = []
    for run in ("first", "second"):  # the same embedded Redis: a reader runs it again
        done = subprocess.run(
            [sys.executable, "-c", source],
            env=embedded_home,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"README.md:{line}, {run} run\n{done.stderr}"
        printed.append(ENTRY_ID.sub("<entry id>", done.stdout))
        for calls, lines in SAYS.items():
            if calls in source:
                assert set(lines) <= set(done.stdout.splitlines()), (run, done.stdout)
    assert printed[0] == printed[1], f"README.md:{line}: the second run printed otherwise"


@pytest.mark.parametrize("command", command_lines())
def test_a_readme_command_parses(command: str) -> None:
    """The CLI's own parser accepts the command line as the README writes it."""
    args = _parser().parse_args(shlex.split(command)[1:])
    assert args.command == shlex.split(command)[1]


@pytest.mark.parametrize("command", ["sessions", "status conv-42", "view conv-42", "limits"])
def test_the_recorded_read_commands_run(command: str, settings: Settings, tenant: str) -> None:
    """The recorded session's commands answer on a session of ours, exit 0, one table each."""
    prefix = f"{settings.key_prefix}-readme-{tenant}"
    own = settings.model_copy(update={"key_prefix": prefix})
    asyncio.run(_a_session(own))
    done = subprocess.run(
        [CTXSTORE, *command.split(), "--tenant", "acme"],
        env=env_for(settings, prefix) | {"COLUMNS": "120"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "acme" in done.stdout


README_MOST_LINES = 550
"""The README is for users; design, operations and measurements live in docs/."""

WORKSHOP_WORDS = re.compile(r"\bissues?\b|#\d|\bseeds?\b|\bowners?\b|\bblocked\b", re.IGNORECASE)
"""What belongs to the project's own bookkeeping, not to a user's documents."""


def user_documents() -> list[Path]:
    """The README and every Markdown file under docs/."""
    return [README, *sorted((REPO / "docs").rglob("*.md"))]


def test_the_readme_stays_short() -> None:
    """The README holds at most README_MOST_LINES lines."""
    lines = len(TEXT.splitlines())
    assert lines <= README_MOST_LINES, f"README.md has {lines} lines; move detail to docs/"


@pytest.mark.parametrize("path", user_documents(), ids=lambda p: p.name)
def test_the_documents_speak_to_users(path: Path) -> None:
    """No issue numbers, seed documents, owners or blocked work in the README or docs/."""
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if WORKSHOP_WORDS.search(line)
    ]
    assert not found, "\n".join(found)


def test_the_readme_links_to_docs_that_exist() -> None:
    """Every relative link of the README names a file of the repository (anchors aside)."""
    targets = re.findall(r"\]\(((?![a-z]+:|#)[^)#\s]+)", TEXT)
    assert any(target.startswith("docs/") for target in targets)
    missing = [target for target in targets if not (REPO / target).exists()]
    assert not missing, missing
