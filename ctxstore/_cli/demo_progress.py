"""What the demo shows while it runs: a bar per phase, and what changed in each session.

On a terminal the phases (the pods writing, the summary jobs finishing) are
rich progress bars with notes printed above them; elsewhere (a pipe, a log,
CI) each is a line per quarter and per change. The notes say when a
session's summary was committed, failed, or found nothing to cover yet.
"""

from __future__ import annotations

import asyncio
import multiprocessing.connection
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ctxstore.models import SessionInfo, SummaryStatus

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from rich.console import Console
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID

    from ctxstore.store import ContextStore

__all__ = ["TICK", "Progress", "Watch", "follow_summaries", "look", "wait_for_exit"]

TICK = 0.2
"""Seconds between two looks at the sessions while nothing else happens."""


class Progress:
    """What the demo is doing, as it happens.

    On a terminal (``console``, else stdout's): a rich progress bar per
    phase, with notes printed above it. Elsewhere (a pipe, a log, CI): a
    line when a phase reaches each quarter or its detail changes, and a
    line per note; every line is stamped with the seconds since the start.
    """

    def __init__(self, console: Console | None = None) -> None:
        from rich.console import Console

        self._console = console or Console()
        self._started = time.monotonic()
        self._bar: RichProgress | None = None
        self._task: TaskID | None = None
        self._label = ""
        self._unit = ""
        self._total = 1
        self._printed: tuple[int, str] | None = None
        if self._console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("{task.description:<12}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[unit]}"),
                TimeElapsedColumn(),
                TextColumn("{task.fields[detail]}"),
                console=self._console,
            )
            self._bar.start()

    def phase(self, label: str, total: int, unit: str) -> None:
        """Start a phase of ``total`` steps, counted in ``unit``."""
        self._label, self._total, self._unit = label, max(total, 1), unit
        self._printed = None
        if self._bar is not None:
            if self._task is not None:
                self._bar.stop_task(self._task)
            self._task = self._bar.add_task(label, total=total, unit=unit, detail="")

    def update(self, done: int, detail: str = "") -> None:
        """``done`` steps of the phase are done; ``detail`` says what it waits for."""
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=done, detail=detail)
            return
        quarter = min(4, 4 * done // self._total)
        if (quarter, detail) != self._printed:
            self._printed = (quarter, detail)
            percent = min(100, 100 * done // self._total)
            waiting = f"; {detail}" if detail else ""
            self.note(f"{self._label}: {done:,}/{self._total:,} {self._unit} ({percent}%){waiting}")

    def note(self, text: str) -> None:
        """Print one line (above the bar, on a terminal)."""
        line = f"[{time.monotonic() - self._started:5.1f} s] {text}"
        if self._bar is not None:
            self._bar.console.print(line, markup=False, highlight=False)
        else:
            print(line, flush=True)

    def close(self) -> None:
        """Leave the bar as it last was."""
        if self._bar is not None:
            self._bar.stop()


@dataclass
class Watch:
    """The sessions as last seen, to say what changed in each since.

    Attributes:
        seen: Each session's counters at the last look.
        quiet: Note only a session's first summary (and failures); count the rest.
    """

    seen: dict[str, SessionInfo] = field(default_factory=dict)
    quiet: bool = False

    def changes(self, info: SessionInfo) -> list[str]:
        """What happened to the session since the last look, one line per event."""
        before = self.seen.get(info.session) or SessionInfo(info.tenant, info.session, False)
        self.seen[info.session] = info
        lines = []
        name = info.session
        if info.summary_runs > before.summary_runs:
            covered = info.tokens - info.tokens_unsummarized
            if not self.quiet or before.summary_runs == 0:
                lines.append(
                    f"{name}: summary #{info.summary_runs} covers {covered:,} of {info.tokens:,} "
                    f"tokens in {info.summary_tokens:,} ({info.summary_last_seconds or 0:.2f} s)"
                )
        elif info.summary_failures > before.summary_failures:
            lines.append(f"{name}: summary job failed: {info.summary_error}")
        elif (
            info.summary_last_at_ms != before.summary_last_at_ms
            and info.summary_last_outcome == SummaryStatus.IDLE
            and not (self.quiet and info.summary_runs)
        ):
            lines.append(
                f"{name}: summary job idle, no cut point yet; "
                "an append that makes one queues another"
            )
        return lines

    @property
    def commits(self) -> int:
        """Summaries committed in all the sessions seen."""
        return sum(info.summary_runs for info in self.seen.values())


async def look(
    store: ContextStore, sessions: Sequence[str], watch: Watch, progress: Progress
) -> list[SessionInfo]:
    """Read every session's counters; note what changed."""
    infos = await asyncio.gather(*(store.info(session) for session in sessions))
    for info in infos:
        for line in watch.changes(info):
            progress.note(line)
    return list(infos)


async def wait_for_exit(processes: Sequence[BaseProcess]) -> None:
    """Return when one of ``processes`` exits, or after a tick (to look again)."""
    live = [process.sentinel for process in processes if process.is_alive()]
    if live:
        await asyncio.to_thread(multiprocessing.connection.wait, live, TICK)


async def follow_summaries(
    store: ContextStore,
    sessions: Sequence[str],
    worker: BaseProcess,
    limit_s: float,
    watch: Watch,
    progress: Progress,
) -> list[SessionInfo]:
    """Wait until no session has a summary job flagged; return those still flagged.

    Some are left only if the worker exited, or ``limit_s`` seconds passed.
    """
    deadline = time.monotonic() + limit_s
    progress.phase("summarizing", len(sessions), "sessions done")
    while True:
        infos = await look(store, sessions, watch, progress)
        pending = [info for info in infos if info.summary_due]
        waiting = ", ".join(info.session for info in pending)
        progress.update(len(infos) - len(pending), f"waiting for {waiting}" if pending else "")
        if not pending or not worker.is_alive() or time.monotonic() > deadline:
            return pending
        await wait_for_exit([worker])
