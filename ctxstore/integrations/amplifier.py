"""The Amplifier ``ContextManager`` adapter, over one ctxstore session.

Registered as the ``context-ctxstore`` module (entry point group
``amplifier.modules``). Mount it with an empty config and it works: Redis
from the settings (``CTXSTORE_REDIS_URL``) or an embedded one, the default
tenant and a new session id. Pods that serve one conversation pass the same
``session_id`` and share the history.

Config keys:
    redis_url: The store's Redis (else ``CTXSTORE_REDIS_URL``, else embedded).
    tenant: The tenant (else ``CTXSTORE_TENANT``, else ``default``).
    session_id: The session, any non-empty string; a new one by default.
    key_prefix: The first part of every key (else ``CTXSTORE_KEY_PREFIX``).
    max_tokens: The budget when neither the caller nor the provider gives one.
    compaction_threshold: Compact when the history passes this share of the
        budget, down to that share (0 < t <= 1; 0.92 by default).
    keep_stored_on_resume: If the session already had messages when mounted,
        ignore the first ``set_messages`` (the host's filtered transcript would
        lose system messages); True by default, as seed 000 asks of
        persistent context managers.
    recall_tools: Also mount the recall tools (search the whole history,
        read an entry in full, pin; :mod:`ctxstore.recall`); True by default.
    protected_recent: The newest share of the messages (0 to 1) that
        compaction keeps, as context-simple's option of that name: when the
        view compacted down to the threshold would leave any of them out,
        the view takes the whole budget instead, so the newest tool exchange
        stays whole while the budget can hold it. What the budget cannot
        hold is still left out. 0 (off) by default.
    add_timestamps: Stamp each added message's ``metadata.timestamp`` with
        the time it was added, as context-simple does (ISO 8601 in UTC, to
        the millisecond, in the store's clock when it was given one). A
        timestamp already there is kept, the caller's dict is not changed,
        and ``set_messages`` stamps nothing. False by default: the history
        is then exactly what was added.

Messages are stored as Amplifier's modules write them: the tool calls of an
assistant message as ``{"id", "tool", "arguments"}``, content blocks as
amplifier-core's message models dump them. Content blocks given as objects
are stored as their model's own dump (a pydantic model's
``model_dump(mode="json")``, a content-models block's ``to_dict()``) and
given back as that dump.

Compaction is a view: the history is never changed by it. When a view drops,
summarizes or offloads anything, ``context:pre_compact`` and
``context:post_compact`` are emitted with message and token counts.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from ctxstore.budget import MAX_BUDGET, Budget, resolve_budget
from ctxstore.errors import BudgetExceededError, ConfigurationError, InvalidInputError
from ctxstore.integrations._ids import encode_session_id
from ctxstore.models import RequestView
from ctxstore.recall import TOOL_NAMES, RecallTools
from ctxstore.settings import Settings
from ctxstore.store import ContextStore

__all__ = ["RecallTool", "StoreContextManager", "mount"]

log = logging.getLogger("ctxstore.amplifier")  # its name before it moved: log configs use it

EVENTS = ("context:pre_compact", "context:post_compact")
_TAIL_LIMIT = 10_000  # the most one ContextStore.tail reads
_SETTINGS_KEYS = ("redis_url", "tenant", "key_prefix")


class StoreContextManager:
    """Amplifier's five-method ``ContextManager`` over one ctxstore session.

    Args:
        store: The store (bound to the tenant).
        session_id: The conversation this manager reads and writes, any
            non-empty string (kept under ``encode_session_id(session_id)``,
            :mod:`ctxstore.integrations._ids`).
        max_tokens: The fallback budget; the store's default if ``None``.
        compaction_threshold: Compact past this share of the budget, down to it.
        hooks: Something with ``async emit(event, data)``, for the events.
        keep_stored_on_resume: Ignore the first ``set_messages`` if the
            session already had messages.
        protected_recent: The newest share of the messages that compaction
            down to the threshold keeps (see the module's config keys).
        add_timestamps: Stamp each added message's ``metadata.timestamp``.
    """

    def __init__(
        self,
        store: ContextStore,
        session_id: str,
        *,
        max_tokens: int | None = None,
        compaction_threshold: float = 0.92,
        hooks: Any | None = None,
        keep_stored_on_resume: bool = False,
        protected_recent: float = 0.0,
        add_timestamps: bool = False,
    ) -> None:
        problem = _check_limits(max_tokens, compaction_threshold) or _check_options(
            protected_recent, add_timestamps
        )
        if problem:
            raise InvalidInputError(problem)
        self.store = store
        self.store_session_id = encode_session_id(session_id)
        self.session_id = session_id
        self.max_tokens = max_tokens
        self.compaction_threshold = compaction_threshold
        self.protected_recent = protected_recent
        self.add_timestamps = add_timestamps
        self.last_view: RequestView | None = None
        self.last_model: str | None = None
        self._hooks = hooks
        self._ignore_next_set = keep_stored_on_resume

    async def add_message(self, message: dict[str, Any]) -> None:
        """Append a message to the session (validated; one round trip, no lock).

        Raises:
            InvalidMessageError: It is malformed, or holds what is not JSON;
                nothing is written.
        """
        self._ignore_next_set = False
        message = _as_json(message)
        if self.add_timestamps:
            message = _stamped(message, self._now())
        await self.store.append(self.store_session_id, message)

    async def get_messages_for_request(
        self,
        token_budget: int | None = None,
        provider: Any | None = None,
    ) -> list[dict[str, Any]]:
        """The messages to send: compacted to fit, tool pairs whole, history untouched.

        Raises:
            BudgetExceededError: System and pinned messages alone exceed the budget.
        """
        settings = self.store.settings
        budget = resolve_budget(  # once: the provider is asked at most once per request
            token_budget,
            provider,
            model=None,
            default=self.max_tokens or settings.default_token_budget,
            margin=settings.provider_safety_margin,
            factors=settings.token_safety_factors,
        )
        view = await self._view(budget, self.compaction_threshold)
        stats = view.stats
        # Compacting down to the threshold left no room, or left out some of
        # the newest messages kept whole (protected_recent): the whole budget
        # may hold them. Read again only if it can.
        if self.compaction_threshold < 1 and (
            (stats.over_budget and stats.protected_tokens <= budget.cl100k)
            or (not stats.over_budget and await self._leaves_out_recent(view))
        ):
            view = await self._view(budget, 1.0)
            stats = view.stats
        self.last_view = view
        if stats.over_budget:
            raise BudgetExceededError(
                budget.tokens,
                stats.protected_tokens,
                tenant=self.store.tenant,
                session=self.store_session_id,
            )
        if stats.compacted:
            await self._emit(
                "context:pre_compact",
                {"message_count": stats.history_messages, "token_count": stats.history_tokens},
            )
            await self._emit(
                "context:post_compact",
                {
                    "message_count": stats.messages,
                    "token_count": stats.tokens,
                    "dropped": stats.dropped,
                    "summary_used": stats.summary_used,
                    "offloaded": len(stats.offloaded),
                    "repairs": list(stats.repairs),
                },
            )
        return view.messages

    async def _leaves_out_recent(self, view: RequestView) -> bool:
        """Whether ``view`` leaves out any of the newest ``protected_recent`` share.

        As context-simple counts it: the newest ``n - int(n * (1 - share))``
        of the history's ``n`` messages (10,000 at most). A view that dropped
        nothing holds them all (a tool result sent as its preview is still
        sent); one that did is compared with them, as stored (one read).
        One sent moved or stripped by a repair counts as left out: the whole
        budget's view is taken, which holds at least as much.
        """
        stats = view.stats
        if not self.protected_recent or not stats.dropped:
            return False
        count = stats.history_messages
        newest = min(count - int(count * (1 - self.protected_recent)), _TAIL_LIMIT)
        if newest <= 0:
            return False
        if newest > len(view.messages):
            return True
        stored = await self.store.tail(self.store_session_id, newest)
        sent = view.messages[len(view.messages) - len(stored) :]
        previews = set(stats.offloaded)
        return any(
            kept.entry_id not in previews and kept.message != message
            for kept, message in zip(stored, sent, strict=True)
        )

    async def _view(self, budget: Budget, share: float) -> RequestView:
        """The view at ``share`` of the resolved budget (its model picks the factor)."""
        self.last_model = budget.model
        return await self.store.view(
            self.store_session_id,
            token_budget=max(1, int(budget.tokens * share)),
            model=budget.model,
        )

    async def record_usage(
        self, input_tokens: int, *, model: str | None = None, overhead_tokens: int = 0
    ) -> float:
        """Report the input tokens the provider billed for the last request (``record_usage``).

        Raises:
            InvalidInputError: No request was made yet, or no model is known.
        """
        view, model = self.last_view, model or self.last_model
        if view is None or model is None:
            raise InvalidInputError("record_usage needs a request made, and its model")
        return await self.store.record_usage(
            view, input_tokens, model=model, overhead_tokens=overhead_tokens
        )

    async def record_overflow(self, *, model: str | None = None) -> float:
        """The provider refused the last request as too long: the next one is smaller."""
        model = model or self.last_model
        if model is None:
            raise InvalidInputError("record_overflow needs the model")
        return await self.store.record_overflow(model=model)

    async def get_messages(self) -> list[dict[str, Any]]:
        """The full history, uncompacted."""
        return await self.store.get_messages(self.store_session_id)

    async def set_messages(self, messages: list[dict[str, Any]]) -> None:
        """Replace the history (session resume), under the session's lease.

        Raises:
            InvalidMessageError: One of them is malformed; nothing is written.
        """
        if self._ignore_next_set:
            self._ignore_next_set = False
            log.info(
                "ignoring set_messages: session %s was loaded from the store", self.store_session_id
            )
            return
        given = [_as_json(m) for m in messages] if isinstance(messages, list) else messages
        await self.store.replace(self.store_session_id, given)

    async def should_compact(self) -> bool:
        """False, always: each request's view compacts (loop-events asks after each turn)."""
        return False

    async def compact(self) -> None:
        """Nothing to do: the history is never compacted, each request's view is."""

    async def clear(self) -> None:
        """Drop every message of the session."""
        self._ignore_next_set = False
        await self.store.clear(self.store_session_id)

    def recall_tools(self, names: tuple[str, ...] = TOOL_NAMES) -> list[RecallTool]:
        """The recall tools over this session, as Amplifier tools (to mount as ``tools``)."""
        recall = RecallTools(self.store, self.store_session_id, names=names)
        return [RecallTool(recall, name) for name in recall.names]

    def _now(self) -> str:
        """The time, as context-simple stamps it: ISO 8601, UTC, milliseconds."""
        clock = self.store.clock
        moment = (
            datetime.now(UTC)
            if clock is None
            else datetime.fromtimestamp(clock.now_ms() / 1000, UTC)
        )
        return moment.isoformat(timespec="milliseconds")

    async def _emit(self, event: str, data: dict[str, Any]) -> None:
        if self._hooks is None:
            return
        try:
            await self._hooks.emit(event, data)
        except Exception:
            log.warning("hook for %s failed", event, exc_info=True)


class RecallTool:
    """One recall tool as Amplifier's ``Tool`` protocol: name, description, schema, execute.

    Args:
        recall: The executor over the session.
        name: The tool's name (one of ``ctxstore.recall.TOOL_NAMES``).
    """

    def __init__(self, recall: RecallTools, name: str) -> None:
        self._recall = recall
        self.name = name
        self.description = recall.description(name)
        self.input_schema = recall.schema(name)

    async def execute(self, input: dict[str, Any]) -> Any:
        """Run the call; a refused one is a failed ``ToolResult`` naming the fault."""
        from amplifier_core.models import ToolResult

        outcome = await self._recall.execute(self.name, input)
        if outcome.is_error:
            return ToolResult(success=False, output=outcome.text, error={"message": outcome.text})
        return ToolResult(success=True, output=outcome.text)


async def mount(
    coordinator: Any, config: dict[str, Any] | None = None
) -> Callable[[], Awaitable[None]]:
    """Mount a ctxstore-backed context manager on an Amplifier coordinator.

    Returns:
        An async cleanup function that closes the store's connections.
    """
    config = dict(config or {})
    max_tokens = config.get("max_tokens")
    threshold = config.get("compaction_threshold", 0.92)
    keep_stored = config.get("keep_stored_on_resume", True)
    with_tools = config.get("recall_tools", True)
    protected_recent = config.get("protected_recent", 0.0)
    add_timestamps = config.get("add_timestamps", False)
    problem = _check_limits(max_tokens, threshold) or _check_options(
        protected_recent, add_timestamps
    )
    if problem is None and not isinstance(keep_stored, bool):
        problem = f"keep_stored_on_resume must be true or false, not {keep_stored!r}"
    if problem is None and not isinstance(with_tools, bool):
        problem = f"recall_tools must be true or false, not {with_tools!r}"
    if problem is not None:
        raise ConfigurationError(f"invalid context-ctxstore config: {problem}")
    try:
        settings = Settings(**{k: config[k] for k in _SETTINGS_KEYS if config.get(k) is not None})
    except ConfigurationError as exc:
        raise ConfigurationError(f"invalid context-ctxstore config: {exc}") from exc
    store = ContextStore.from_settings(settings)
    try:
        session_id = config.get("session_id") or uuid.uuid4().hex
        existed = (
            (await store.info(encode_session_id(session_id))).count > 0
            if config.get("session_id")
            else False
        )
        context = StoreContextManager(
            store,
            session_id,
            max_tokens=max_tokens,
            compaction_threshold=threshold,
            hooks=getattr(coordinator, "hooks", None),
            keep_stored_on_resume=existed and keep_stored,
            protected_recent=protected_recent,
            add_timestamps=add_timestamps,
        )
        await coordinator.mount("context", context, name="context-ctxstore")
        for tool in context.recall_tools() if with_tools else ():
            await coordinator.mount("tools", tool, name=tool.name)
        register = getattr(coordinator, "register_contributor", None)
        if register is not None:
            register("observability.events", "context-ctxstore", lambda: list(EVENTS))
    except BaseException:
        await store.aclose()  # nothing holds the store now: close its connections
        raise

    async def cleanup() -> None:
        await store.aclose()

    return cleanup


def _check_limits(max_tokens: object, compaction_threshold: object) -> str | None:
    """What is wrong with these two settings, or ``None`` (booleans are not numbers)."""
    if max_tokens is not None and (
        isinstance(max_tokens, bool)
        or not isinstance(max_tokens, int)
        or not 0 < max_tokens <= MAX_BUDGET
    ):
        return f"max_tokens must be an integer from 1 to {MAX_BUDGET:,}, not {max_tokens!r}"
    if (
        isinstance(compaction_threshold, bool)
        or not isinstance(compaction_threshold, int | float)
        or not 0 < compaction_threshold <= 1
    ):
        return f"compaction_threshold must be a number in (0, 1], not {compaction_threshold!r}"
    return None


def _check_options(protected_recent: object, add_timestamps: object) -> str | None:
    """What is wrong with the context-simple options, or ``None``."""
    if (
        isinstance(protected_recent, bool)
        or not isinstance(protected_recent, int | float)
        or not 0 <= protected_recent <= 1
    ):
        return f"protected_recent must be a number from 0 to 1, not {protected_recent!r}"
    if not isinstance(add_timestamps, bool):
        return f"add_timestamps must be true or false, not {add_timestamps!r}"
    return None


def _as_json(message: Any) -> Any:
    """``message``, its content blocks given as objects replaced by their model's own dump.

    A pydantic model (amplifier-core's message models) is dumped with
    ``model_dump(mode="json")``; a block of amplifier-core's content models
    (dataclasses) with its ``to_dict()``. Anything else is left for the
    store to check. The caller's message is not changed.
    """
    if not isinstance(message, dict):
        return message
    content = message.get("content")
    if not isinstance(content, list) or all(isinstance(b, dict) for b in content):
        return message  # the usual case: nothing to dump
    return {**message, "content": [_dumped(block) for block in content]}


def _dumped(block: Any) -> Any:
    if isinstance(block, BaseModel):
        return block.model_dump(mode="json")
    if dataclasses.is_dataclass(block) and not isinstance(block, type):
        to_dict = getattr(block, "to_dict", None)
        if callable(to_dict):
            return to_dict()
    return block


def _stamped(message: Any, now: str) -> Any:
    """``message`` with ``metadata.timestamp`` set to ``now`` unless one is there."""
    if not isinstance(message, dict):
        return message
    metadata = message.get("metadata") or {}
    if not isinstance(metadata, dict) or "timestamp" in metadata:
        return message  # one kept as given; metadata that is not a dict is refused
    return {**message, "metadata": {**metadata, "timestamp": now}}
