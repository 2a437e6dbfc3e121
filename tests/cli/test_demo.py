"""The demo: pods and a worker on the embedded Redis, finishing with its progress shown."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from ctxstore._cli.demo import _Progress, agent_turns, look_again
from ctxstore.embedded import STARTED

ANNOUNCEMENT = "ctxstore: no CTXSTORE_REDIS_URL; started the embedded Redis in"


def test_the_demo_finishes_every_summary_job_and_says_what_it_does(data_dir: Path) -> None:
    """`make demo` as a new user runs it: exit 0, no job left flagged, progress as it goes."""
    pytest.importorskip("arq", reason="the demo's worker needs ctxstore[worker]")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXSTORE_")}
    env.pop("ANTHROPIC_API_KEY", None)
    env["CTXSTORE_DATA_DIR"] = str(data_dir)
    # The demo's own limit on its wait for the summary jobs, far above what they take.
    done = subprocess.run(
        [sys.executable, "-m", "ctxstore._cli.demo", "--wait", "300"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    total = sum(
        len(turn) for s in range(3) for p in range(4) for turn in agent_turns(p, f"conv-{s}", 10, 7)
    )
    lines = out.splitlines()
    writing = [line for line in lines if "] writing: " in line]
    assert f"writing: {total:,}/{total:,} messages (100%)" in writing[-1]
    assert any("summary #1 covers" in line for line in lines)
    assert any("] summarizing: 3/3 sessions done (100%)" in line for line in lines)
    assert "OK: nothing lost, nothing doubled" in out
    assert "FAILED" not in out
    # Pods and worker are handed the server: only the demo's own process announces it.
    assert done.stderr.count(ANNOUNCEMENT) == 1
    assert STARTED.format(directory=data_dir) in done.stderr
    assert f"Look again: {look_again(tenant_of(out))}" in out


def tenant_of(out: str) -> str:
    """The demo's tenant, as its first line names it."""
    return out.split("tenant ", 1)[1].split(")", 1)[0]


def test_the_closing_hint_names_the_command_where_it_is_when_it_is_on_no_path() -> None:
    """Off PATH (as after `make demo`), the hint names the script's path and how to activate."""
    script = Path(sys.executable).with_name("ctxstore")
    if not script.is_file():
        pytest.skip("ctxstore is not installed beside this Python")
    hint = look_again("demo-1", path=os.devnull)
    named, rest = hint.split(" ", 1)
    assert named in (str(script), os.path.relpath(script)) and named != "ctxstore"
    assert rest.startswith("sessions --tenant demo-1")
    if script.with_name("activate").is_file():
        assert "source " in hint and "activate` first" in hint


def test_the_closing_hint_is_the_bare_command_where_path_finds_this_one() -> None:
    """Where PATH finds this very script, the hint is `ctxstore sessions --tenant T`."""
    script = Path(sys.executable).with_name("ctxstore")
    if not script.is_file():
        pytest.skip("ctxstore is not installed beside this Python")
    assert look_again("demo-1", path=str(script.parent)) == "ctxstore sessions --tenant demo-1"


def test_progress_on_a_terminal_is_a_bar_with_notes_above_it() -> None:
    """On a terminal the phases are bars (done/total, unit, what is awaited); notes print above."""
    screen = io.StringIO()
    progress = _Progress(Console(file=screen, force_terminal=True, width=120))
    progress.phase("writing", 40, "messages")
    progress.update(30)
    progress.note("conv-0: summary #1 covers 10 of 20 tokens")
    progress.phase("summarizing", 3, "sessions done")
    progress.update(2, "waiting for conv-2")
    progress.close()
    shown = screen.getvalue()
    assert "conv-0: summary #1 covers 10 of 20 tokens" in shown
    assert "30/40" in shown and "messages" in shown
    assert "2/3" in shown and "sessions done" in shown and "waiting for conv-2" in shown


def test_progress_elsewhere_is_a_line_per_quarter_and_per_change(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Off a terminal: one line when a phase reaches a new quarter or waits for something else."""
    progress = _Progress(Console(file=io.StringIO(), force_terminal=False))
    progress.phase("writing", 100, "messages")
    for done in (0, 10, 20, 30, 60, 100, 100):
        progress.update(done)
    progress.phase("summarizing", 2, "sessions done")
    progress.update(0, "waiting for conv-0, conv-1")
    progress.update(0, "waiting for conv-0, conv-1")
    progress.update(1, "waiting for conv-1")
    progress.update(2)
    progress.close()
    said = [line.split("] ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert said == [
        "writing: 0/100 messages (0%)",
        "writing: 30/100 messages (30%)",
        "writing: 60/100 messages (60%)",
        "writing: 100/100 messages (100%)",
        "summarizing: 0/2 sessions done (0%); waiting for conv-0, conv-1",
        "summarizing: 1/2 sessions done (50%); waiting for conv-1",
        "summarizing: 2/2 sessions done (100%)",
    ]
