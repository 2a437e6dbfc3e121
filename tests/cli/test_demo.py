"""The demo: pods and a worker on the embedded Redis, then what it shows, each claim checked."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from ctxstore._cli.demo import RETRIED_TURN, look_again
from ctxstore._cli.demo_progress import Progress, Watch
from ctxstore._cli.demo_report import (
    CACHE_HIT,
    CACHE_WRITE,
    cache_cost,
    fingerprint,
    plain_truncation,
)
from ctxstore._cli.demo_story import story
from ctxstore._layout.formats import call_ids, result_ids
from ctxstore.embedded import STARTED
from ctxstore.models import SessionInfo

ANNOUNCEMENT = "ctxstore: no CTXSTORE_REDIS_URL; started the embedded Redis in"
BILLED = re.compile(r"^ +(ctxstore's views|plain truncation) .* billed as +([\d,]+) uncached", re.M)


def test_the_demo_shows_what_it_claims_and_finishes_every_summary_job(data_dir: Path) -> None:
    """`make demo` as a new user runs it: exit 0, and each act's claim holds in what it prints."""
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
    stories = [story(index, 7) for index in range(3)]
    total = sum(len(turn.messages) for s in stories for turn in s.turns)
    lines = out.splitlines()
    flat = " ".join(out.split())  # the long lines are wrapped
    writing = [line for line in lines if "] writing: " in line]
    assert f"writing: {total:,}/{total:,} messages (100%)" in writing[-1]
    assert any("summary #1 covers" in line for line in lines)
    assert any("] summarizing: 3/3 sessions done (100%)" in line for line in lines)
    # Four pods, every turn to the next: nothing lost or doubled, the retried turn stored once.
    for conversation in stories:
        row = next(line.split() for line in lines if line.split()[:1] == [conversation.session])
        messages, _, pods, summaries, lost, doubled = row[1:]
        assert int(messages) == sum(len(turn.messages) for turn in conversation.turns)
        assert (pods, lost, doubled) == ("4", "0", "0") and int(summaries) >= 1
    retried = len(stories[1].turns[RETRIED_TURN].messages)
    assert f"{2 * retried} appends, {retried} answered as duplicates (nothing written)" in out
    calls = sum(len(turn.steps) for s in stories for turn in s.turns)
    assert (
        "every tool result was stored after its call; "
        f"no view of the {calls} the pods read needed a repair"
    ) in out
    # Recall finds the rows the view left out; the agent names the client they show.
    w = stories[0].world
    assert "holds no row of the connection log" in out
    rows = [line.strip() for line in lines if f",{w.app},{w.user}," in line]
    assert len(rows) == 2 and all(w.address in row for row in rows)
    assert f"the agent: It is {w.app}:" in flat
    # The window from the first message is in the summary of the final view; truncation lost it.
    assert "still in its summary: " in flat and w.window in flat.split("still in its summary")[1]
    assert "no repair needed" in flat
    assert "the window is not in them" in flat
    # With the prompt cache, ctxstore's views cost less a call than plain truncation's.
    billed = {name: int(value.replace(",", "")) for name, value in BILLED.findall(out)}
    assert billed["ctxstore's views"] < billed["plain truncation"], billed
    assert "OK: nothing lost, nothing doubled" in out
    assert "FAILED" not in out
    # Pods and worker are handed the server: only the demo's own process announces it.
    assert done.stderr.count(ANNOUNCEMENT) == 1
    assert STARTED.format(directory=data_dir) in done.stderr
    assert f"Look again: {look_again(tenant_of(out))}" in out


def tenant_of(out: str) -> str:
    """The demo's tenant, as its first lines name it."""
    return out.split("tenant ", 1)[1].split(")", 1)[0]


def test_the_conversations_are_the_same_every_time_and_well_formed() -> None:
    """A seed gives the same conversations: each result after its call, each message once."""
    for index in range(3):
        conversation = story(index, 7)
        assert conversation == story(index, 7)
        messages = [m for turn in conversation.turns for m in turn.messages]
        called: set[str] = set()
        for message in messages:
            assert all(answered in called for answered in result_ids(message))
            called.update(call_ids(message))
        assert len({fingerprint(m) for m in messages}) == len(messages)
        assert messages[0]["role"] == "system" and messages[1]["role"] == "user"
        assert conversation.world.window in messages[1]["content"]
    assert story(0, 7).world.ticket != story(0, 8).world.ticket


def test_only_the_connection_log_names_the_client_nobody_listed() -> None:
    """The answer to the last question is in one tool result, never said by anyone."""
    conversation = story(0, 7)
    naming = [
        m
        for turn in conversation.turns
        for m in turn.messages
        if conversation.world.app in str(m.get("content"))
    ]
    assert len(naming) == 1 and naming[0]["role"] == "tool"
    assert naming[0]["content"].count(f",{conversation.world.user},") == 2


def test_plain_truncation_keeps_the_system_prompt_and_the_newest_that_fit() -> None:
    """It stops at the first message that does not fit, and never starts with a tool result."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "big"},
        {"role": "tool", "tool_call_id": "c1", "content": "small"},
        {"role": "assistant", "content": "a"},
    ]
    sizes = [10, 5, 5, 500, 20, 30]
    assert plain_truncation(messages, sizes, 1_000) == [0, 1, 2, 3, 4, 5]
    assert plain_truncation(messages, sizes, 100) == [0, 5]  # not the lone second result
    assert plain_truncation(messages, sizes, 35) == [0]


def test_the_cache_cost_prices_the_prefix_shared_with_the_call_before() -> None:
    """0.1x for the leading messages the previous call sent too, 1.25x for the rest."""
    first = (("sys", 100), ("a", 50))
    second = (("sys", 100), ("a", 50), ("b", 50))  # it extends the first
    third = (("sys", 100), ("b", 50))  # the window moved: only the system prompt is shared
    cost = cache_cost([[first, second, third]])
    assert cost.calls == 3
    assert cost.tokens == pytest.approx((150 + 200 + 150) / 3)
    assert cost.cached == pytest.approx((0 + 150 + 100) / 3)
    expected = CACHE_WRITE * 150 + (CACHE_HIT * 150 + CACHE_WRITE * 50)
    expected += CACHE_HIT * 100 + CACHE_WRITE * 50
    assert cost.cost == pytest.approx(expected / 3)
    # Each session's first call shares nothing, whatever the other sessions sent.
    assert cache_cost([[first], [first]]).cached == 0


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


def test_while_the_pods_write_only_each_sessions_first_summary_is_noted() -> None:
    """A summary every few calls would fill the screen: quiet, later ones are only counted."""
    watch = Watch(quiet=True)
    seen = SessionInfo("t", "billing-api", True, count=10, tokens=2_000)
    assert watch.changes(seen) == []
    first = replace(seen, summary_runs=1, tokens_unsummarized=500, summary_tokens=300)
    assert watch.changes(first) == [
        "billing-api: summary #1 covers 1,500 of 2,000 tokens in 300 (0.00 s)"
    ]
    assert watch.changes(replace(first, summary_runs=2)) == []
    failed = replace(first, summary_runs=2, summary_failures=1, summary_error="boom")
    assert watch.changes(failed) == ["billing-api: summary job failed: boom"]
    watch.quiet = False
    assert watch.changes(replace(failed, summary_runs=3))[0].startswith("billing-api: summary #3")
    assert watch.commits == 3


def test_progress_on_a_terminal_is_a_bar_with_notes_above_it() -> None:
    """On a terminal the phases are bars (done/total, unit, what is awaited); notes print above."""
    screen = io.StringIO()
    progress = Progress(Console(file=screen, force_terminal=True, width=120))
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
    progress = Progress(Console(file=io.StringIO(), force_terminal=False))
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
