"""How the ``ctxstore`` command shows what it read: rich tables for people, JSON for scripts.

Only the commands import this module (it imports rich), so ``ctxstore --help``
stays fast. Every ``--json`` shape is built here, once, with keys that stay
the same from one release to the next: new keys may be added, none renamed.

Times are shown in the local time zone, with the zone's name; JSON carries
the milliseconds since the epoch and, beside the main ones, an ISO 8601 UTC
string.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from ctxstore.models import RequestView, SearchHit, SessionInfo, ViewStats

__all__ = [
    "JOB_WORDS",
    "NON_TERMINAL_WIDTH",
    "LimitRow",
    "SessionRow",
    "console",
    "emit_json",
    "entry_time",
    "iso",
    "progress",
    "show",
    "show_forget_plan",
    "show_limits",
    "show_search",
    "show_sessions",
    "show_status",
    "show_sweep",
    "show_view",
    "status_json",
    "view_json",
    "when",
]

NON_TERMINAL_WIDTH = 240
"""Columns a table may use when stdout is a file or a pipe (a terminal's own width otherwise)."""


def console() -> Console:
    """A console on stdout; wide when stdout is not a terminal, so ids are never cut or wrapped."""
    out = Console(highlight=False, soft_wrap=False)
    if not out.is_terminal:
        out.width = NON_TERMINAL_WIDTH
    return out


def show(*tables: Table) -> None:
    """Print tables on stdout; to a file or a pipe without the padding at the end of lines."""
    out = console()

    def write() -> None:
        for number, table in enumerate(tables):
            if number:
                out.print()
            out.print(table)

    if out.is_terminal:
        write()
        return
    with out.capture() as captured:
        write()
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def emit_json(data: Any) -> None:
    """Print ``data`` as indented JSON (UTF-8, key order as built)."""
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def when(ms: int | None) -> str:
    """A time in ms since the epoch, in the local zone, named: ``2025-03-01 14:02:07 CET``.

    One no date can show (an entry id's ms go to 2**64 - 1) is shown as its number.
    """
    if not ms:
        return "-"
    try:
        local = datetime.fromtimestamp(ms / 1000, UTC).astimezone()
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms"
    return local.strftime("%Y-%m-%d %H:%M:%S %Z")


def iso(ms: int | None) -> str | None:
    """A time in ms since the epoch as ISO 8601 in UTC (for JSON); None for none (or no date)."""
    if not ms:
        return None
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return None


def entry_time(entry_id: str | None) -> int | None:
    """The time (ms) a stream entry id carries: ``1714000000123-0`` -> 1714000000123."""
    if not entry_id:
        return None
    head = entry_id.partition("-")[0]
    return int(head) if head.isdigit() else None


def _entry(entry_id: str | None) -> str:
    """An entry id for people: its time first, the id after it."""
    if not entry_id:
        return "-"
    return f"{when(entry_time(entry_id))} (entry {entry_id})"


def _table(
    title: str | None, *columns: str, right: Sequence[str] = (), header: bool = True
) -> Table:
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        show_header=header,
        pad_edge=False,
    )
    for name in columns:
        table.add_column(name, justify="right" if name in right else "left", no_wrap=True)
    return table


@contextmanager
def progress(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr while ``total`` items are read; nothing when stderr is no terminal.

    Yields:
        ``advance(n)``: call it after each batch.
    """
    err = Console(stderr=True)
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )
    with bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


# -- sessions ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionRow:
    """One row of ``ctxstore sessions``.

    Attributes:
        session: The session id.
        messages: Messages in its history.
        tokens: Their tokens (cl100k).
        summarized_tokens: Tokens the cached summary covers (0: no summary).
        last_active_ms: Its last write.
    """

    session: str
    messages: int
    tokens: int
    summarized_tokens: int
    last_active_ms: int

    @classmethod
    def of(cls, info: SessionInfo, last_active_ms: int) -> SessionRow:
        """The row of one session, from its counters."""
        covered = info.tokens - info.tokens_unsummarized if info.summary_covers else 0
        return cls(info.session, info.count, info.tokens, covered, last_active_ms)

    @property
    def coverage(self) -> float:
        """The share of the tokens the summary covers, 0 to 1."""
        return self.summarized_tokens / self.tokens if self.tokens else 0.0

    def as_json(self) -> dict[str, Any]:
        """The row for ``--json``."""
        return {
            "session": self.session,
            "messages": self.messages,
            "tokens": self.tokens,
            "summarized_tokens": self.summarized_tokens,
            "summary_coverage": round(self.coverage, 4),
            "last_active_ms": self.last_active_ms,
            "last_active": iso(self.last_active_ms),
        }


def show_sessions(tenant: str, rows: Sequence[SessionRow], *, as_json: bool) -> None:
    """``ctxstore sessions``: a table, most recently active first."""
    if as_json:
        emit_json({"tenant": tenant, "sessions": [row.as_json() for row in rows]})
        return
    if not rows:
        print(f"tenant {tenant!r} has no sessions")
        return
    table = _table(
        f"sessions of tenant {tenant!r}",
        "session",
        "messages",
        "tokens",
        "summary covers",
        "last activity",
        right=("messages", "tokens", "summary covers"),
    )
    for row in rows:
        covers = (
            f"{row.coverage:.0%} ({row.summarized_tokens:,} tokens)"
            if row.summarized_tokens
            else "-"
        )
        table.add_row(
            row.session, f"{row.messages:,}", f"{row.tokens:,}", covers, when(row.last_active_ms)
        )
    show(table)


# -- status --------------------------------------------------------------------


JOB_WORDS = {
    "queued": "queued",
    "deferred": "waiting to retry",
    "in_progress": "running",
    "complete": "finished (the flag goes down when the job's outcome is recorded)",
    "not_found": "none on the queue: the worker's sweep queues it again within minutes",
}
"""What a due summary's job state means, in words (``JobState`` values)."""


def status_json(info: SessionInfo, job: str | None) -> dict[str, Any]:
    """``ctxstore status --json``: every ``SessionInfo`` field, and the job's state."""
    data = asdict(info)
    data["pinned"] = list(info.pinned)
    data["summary_covers_at_ms"] = entry_time(info.summary_covers)
    data["job"] = job
    return data


def show_status(info: SessionInfo, job: str | None, *, as_json: bool) -> None:
    """``ctxstore status``: a session's counters, summary and jobs, in a two-column table."""
    if as_json:
        emit_json(status_json(info, job))
        return
    table = _table(f"session {info.session!r} of tenant {info.tenant!r}", "", "", header=False)
    covered = info.tokens - info.tokens_unsummarized if info.summary_covers else 0
    last_job = info.summary_last_outcome or "-"
    if info.summary_last_at_ms:
        last_job += f" at {when(info.summary_last_at_ms)}"
    if info.summary_last_seconds is not None:
        last_job += f", in {info.summary_last_seconds:.2f} s"
    rows: list[tuple[str, str]] = [
        ("messages", f"{info.count:,} ({info.tokens:,} tokens)"),
        ("first message", when(info.first_at_ms)),
        ("last message", when(info.last_at_ms)),
        ("epoch / seq", f"{info.epoch} / {info.seq} (the epoch grows with each replace or clear)"),
        ("pinned", f"{len(info.pinned)} messages"),
        ("summary covers", _entry(info.summary_covers)),
        (
            "summary",
            f"{covered:,} tokens in {info.summary_tokens:,} (saves {info.tokens_saved:,}), "
            f"by {info.summary_model or '-'}"
            if info.summary_covers
            else "none yet (views truncate)",
        ),
        ("not summarized", f"{info.tokens_unsummarized:,} tokens past the summary"),
        (
            "summary due",
            "yes, since " + when(info.summary_due_since_ms) if info.summary_due else "no",
        ),
        ("job", JOB_WORDS.get(job, job) if job else "-"),
        ("jobs", f"{info.summary_runs} committed, {info.summary_failures} failed"),
        ("last job", last_job),
    ]
    if info.summary_error:
        rows.append(("last error", f"{info.summary_error} ({when(info.summary_failed_at_ms)})"))
    rows.append(("checkpoints", f"{info.checkpoints} ({info.branches} branches from rewinds)"))
    if info.forked_from:
        rows.append(("forked from", f"{info.forked_from!r} at entry {info.fork_point}"))
    if info.shared_messages:
        rows.append(("shared", f"{info.shared_messages:,} messages read from frozen segments"))
    rows.append(("ttl", f"{info.ttl_seconds:,} s" if info.ttl_seconds else "none (never expires)"))
    for name, value in rows:
        table.add_row(name, value)
    show(table)


# -- view ----------------------------------------------------------------------


def view_json(tenant: str, session: str, view: RequestView) -> dict[str, Any]:
    """``ctxstore view --json``: the stats and the messages."""
    return {
        "tenant": tenant,
        "session": session,
        "stats": asdict(view.stats),
        "messages": view.messages,
    }


def _stats_rows(stats: ViewStats) -> list[tuple[str, str]]:
    return [
        ("budget", f"{stats.budget:,} model tokens ({stats.budget_cl100k:,} cl100k)"),
        ("sent", f"{stats.messages:,} messages, {stats.tokens:,} tokens"),
        ("history", f"{stats.history_messages:,} messages, {stats.history_tokens:,} tokens"),
        ("dropped", f"{stats.dropped:,} messages"),
        ("system + pinned", f"{stats.protected_tokens:,} tokens"),
        ("summary", _entry(stats.summary_covers) if stats.summary_used else "not used"),
        ("offloaded", f"{len(stats.offloaded)} tool results sent as previews"),
        ("repairs", "; ".join(stats.repairs) or "none"),
        (
            "over budget",
            "yes: system and pinned messages alone exceed it" if stats.over_budget else "no",
        ),
        ("entries read", f"{stats.entries_read:,} (epoch {stats.epoch})"),
    ]


def _preview(message: dict[str, Any], width: int = 100) -> str:
    """A message's text on one line, cut to ``width`` characters."""
    content = message.get("content")
    if isinstance(content, list):
        parts = [
            str(block.get("text") or block.get("type", ""))
            if isinstance(block, dict)
            else str(block)
            for block in content
        ]
        content = " | ".join(parts)
    if not content and message.get("tool_calls"):
        content = "calls " + ", ".join(map(_tool_name, message["tool_calls"]))
    text = " ".join(str(content if content is not None else message.get("type", "")).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _tool_name(call: dict[str, Any]) -> str:
    """The tool a ``tool_calls`` entry calls: OpenAI's ``function.name``, Amplifier's ``tool``."""
    function = call.get("function")
    return str(function.get("name", "?") if isinstance(function, dict) else call.get("tool", "?"))


def show_view(
    tenant: str, session: str, view: RequestView, *, messages: bool, as_json: bool
) -> None:
    """``ctxstore view``: the view's stats, and with ``messages`` one line per message."""
    if as_json:
        emit_json(view_json(tenant, session, view))
        return
    table = _table(f"view of session {session!r} of tenant {tenant!r}", "", "", header=False)
    for name, value in _stats_rows(view.stats):
        table.add_row(name, value)
    if not messages:
        show(table)
        return
    listed = _table("messages sent", "#", "role", "content", right=("#",))
    for number, message in enumerate(view.messages, 1):
        role = str(message.get("role") or message.get("type") or "?")
        listed.add_row(str(number), role, _preview(message))
    show(table, listed)


def show_search(
    tenant: str, session: str, query: str, hits: Sequence[SearchHit], *, as_json: bool
) -> None:
    """``ctxstore search``: one row per match, best first."""
    if as_json:
        emit_json(
            {
                "tenant": tenant,
                "session": session,
                "query": query,
                "hits": [
                    {"entry_id": h.entry_id, "role": h.role, "score": h.score, "snippet": h.snippet}
                    for h in hits
                ],
            }
        )
        return
    title = f"{len(hits)} matches for {query!r} in session {session!r} of tenant {tenant!r}"
    table = _table(title, "#", "entry", "when", "role", "score", "snippet", right=("#", "score"))
    table.columns[-1].no_wrap = False
    for number, hit in enumerate(hits, 1):
        table.add_row(
            str(number),
            hit.entry_id,
            when(entry_time(hit.entry_id)),
            hit.role,
            f"{hit.score:.2f}",
            hit.snippet,
        )
    show(table)


# -- limits --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LimitRow:
    """One limit of ``ctxstore limits``.

    Attributes:
        name: The ``TenantLimits`` field.
        unit: What its value counts.
        value: The value in force; None: no limit.
        source: ``tenant`` (the tenant's own), ``setting`` (the variable is
            set), ``default`` (the settings' built-in default) or ``none``.
        variable: The setting it falls back to (``CTXSTORE_MAX_SESSIONS``).
        tenant_value: The tenant's own value, None when it has none.
        default: The setting's value (None: no limit).
    """

    name: str
    unit: str
    value: float | None
    source: str
    variable: str
    tenant_value: float | None
    default: float | None

    def as_json(self) -> dict[str, Any]:
        """The row for ``--json``."""
        return {
            "value": self.value,
            "unit": self.unit,
            "source": self.source,
            "variable": self.variable,
            "tenant_value": self.tenant_value,
            "default": self.default,
        }

    @property
    def where(self) -> str:
        """Where the value comes from, in words."""
        return {
            "tenant": "the tenant's own limit",
            "setting": self.variable,
            "default": f"default ({self.variable} unset)",
            "none": f"none ({self.variable} unset)",
        }[self.source]


def _amount(value: float | None, unit: str) -> str:
    if value is None:
        return "no limit"
    return f"{value:,g} {unit}" if isinstance(value, float) else f"{value:,} {unit}"


def show_limits(tenant: str, rows: Sequence[LimitRow], *, as_json: bool) -> None:
    """``ctxstore limits``: each limit in force, and where it comes from."""
    if as_json:
        emit_json({"tenant": tenant, "limits": {row.name: row.as_json() for row in rows}})
        return
    table = _table(f"limits of tenant {tenant!r}", "limit", "in force", "from", "flag")
    for row in rows:
        table.add_row(
            row.name, _amount(row.value, row.unit), row.where, "--" + row.name.replace("_", "-")
        )
    show(table)


# -- forget, sweep -------------------------------------------------------------


def show_forget_plan(
    tenant: str, sessions: Sequence[tuple[str, int]], *, more: bool, as_json: bool
) -> None:
    """``ctxstore forget --dry-run``: what would be deleted, deleting nothing."""
    if as_json:
        emit_json(
            {
                "tenant": tenant,
                "dry_run": True,
                "sessions": [
                    {"session": s, "last_active_ms": ms, "last_active": iso(ms)}
                    for s, ms in sessions
                ],
                "more": more,
            }
        )
        return
    count = f"{len(sessions):,}{' or more' if more else ''}"
    print(
        f"forget would delete tenant {tenant!r}: {count} sessions, its limits and its index "
        "(dry run: nothing was deleted)"
    )
    if not sessions:
        return
    table = _table(None, "session", "last activity")
    for session, ms in sessions:
        table.add_row(session, when(ms))
    show(table)


def show_sweep(report: dict[str, int], *, as_json: bool) -> None:
    """``ctxstore sweep``: what the sweep looked at and queued."""
    if as_json:
        emit_json(report)
        return
    table = _table("sweep", "sessions looked at", "queued again", "job queued or running")
    table.add_row(f"{report['sessions']:,}", f"{report['queued']:,}", f"{report['waiting']:,}")
    show(table)
