"""Messages, and what the store answers.

A message goes in as a dict and comes back out equal: the store keeps the
dict the caller gave (as JSON), unknown keys and all, after checking it
against the model below. The model accepts the three shapes agents use:

- OpenAI Chat: ``tool_calls`` on an assistant message, and ``role: tool``
  messages carrying ``tool_call_id``;
- Anthropic Messages: content blocks (``text``, ``image``, ``tool_use``,
  ``tool_result``, ``thinking``, ``redacted_thinking``); block types it does
  not know (``document``, server tools...) are kept as they are;
- OpenAI Responses items (what the OpenAI Agents SDK stores): ``message``
  items with content parts, ``function_call`` / ``function_call_output``
  paired by ``call_id``, ``reasoning`` and the other item types (see
  :mod:`ctxstore._formats`); an item has a ``type`` and no ``role``, and the
  fields that pair it are checked. Item types it does not know are kept as
  they are.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    model_validator,
)
from pydantic import ValidationError as PydanticValidationError
from pydantic_core import from_json

from ctxstore._formats import (
    APPROVAL_REQUEST,
    APPROVAL_RESPONSE,
    CALL_ITEMS,
    REASONING,
    RESULT_ITEMS,
    call_ids,
    item_type,
    result_ids,
)
from ctxstore.errors import InvalidMessageError, MessageTooLargeError

__all__ = [
    "AppendResult",
    "HistoryPage",
    "ImageBlock",
    "Message",
    "RedactedThinkingBlock",
    "RequestView",
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

Role = Literal["system", "developer", "user", "assistant", "tool"]
NonEmpty = Annotated[str, Field(min_length=1)]

_OPEN = ConfigDict(extra="allow", strict=True)


class TextBlock(BaseModel):
    """A text content block."""

    model_config = _OPEN
    type: Literal["text"]
    text: str


class ImageBlock(BaseModel):
    """An image content block (its source is kept, never tokenized)."""

    model_config = _OPEN
    type: Literal["image"]
    source: dict[str, Any]


class ToolUseBlock(BaseModel):
    """An assistant's call of a tool (Anthropic style)."""

    model_config = _OPEN
    type: Literal["tool_use"]
    id: NonEmpty
    name: NonEmpty
    input: dict[str, Any]


class ToolResultBlock(BaseModel):
    """The result of a tool call, inside a user message (Anthropic style)."""

    model_config = _OPEN
    type: Literal["tool_result"]
    tool_use_id: NonEmpty
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None


class ThinkingBlock(BaseModel):
    """A thinking block (its signature is kept, never tokenized)."""

    model_config = _OPEN
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(BaseModel):
    """A redacted thinking block."""

    model_config = _OPEN
    type: Literal["redacted_thinking"]
    data: str


class OtherBlock(BaseModel):
    """A block type this model does not know; kept as it is."""

    model_config = _OPEN
    type: NonEmpty


_KNOWN_BLOCKS = {"text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking"}


def _block_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if isinstance(kind, str) and kind in _KNOWN_BLOCKS else "other"


ContentBlock = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ImageBlock, Tag("image")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[RedactedThinkingBlock, Tag("redacted_thinking")]
    | Annotated[OtherBlock, Tag("other")],
    Discriminator(_block_tag),
]


class FunctionCall(BaseModel):
    """The function an OpenAI-style tool call names."""

    model_config = _OPEN
    name: NonEmpty
    arguments: str


class ToolCall(BaseModel):
    """An assistant's call of a tool (OpenAI style)."""

    model_config = _OPEN
    id: NonEmpty
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    """One message of a conversation.

    Attributes:
        role: system, developer, user, assistant or tool.
        content: Text, a list of content blocks, or ``None`` on an assistant
            message that only calls tools.
        name: An optional participant name.
        tool_calls: OpenAI-style tool calls (assistant only).
        tool_call_id: The call a ``tool`` message answers (required there).
        metadata: Free metadata, kept as given.
    """

    model_config = _OPEN
    role: Role
    content: str | list[ContentBlock] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: NonEmpty | None = None
    metadata: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_shape(self) -> Message:
        blocks = self.content if isinstance(self.content, list) else []
        uses = [b for b in blocks if isinstance(b, ToolUseBlock)]
        results = [b for b in blocks if isinstance(b, ToolResultBlock)]
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError(f"tool_calls are only allowed on assistant messages, not {self.role}")
        if uses and self.role != "assistant":
            raise ValueError(
                f"tool_use blocks are only allowed in assistant messages, not {self.role}"
            )
        if results and self.role not in ("user", "tool"):
            raise ValueError(f"tool_result blocks belong in user or tool messages, not {self.role}")
        if self.role == "tool" and self.tool_call_id is None and not results:
            raise ValueError("a tool message needs a tool_call_id")
        if self.tool_call_id is not None and self.role != "tool":
            raise ValueError(f"tool_call_id is only allowed on tool messages, not {self.role}")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content may be empty only on an assistant message that calls tools")
        call_ids = [c.id for c in self.tool_calls or ()] + [u.id for u in uses]
        if len(call_ids) != len(set(call_ids)):
            raise ValueError("a message calls the same tool call id twice")
        answered = [r.tool_use_id for r in results] + [self.tool_call_id or ""]
        if any(_CONTROL.search(i) for i in call_ids + answered):
            raise ValueError("tool call ids may not hold control characters")
        return self


_MESSAGE = TypeAdapter(Message)
_TOO_DEEP = "a message is nested too deeply (JSON more than about 200 levels deep)"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class Checked:
    """A message that passed validation, ready for the append script.

    Attributes:
        raw: The caller's dict, as given.
        data: Its JSON form (UTF-8), the bytes that are stored.
        role: Its role (``None`` for an OpenAI Responses item that has none).
        call_ids: Tool call ids it makes.
        result_ids: Tool call ids it answers.
    """

    raw: dict[str, Any]
    data: bytes
    role: str | None
    call_ids: tuple[str, ...]
    result_ids: tuple[str, ...]


def check_message(message: object, *, max_bytes: int, index: int | None = None) -> Checked:
    """Validate one message and serialize it.

    Args:
        message: The candidate, a dict.
        max_bytes: The size cap of its JSON form.
        index: Its position in a batch, for the error message.

    Raises:
        InvalidMessageError: It is not a dict, not JSON-serializable, or does
            not fit the message model.
        MessageTooLargeError: Its JSON form is over ``max_bytes``.
    """
    if not isinstance(message, dict):
        raise InvalidMessageError(
            f"a message must be a dict, not {type(message).__name__}", index=index
        )
    try:
        data = json.dumps(
            message, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        ).encode()
    except RecursionError as exc:
        raise InvalidMessageError(_TOO_DEEP, index=index) from exc
    except (TypeError, ValueError) as exc:
        raise InvalidMessageError(
            f"a message must be JSON-serializable: {exc}", index=index
        ) from exc
    if len(data) > max_bytes:
        raise MessageTooLargeError(len(data), max_bytes, index=index)
    # JSON would turn tuples into lists and non-string keys into strings: refuse
    # what would not come back out equal.
    try:
        decoded = from_json(data)
    except ValueError as exc:  # pydantic-core's own depth limit, shallower than Python's
        raise InvalidMessageError(_TOO_DEEP, index=index) from exc
    if decoded != message:
        raise InvalidMessageError(
            "a message may hold only JSON values (dicts with string keys, lists, "
            "strings, numbers, booleans and null): it would not come back out equal",
            index=index,
        )
    if "role" not in message:
        problem = _item_problem(message)
        if problem:
            raise InvalidMessageError(problem, index=index)
        role = None
    else:
        try:
            role = _MESSAGE.validate_python(message).role
        except PydanticValidationError as exc:
            raise InvalidMessageError(_describe(exc), index=index) from None
        except RecursionError as exc:
            raise InvalidMessageError(_TOO_DEEP, index=index) from exc
    # Validated, the ids are where policies looks for them in a stored message.
    return Checked(message, data, role, tuple(call_ids(message)), tuple(result_ids(message)))


def _item_problem(item: dict[str, Any]) -> str | None:
    """What is wrong with an OpenAI Responses item (a message with no role), or None."""
    kind = item_type(item)
    if not kind:
        return "a message needs a role, or (an OpenAI Responses item) a type"
    if kind == "message":
        return "a message item needs a role"

    def named(field: str) -> str | None:
        value = item.get(field)
        if not isinstance(value, str) or not value:
            return f"a {kind} item needs a {field} (a non-empty string)"
        if _CONTROL.search(value):
            return f"a {kind} item's {field} may not hold control characters"
        return None

    if kind in CALL_ITEMS:
        checks = ["call_id"] if item.get("execution") != "server" else []
        if kind in ("function_call", "custom_tool_call"):
            checks.append("name")
        problem = next(filter(None, map(named, checks)), None)
        if problem:
            return problem
        if kind == "function_call" and not isinstance(item.get("arguments"), str):
            return "a function_call item needs its arguments (a JSON string)"
        return None
    if kind in RESULT_ITEMS:
        if kind == "local_shell_call_output" and "call_id" not in item:
            problem = named("id")
        elif item.get("execution") != "server":
            problem = named("call_id")
        else:
            problem = None
        if problem:
            return problem
        return (
            None
            if "output" in item or kind == "tool_search_output"
            else f"a {kind} item needs an output"
        )
    if kind == APPROVAL_REQUEST:
        return named("id")
    if kind == APPROVAL_RESPONSE:
        problem = named("approval_request_id")
        if problem is None and not isinstance(item.get("approve"), bool):
            return "an mcp_approval_response item needs approve (true or false)"
        return problem
    if kind == REASONING and not isinstance(item.get("summary", []), list):
        return "a reasoning item's summary is a list"
    return None


def _describe(exc: PydanticValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False)[:3]:
        where = ".".join(str(part) for part in error["loc"])
        parts.append(f"{where or 'message'}: {error['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


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
        ttl_seconds: The session's TTL, or ``None``.
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
        session_bytes: The most bytes one session may hold.
        session_tokens: The most tokens one session may hold.
        sessions: The most sessions the tenant may have.
        appends_per_second: The sustained append rate of one session.
        append_burst: The burst that rate allows.
        ttl_seconds: Sessions expire this long after their last write.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    message_bytes: Annotated[int, Field(gt=0, lt=2**53)] | None = None
    session_bytes: Annotated[int, Field(gt=0, lt=2**53)] | None = None
    session_tokens: Annotated[int, Field(gt=0, lt=2**53)] | None = None
    sessions: Annotated[int, Field(gt=0, lt=2**53)] | None = None
    appends_per_second: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    append_burst: Annotated[int, Field(gt=0, lt=2**53)] | None = None
    ttl_seconds: Annotated[int, Field(gt=0, le=100 * 365 * 86_400)] | None = None
