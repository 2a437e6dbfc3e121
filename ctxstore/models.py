"""What the store answers: write results, history pages, session info, views, summaries.

The messages themselves, and their checks, are :mod:`ctxstore._layout.messages`'
(re-exported here, where they were first).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from ctxstore._layout.messages import (
    ImageBlock,
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultBlock,
    ToolUseBlock,
)

__all__ = [
    "AppendResult",
    "Branch",
    "Checkpoint",
    "ForkResult",
    "HistoryPage",
    "ImageBlock",
    "ImportResult",
    "Message",
    "RedactedThinkingBlock",
    "RequestView",
    "RewindResult",
    "SearchHit",
    "SessionInfo",
    "SessionSummary",
    "StoredMessage",
    "Summary",
    "SummaryOutcome",
    "SummaryStatus",
    "TenantLimits",
    "TextBlock",
    "ThinkingBlock",
    "ToolCall",
    "ToolResultBlock",
    "ToolUseBlock",
    "ViewStats",
    "WriteResult",
]


@dataclass(frozen=True, slots=True)
class AppendResult:
    """What an append answers.

    Attributes:
        entry_id: The message's stream entry id (its place in the total order).
        seq: The session's sequence number after this message.
        epoch: The session's epoch (bumped by every replace and clear).
        duplicate: True when the idempotency key was seen before: nothing
            was written and ``entry_id`` is the original one.
        summary_due: True when this append crossed the summary threshold.
    """

    entry_id: str
    seq: int
    epoch: int
    duplicate: bool = False
    summary_due: bool = False


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What a replace or clear answers.

    Attributes:
        epoch: The session's new epoch.
        seq: The session's new sequence number.
        count: Messages in the history now.
        superseded: Messages of the previous history that were dropped.
        entry_ids: The new entries' ids, in order.
    """

    epoch: int
    seq: int
    count: int
    superseded: int
    entry_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message as stored.

    Attributes:
        entry_id: Its stream entry id.
        message: The message dict, as it was appended.
        tokens: Its token count (cl100k), counted once at append.
    """

    entry_id: str
    message: dict[str, Any]
    tokens: int


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where a session was when it was recorded: what ``rewind`` and ``fork`` can go back to.

    Attributes:
        checkpoint_id: Its id in the session (``cp-1``, ``cp-2``...).
        entry_id: The last entry of the history then (``""``: it was empty).
        seq: The session's sequence number then.
        epoch: The session's epoch then.
        count: Messages in the history then.
        tokens: Their tokens.
        created_ms: When it was recorded.
        name: The name it was given, if any.
        summary_covers: The last entry the summary in force then covered (a
            copy of it is kept with the checkpoint), or ``None``.
        branch: ``None`` while its entry is in the history; the id of the
            branch holding it once a rewind abandoned it.
        covered_tokens: The history's tokens that summary covers.
    """

    checkpoint_id: str
    entry_id: str
    seq: int
    epoch: int
    count: int
    tokens: int
    created_ms: int
    name: str | None = None
    summary_covers: str | None = None
    branch: str | None = None
    covered_tokens: int = 0


@dataclass(frozen=True, slots=True)
class RewindResult:
    """What a rewind answers.

    Attributes:
        epoch: The session's new epoch.
        seq: Its new sequence number.
        count: Messages in the history now.
        abandoned: Messages that were after the entry rewound to, now in ``branch``.
        branch: The branch holding them (``read_branch``), or ``None`` when
            the history already ended there (nothing changed).
    """

    epoch: int
    seq: int
    count: int
    abandoned: int
    branch: str | None


@dataclass(frozen=True, slots=True)
class ForkResult:
    """What a fork answers.

    Attributes:
        session: The new session.
        source: The session it was forked from.
        at: The entry its history ends at (``""``: the source was empty).
        count: Messages in its history.
        tokens: Their tokens.
        epoch: Its epoch.
        seq: Its sequence number.
        copied: Entries copied into its own log (what its views read); the
            rest of its history is shared with the source, never copied.
    """

    session: str
    source: str
    at: str
    count: int
    tokens: int
    epoch: int
    seq: int
    copied: int


@dataclass(frozen=True, slots=True)
class ImportResult:
    """One session an import read.

    Attributes:
        session: The session it was written to.
        status: ``"imported"``, or ``"unchanged"`` when the session held this
            very import already (nothing was written).
        count: Its messages.
        checkpoints: Its checkpoints.
        source: The tenant and session it was exported from (``tenant/session``).
    """

    session: str
    status: str
    count: int
    checkpoints: int
    source: str


@dataclass(frozen=True, slots=True)
class Branch:
    """The tail a rewind abandoned: readable until it is pushed out, expires or the session goes.

    Attributes:
        branch_id: Its id in the session (``br-1``, ``br-2``...).
        at: The entry the history was rewound to (``""``: before the first).
        end: The last entry it holds.
        count: Messages it holds.
        tokens: Their tokens.
        created_ms: When the rewind made it.
        epoch: The epoch of the history it was cut from.
        readable: False once its entries have expired (they last the
            session's TTL from the rewind on).
        bytes: What it holds against the session's ``session_bytes`` quota:
            the entries the rewind moved out of the live history, charged
            as their append was, until the branch goes.
    """

    branch_id: str
    at: str
    end: str
    count: int
    tokens: int
    created_ms: int
    epoch: int
    readable: bool = True
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class HistoryPage:
    """One page of a session's full history, oldest first.

    Attributes:
        messages: The page's messages.
        epoch: The epoch the page was read in.
        next_after: Pass as ``after`` to read the next page; ``None`` at the end.
    """

    messages: list[StoredMessage]
    epoch: int
    next_after: str | None


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session's counters.

    Attributes:
        tenant: The tenant.
        session: The session id.
        exists: False when the session has never been written (or was deleted).
        epoch: Bumped by every replace and clear.
        seq: Grows with every write; never reused.
        count: Messages in the history.
        tokens: Their tokens (cl100k).
        first_at_ms: When the first message of the history was appended.
        last_at_ms: When the last one was.
        ttl_seconds: The session's own TTL; with none, the seconds until it
            expires; ``None`` if it never does.
        pinned: Entry ids of pinned messages.
        summary_covers: The entry id the cached summary covers up to.
        summary_tokens: The cached summary's tokens.
        tokens_unsummarized: Tokens after the summary watermark (the lag).
        tokens_saved: Tokens the summary stands in for, minus its own.
        summary_model: Who wrote the summary.
        summary_due: True while a summary job is flagged (queued or running).
        summary_runs: Summaries committed.
        summary_failures: Summary jobs that failed.
        summary_error: The last failure, or ``None`` since a success.
        summary_last_at_ms: When the last job ended.
        summary_last_seconds: How long it took.
        summary_last_outcome: ``committed``, ``idle`` or ``failed``.
        summary_generation: The generation of the last summary job flagged.
        summary_due_since_ms: When the summary flag went up.
        summary_failed_at_ms: When the last summary job failed.
        forked_from: The session it was forked from, if it is a fork.
        fork_point: The entry of that session its history was forked at.
        shared_messages: Messages of its history read from frozen segments
            (shared with the sessions forked from, or to) rather than its own log.
        checkpoints: Checkpoints it keeps.
        branches: Branches (abandoned tails) it keeps.
    """

    tenant: str
    session: str
    exists: bool
    epoch: int = 0
    seq: int = 0
    count: int = 0
    tokens: int = 0
    first_at_ms: int | None = None
    last_at_ms: int | None = None
    ttl_seconds: int | None = None
    pinned: tuple[str, ...] = ()
    summary_covers: str | None = None
    summary_tokens: int = 0
    tokens_unsummarized: int = 0
    tokens_saved: int = 0
    summary_model: str | None = None
    summary_due: bool = False
    summary_runs: int = 0
    summary_failures: int = 0
    summary_error: str | None = None
    summary_last_at_ms: int | None = None
    summary_last_seconds: float | None = None
    summary_last_outcome: str | None = None
    summary_generation: int = 0
    summary_due_since_ms: int | None = None
    summary_failed_at_ms: int | None = None
    forked_from: str | None = None
    fork_point: str | None = None
    shared_messages: int = 0
    checkpoints: int = 0
    branches: int = 0


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One entry a search found.

    Attributes:
        entry_id: The entry (``ContextStore.get_entry`` returns it whole).
        role: Its role, or its item type for an OpenAI Responses item.
        snippet: Up to about 200 characters of its text around the first match.
        score: Its BM25 score (higher is better; comparable within one search).
    """

    entry_id: str
    role: str
    snippet: str
    score: float


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """One row of a tenant's session list.

    Attributes:
        session: The session id.
        last_active_ms: The time of its last write.
    """

    session: str
    last_active_ms: int


@dataclass(slots=True)
class ViewStats:
    """What a request view kept, dropped and repaired.

    Attributes:
        budget: The budget, in the model's tokens, asked for.
        budget_cl100k: The budget in stored (cl100k) tokens, after the model's
            safety factor.
        tokens: Tokens (cl100k) of the messages returned.
        history_messages: Messages in the full history.
        history_tokens: Their tokens.
        messages: Messages returned.
        dropped: History messages not returned (older than the tail, or cut
            with their tool exchange).
        protected_tokens: Tokens of system and pinned messages.
        summary_used: True when a cached summary stood in for older turns.
        summary_covers: The entry id the summary covers up to.
        offloaded: Tool results sent as a preview, by entry id.
        repairs: Tool-pair repairs, e.g. ``"dropped orphan result call_9"``.
        over_budget: True when system and pinned messages alone exceed the
            budget (then only those are returned).
        compacted: True when anything was dropped, summarized or offloaded.
        epoch: The epoch the view was read in.
        entries_read: Stream entries the script read: it follows the budget,
            not the history's length.
    """

    budget: int
    budget_cl100k: int
    tokens: int = 0
    history_messages: int = 0
    history_tokens: int = 0
    messages: int = 0
    dropped: int = 0
    protected_tokens: int = 0
    summary_used: bool = False
    summary_covers: str | None = None
    offloaded: list[str] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)
    over_budget: bool = False
    compacted: bool = False
    epoch: int = 0
    entries_read: int = 0


@dataclass(slots=True)
class RequestView:
    """The messages to send before a model call, and how they were chosen.

    Attributes:
        messages: System messages, pinned messages, the summary if any, then
            the newest messages that fit, in conversation order.
        stats: What was kept, dropped and repaired.
    """

    messages: list[dict[str, Any]]
    stats: ViewStats


@dataclass(frozen=True, slots=True)
class Summary:
    """A summary at two levels, as a summarizer writes it (``summarize_levels``).

    Views send the largest level that fits: the ledger alone (level 1), or
    the ledger and the narrative (level 2).

    Attributes:
        ledger: A compact, entity-keyed ledger of the facts (a few hundred tokens).
        narrative: A longer chronological account (may be empty).
        state: The summarizer's own memory between folds (opaque JSON, e.g.
            its entries and how often each was referred to); never sent to a model.
    """

    ledger: str
    narrative: str = ""
    state: str | None = None

    @property
    def text(self) -> str:
        """Both levels as one text (the largest level a view can send)."""
        return f"{self.ledger}\n\n{self.narrative}" if self.narrative else self.ledger


class SummaryStatus(StrEnum):
    """How a summary job ended (also the session's ``summary_last_outcome``)."""

    COMMITTED = "committed"
    """A new summary was swapped in."""
    IDLE = "idle"
    """Nothing could be covered yet (too little, or a tool exchange still open)."""
    FAILED = "failed"
    """The summarizer failed; the error is recorded on the session."""
    STALE = "stale"
    """A replace, clear or another commit came between: the result was thrown away."""
    LEASE_LOST = "lease_lost"
    """The lease expired or a writer took it: the result was thrown away."""


@dataclass(frozen=True, slots=True)
class SummaryOutcome:
    """What a summary job did.

    Attributes:
        status: How it ended (a :class:`SummaryStatus`).
        covers_upto: The entry id the summary now covers, when committed.
        entries: Messages the new summary covers that the last one did not.
        input_tokens: Tokens sent to the summarizer (history and previous summary).
        summary_tokens: The new summary's tokens.
        chunks: Summarizer calls made.
        seconds: How long the job took.
        next_generation: When more is already due, the job to queue next (else 0).
    """

    status: SummaryStatus
    covers_upto: str | None = None
    entries: int = 0
    input_tokens: int = 0
    summary_tokens: int = 0
    chunks: int = 0
    seconds: float = 0.0
    next_generation: int = 0


class TenantLimits(BaseModel):
    """A tenant's quotas and retention; ``None`` means the settings' default.

    Attributes:
        message_bytes: The largest message (JSON bytes).
        session_bytes: The most bytes one session may hold (its messages,
            pinned copies, checkpoints and branches).
        session_tokens: The most tokens one session may hold.
        sessions: The most sessions the tenant may have.
        appends_per_second: The sustained append rate of one session.
        append_burst: The burst that rate allows.
        ttl_seconds: Sessions expire this long after their last write (and at
            most a tenth of it, a minute at most, later: see ``Settings``).
        checkpoints: The most checkpoints one session may keep.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    message_bytes: Annotated[int, Field(gt=0, lt=2**53)] | None = None
    session_bytes: Annotated[int, Field(gt=0, lt=2**53)] | None = None
    session_tokens: Annotated[int, Field(gt=0, lt=2**53)] | None = None
    sessions: Annotated[int, Field(gt=0, lt=2**53)] | None = None
    appends_per_second: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    append_burst: Annotated[int, Field(gt=0, lt=2**53)] | None = None
    ttl_seconds: Annotated[int, Field(gt=0, le=100 * 365 * 86_400)] | None = None
    checkpoints: Annotated[int, Field(gt=0, lt=2**31)] | None = None
