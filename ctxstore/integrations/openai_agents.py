"""The OpenAI Agents SDK's ``Session``, over one ctxstore session.

Give a :class:`CtxstoreSession` to the runner and it keeps the conversation:
before a turn the runner reads the history, after it the runner appends the
turn's items, each batch in one atomic append (lock-free, idempotent). Pods
that serve one conversation build sessions with the same id and share it::

    from agents import Agent, Runner
    from ctxstore.integrations.openai_agents import CtxstoreSession

    async with CtxstoreSession.from_url("user-123", url=URL, tenant="acme") as session:
        result = await Runner.run(agent, "Hello", session=session)

Items are stored as the SDK gives them (Responses items: messages, function
calls and their outputs, reasoning...) and come back equal. What the SDK's own
sessions keep that is no message ctxstore knows (an item with neither a role
nor a type, a ``message`` item with no role) is kept too, as it is: the store
holds it in an item of type ``ctxstore.sdk_item``, which the session unwraps.
``get_items`` is the history as stored, which the runner needs; a read that
must fit a context window is :meth:`CtxstoreSession.get_view`, ctxstore's
budgeted view (summarized, tool calls never cut from their outputs), for
callers that build the model's input themselves.

A session works from any event loop of any thread, as its store does
(``Runner.run_sync`` in a thread while another loop runs, ``asyncio.run`` in
several threads at once), and its errors are the SDK's where its own sessions
raise one (settings it does not know: ``TypeError``).

:meth:`CtxstoreSession.recall_tools` gives the agent the recall tools
(:mod:`ctxstore.recall`: search the whole history, read an entry in full,
pin), so it can reach what a compacted view left out::

    agent = Agent(name="helper", tools=[*my_tools, *session.recall_tools()])

Needs the ``openai-agents`` extra (the SDK's ``SessionSettings``: 0.8 or later).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, cast

from agents import FunctionTool, RunContextWrapper, TResponseInputItem
from agents.memory import SessionSettings

from ctxstore.errors import BudgetExceededError, InvalidInputError
from ctxstore.integrations._ids import encode_session_id
from ctxstore.integrations._settle import settled as _settled
from ctxstore.recall import TOOL_NAMES, RecallTools
from ctxstore.store import ContextStore

__all__ = ["CtxstoreSession", "SessionSettingsError"]

_TAIL_LIMIT = 10_000
"""The most messages ``ContextStore.tail`` reads at once; a larger ``limit`` reads the history."""

HELD = "ctxstore.sdk_item"
"""The type of the item that holds, as it is, an SDK item ctxstore keeps no message like
(``{"type": HELD, "item": ...}``): one with neither a role nor a type, a ``message`` item
with no role, or one of this type itself (so that it comes back as it went in)."""


class SessionSettingsError(InvalidInputError, TypeError):
    """Session settings the SDK refuses: an unknown field, or not settings at all.

    A ``TypeError``, as the SDK's own sessions raise, and an
    :class:`~ctxstore.errors.InvalidInputError`, as ctxstore's bad input is.
    """


class CtxstoreSession:
    """The Agents SDK ``Session`` protocol over one ctxstore session.

    Args:
        session_id: The conversation's id, any non-empty string: the store
            keeps it under ``encode_session_id(session_id)``
            (:mod:`ctxstore.integrations._ids`: itself when the store takes it
            as an id, else a reversible escape, or a hash past 128 characters).
        store: The store, bound to the tenant; the caller closes it.
        session_settings: The SDK's settings (or their dict form); their
            ``limit`` applies when :meth:`get_items` is called without one,
            as in the SDK's own sessions.

    Attributes:
        session_id: The conversation's id, as given.
        store_session_id: The store's session id for it.
        store: The store it reads and writes.
        session_settings: The SDK's settings for this session.

    Raises:
        InvalidIdError: ``session_id`` is not a string, or is empty.
        SessionSettingsError: ``session_settings`` names a setting the SDK lacks, or
            is neither settings nor a dict (a ``TypeError``, as in the SDK's sessions).
    """

    def __init__(
        self,
        session_id: str,
        store: ContextStore,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        self.store_session_id = encode_session_id(session_id)
        self.session_id = session_id
        self.store = store
        self.session_settings: SessionSettings | None = (
            SessionSettings() if session_settings is None else _settings(session_settings)
        )
        self._owns_store = False

    @classmethod
    def from_url(
        cls,
        session_id: str,
        *,
        url: str,
        tenant: str,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        **store_kwargs: Any,
    ) -> CtxstoreSession:
        """A session on a store of its own, on the Redis at ``url``; no I/O yet.

        :meth:`aclose` (or ``async with``) closes that store. ``store_kwargs``
        go to :meth:`ContextStore.from_url` (``settings``, ``keyring``...).
        """
        session = cls(
            session_id,
            ContextStore.from_url(url, tenant, **store_kwargs),
            session_settings=session_settings,
        )
        session._owns_store = True
        return session

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The newest ``limit`` items, oldest first; all of them when no limit is set.

        With a limit, one bounded read of the newest entries, whatever the
        history's length; only a limit over 10,000 (the most one read
        returns) on a longer history reads all of it.

        Args:
            limit: How many items, 0 or more; ``None``: ``session_settings.limit``,
                and when that is ``None`` too, the whole history.

        Raises:
            InvalidInputError: ``limit`` is not ``None`` or an integer from 0.
        """
        if limit is None and self.session_settings is not None:
            limit = _settings(self.session_settings).limit
        if limit is None:
            return _unheld(await self.store.get_messages(self.store_session_id))
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise InvalidInputError(
                f"limit must be None or an integer from 0, not {limit!r}",
                tenant=self.store.tenant,
                session=self.store_session_id,
            )
        if limit == 0:
            return []
        newest = await self.store.tail(self.store_session_id, min(limit, _TAIL_LIMIT))
        if limit > _TAIL_LIMIT and len(newest) == _TAIL_LIMIT:
            return _unheld((await self.store.get_messages(self.store_session_id))[-limit:])
        return _unheld(stored.message for stored in newest)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append items in order, all of them or none, in one round trip.

        Items with neither a role nor a type, and ``message`` items with no
        role, are kept as the SDK's own sessions keep them (see the module's
        docstring).

        Raises:
            InvalidMessageError: An item is not a dict, or a Responses item or
                message the store refuses (a function call with no ``call_id``, an
                unknown role); nothing was written.
            QuotaExceededError: The write would pass one of the tenant's quotas.
        """
        if isinstance(items, list | tuple):  # anything else is refused by the store, as it is
            items = [_held(item) for item in items]
        await _settled(self.store.append_many(self.store_session_id, items))

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the newest item and return it; ``None`` when the session is empty."""
        stored = await _settled(self.store.pop(self.store_session_id))
        return None if stored is None else _unhold(stored.message)

    async def clear_session(self) -> None:
        """Drop every item of the session (under its lease; the epoch is bumped)."""
        await _settled(self.store.clear(self.store_session_id))

    async def get_view(
        self, token_budget: int | None = None, *, model: str | None = None
    ) -> list[TResponseInputItem]:
        """The items to send that fit ``token_budget``: ctxstore's view, one round trip.

        System and pinned items, the cached summary standing in for older
        turns (a message in ``<summary>`` tags, of ``Settings.summary_role``),
        then the newest items that fit, tool calls kept with their outputs.
        The history is not changed.

        Args:
            token_budget: In the model's tokens; the store's default if ``None``.
            model: The model's name, for its tokens-per-stored-token factor.

        Raises:
            BudgetExceededError: System and pinned items alone exceed the budget.
        """
        view = await self.store.view(self.store_session_id, token_budget=token_budget, model=model)
        if view.stats.over_budget:
            raise BudgetExceededError(
                view.stats.budget,
                view.stats.protected_tokens,
                tenant=self.store.tenant,
                session=self.store_session_id,
            )
        return _unheld(view.messages)

    def recall_tools(self, names: tuple[str, ...] = TOOL_NAMES) -> list[FunctionTool]:
        """The recall tools over this session, as the SDK's function tools.

        ``search_history``, ``read_entry``, ``pin_message`` and
        ``unpin_message`` (``names``: a subset). A bad call gets a tool
        result saying what was wrong, never an exception in the run.
        """
        recall = RecallTools(self.store, self.store_session_id, names=names)

        def tool(name: str) -> FunctionTool:
            async def invoke(context: RunContextWrapper[Any], arguments: str) -> str:
                return (await recall.execute(name, arguments)).text

            return FunctionTool(
                name=name,
                description=recall.description(name),
                params_json_schema=recall.schema(name),
                on_invoke_tool=invoke,
                strict_json_schema=False,  # optional arguments (limit, offset)
            )

        return [tool(name) for name in recall.names]

    async def aclose(self) -> None:
        """Close the store if this session opened it (:meth:`from_url`); else nothing."""
        if self._owns_store:
            await self.store.aclose()

    async def __aenter__(self) -> CtxstoreSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _settings(given: object) -> SessionSettings:
    """The SDK's settings, or them from their dict form; an unknown key is refused, not dropped.

    Refused as the SDK's own sessions refuse them (its words, a ``TypeError``).
    """
    if isinstance(given, SessionSettings):
        return given
    if not isinstance(given, dict):
        raise SessionSettingsError(
            f"session must be a SessionSettings instance or a dict, got {type(given).__name__}"
        )
    known = {field.name for field in dataclasses.fields(SessionSettings) if field.init}
    unknown = sorted(str(key) for key in given if key not in known)
    if unknown:
        raise SessionSettingsError(f"Unknown session settings: {', '.join(unknown)}")
    return SessionSettings(**given)


def _held(item: Any) -> Any:
    """``item`` as the store keeps it: in a :data:`HELD` item when it is no message it knows."""
    if (
        isinstance(item, dict)
        and "role" not in item
        and (not isinstance(kind := item.get("type"), str) or kind in ("message", HELD))
    ):
        return {"type": HELD, "item": item}
    return item


def _unhold(message: dict[str, Any]) -> TResponseInputItem:
    """The SDK's item a stored message is (what a :data:`HELD` item holds).

    Only what :func:`_held` makes is unwrapped: exactly ``type`` and an ``item`` that is
    a dict. A message of that type written some other way comes back as it is.
    """
    if message.get("type") == HELD and message.keys() == {"type", "item"}:
        held = message["item"]
        if isinstance(held, dict):
            return cast(TResponseInputItem, held)
    return cast(TResponseInputItem, message)


def _unheld(messages: Iterable[dict[str, Any]]) -> list[TResponseInputItem]:
    """The SDK's items stored messages are."""
    return [_unhold(message) for message in messages]
