"""LangChain's chat message history, over one ctxstore session.

Give LangChain a :class:`CtxstoreChatMessageHistory` wherever it takes a
``BaseChatMessageHistory`` (``RunnableWithMessageHistory``, say); pods that
serve one conversation build histories with the same session id and share it::

    from langchain_core.runnables.history import RunnableWithMessageHistory
    from ctxstore.integrations.langchain import CtxstoreChatMessageHistory

    chain = RunnableWithMessageHistory(
        model, lambda session_id: CtxstoreChatMessageHistory(session_id, store)
    )
    await chain.ainvoke("Hello", config={"configurable": {"session_id": "user-123"}})

Any non-empty string is a session id here: one the store takes as it is
(``user-123``) names the store session of that name; any other (``Ada
Lovelace/1``, ``会話-7``, a 300-character one) is stored under an encoding of
it that no other string shares (:mod:`ctxstore.integrations._ids`).

``RunnableWithMessageHistory`` is deprecated from langchain-core 1.x; an agent
from LangChain 1.x's ``create_agent`` takes ctxstore as a middleware instead
(:mod:`ctxstore.integrations.langchain_middleware`).

The async methods (``aget_messages``, ``aadd_messages``, ``aclear``) run on
the caller's event loop against the store; a batch is one atomic append. The
sync ones (``messages``, ``add_messages``, ``clear``) are for sync code: each
call runs on a private event loop, with a connection of its own opened from
``store.settings`` and closed when the call ends (a store's connections belong
to the loop that opened them). Called while an event loop runs in the thread,
that private loop runs on a worker thread and the caller waits for it:
nothing deadlocks, but the running loop is blocked meanwhile, so async code
should use the async methods. :meth:`CtxstoreChatMessageHistory.aget_view` is
ctxstore's budgeted view, for the input of one model call.

How a message is stored: as the chat message the store pairs, counts and
summarizes (OpenAI Chat form), plus LangChain's own form, which is what comes
back, so every message round trips exactly:

- ``role``: ``user`` (``HumanMessage``, and ``FunctionMessage``, whose legacy
  ``function`` role the store does not know), ``assistant`` (``AIMessage``),
  ``system``, ``tool`` (``ToolMessage``); a ``ChatMessage``'s own role when
  it is ``system``, ``developer``, ``user`` or ``assistant``, else ``user``;
- ``content``: a string as it is; a list of blocks as its text blocks, and
  each image as ``{"type": "image", "source": {}}`` (counted as an image);
  other blocks (tool use, thinking, files...) are only in LangChain's form;
- ``name``, when the message has one;
- ``tool_calls`` (an ``AIMessage``'s calls that have an id, invalid ones too:
  id, function name and JSON arguments) and ``tool_call_id``, so the view
  keeps each call with its result;
- ``langchain``: ``message_to_dict(message)``, without ``data.content`` when
  the content is a string: that is kept once, at the top, where the view
  puts a large tool result's preview.

So what LangChain keeps must be JSON (``artifact``, ``additional_kwargs``,
tool arguments): a message that would not come back equal is refused.
Messages another client stored without the ``langchain`` key are read with
LangChain's ``convert_to_messages``.

Needs the ``langchain`` extra (``langchain-core``).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_messages,
    message_to_dict,
    messages_from_dict,
)
from langchain_core.tools import BaseTool, StructuredTool

from ctxstore.errors import BudgetExceededError, CorruptEntryError, InvalidMessageError
from ctxstore.integrations._ids import encode_session_id
from ctxstore.integrations._settle import settled
from ctxstore.recall import TOOL_NAMES, RecallTools
from ctxstore.store import ContextStore

__all__ = ["LANGCHAIN_KEY", "CtxstoreChatMessageHistory"]

LANGCHAIN_KEY = "langchain"
"""The key of a stored message that holds LangChain's form of it."""

_CHAT_ROLES = frozenset({"system", "developer", "user", "assistant"})
_ALIASES = {"human": "user", "ai": "assistant"}
_IMAGE_BLOCKS = frozenset({"image", "image_url", "input_image"})
_UNNAMED = "unnamed"
"""The function name stored for an invalid tool call that has none (the store needs one)."""

_T = TypeVar("_T")


class CtxstoreChatMessageHistory(BaseChatMessageHistory):  # type: ignore[misc]
    """LangChain's ``BaseChatMessageHistory`` over one ctxstore session.

    The async methods use ``store``; each call of a sync one opens a store
    of its own from ``store.settings`` (its URL, tenant, keyring, counter
    and clock), on a private event loop, and closes it on return.

    Args:
        session_id: The conversation's id, any non-empty string (LangChain
            passes the caller's through as it is). The store keeps the
            session under ``encode_session_id(session_id)``
            (:mod:`ctxstore.integrations._ids`): the same id when it already
            is a store session id, else an encoding of it that no other
            string shares.
        store: The store, bound to the tenant; the caller closes it.

    Attributes:
        session_id: The conversation's id, as given.
        store_session_id: The store's session id for it.
        store: The store it reads and writes.

    Raises:
        InvalidIdError: ``session_id`` is not a string, or is empty.
    """

    def __init__(self, session_id: str, store: ContextStore) -> None:
        super().__init__()
        self.store_session_id = encode_session_id(session_id)
        self.session_id = session_id
        self.store = store
        self._owns_store = False

    @classmethod
    def from_url(
        cls, session_id: str, *, url: str, tenant: str, **store_kwargs: Any
    ) -> CtxstoreChatMessageHistory:
        """A history on a store of its own, on the Redis at ``url``; no I/O yet.

        :meth:`aclose` (or ``async with``) closes that store. ``store_kwargs``
        go to :meth:`ContextStore.from_url` (``settings``, ``keyring``...).
        """
        history = cls(session_id, ContextStore.from_url(url, tenant, **store_kwargs))
        history._owns_store = True
        return history

    # -- async: the store's own calls ------------------------------------------

    async def aget_messages(self) -> list[BaseMessage]:
        """Every message of the session, oldest first, as it was added.

        Raises:
            CorruptEntryError: A stored message LangChain cannot read.
        """
        return [
            self._read(stored) for stored in await self.store.get_messages(self.store_session_id)
        ]

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append messages in order, all of them or none, in one round trip.

        Raises:
            InvalidMessageError: A message is not one this history stores
                (``RemoveMessage``, not a message), holds what JSON cannot
                carry back equal, or is not one the store accepts (a
                ``ToolMessage`` with an empty ``tool_call_id``); nothing
                was written.
            QuotaExceededError: The write would pass one of the tenant's quotas.
        """
        # Settled: a cancelled caller's batch still lands whole or not at all, and
        # the cancellation is raised after (as the OpenAI Agents session does).
        await settled(self.store.append_many(self.store_session_id, self._encoded(messages)))

    async def areplace_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Make the session hold ``messages`` and nothing else, in one fenced rewrite.

        Under the session's lease; the epoch is bumped and the cached summary dropped.

        Raises:
            InvalidMessageError: As :meth:`aadd_messages`; nothing was written.
        """
        await settled(self.store.replace(self.store_session_id, self._encoded(messages)))

    async def aclear(self) -> None:
        """Drop every message of the session (under its lease; the epoch is bumped)."""
        await settled(self.store.clear(self.store_session_id))

    async def aget_view(
        self, token_budget: int | None = None, *, model: str | None = None
    ) -> list[BaseMessage]:
        """The messages to send that fit ``token_budget``: ctxstore's view, one round trip.

        System and pinned messages, the cached summary standing in for older
        turns, then the newest messages that fit, tool calls kept with their
        results. The summary is a message in ``<summary>`` tags of
        ``Settings.summary_role``: a ``HumanMessage`` (``user``, the default,
        which keeps a cached system prompt byte-stable) or a ``SystemMessage``.
        Messages come back as sent: an ``AIMessage`` without the calls the
        view dropped (those never answered), a large tool result as its
        preview. The history is not changed.

        Args:
            token_budget: In the model's tokens; the store's default if ``None``.
            model: The model's name, for its tokens-per-stored-token factor.

        Raises:
            BudgetExceededError: System and pinned messages alone exceed the budget.
            CorruptEntryError: A stored message LangChain cannot read.
        """
        view = await self.store.view(self.store_session_id, token_budget=token_budget, model=model)
        if view.stats.over_budget:
            raise BudgetExceededError(
                view.stats.budget,
                view.stats.protected_tokens,
                tenant=self.store.tenant,
                session=self.store_session_id,
            )
        return [_as_sent(self._read(sent), sent) for sent in view.messages]

    def recall_tools(self, names: tuple[str, ...] = TOOL_NAMES) -> list[BaseTool]:
        """The recall tools over this session, as LangChain tools (async: ``ainvoke``).

        ``search_history``, ``read_entry``, ``pin_message`` and
        ``unpin_message`` (``names``: a subset), for ``bind_tools`` or an
        agent. A bad call gets a tool result saying what was wrong, never an
        exception in the agent loop.
        """
        recall = RecallTools(self.store, self.store_session_id, names=names)

        def tool(name: str) -> BaseTool:
            async def run(**arguments: Any) -> str:
                return (await recall.execute(name, arguments)).text

            return StructuredTool.from_function(
                coroutine=run,
                name=name,
                description=recall.description(name),
                args_schema=recall.schema(name),
            )

        return [tool(name) for name in recall.names]

    async def aclose(self) -> None:
        """Close the store if this history opened it (:meth:`from_url`); else nothing."""
        if self._owns_store:
            await self.store.aclose()

    async def __aenter__(self) -> CtxstoreChatMessageHistory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- sync: the same calls, on a private loop --------------------------------

    @property
    def messages(self) -> list[BaseMessage]:
        """Every message of the session, oldest first (sync :meth:`aget_messages`)."""
        return self._blocking(CtxstoreChatMessageHistory.aget_messages)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append messages in order, all of them or none (sync :meth:`aadd_messages`)."""
        self._blocking(lambda history: history.aadd_messages(messages))

    def clear(self) -> None:
        """Drop every message of the session (sync :meth:`aclear`)."""
        self._blocking(CtxstoreChatMessageHistory.aclear)

    def _blocking(self, call: Callable[[CtxstoreChatMessageHistory], Awaitable[_T]]) -> _T:
        """Run ``call`` on a twin of this history, on a private loop and store, to its end.

        Outside an event loop the private loop runs in this thread; under a
        running one it runs on a worker thread (with this thread's context
        variables), and this thread waits.
        """

        def run() -> _T:
            # A factory, so the thread's current event loop is neither used nor replaced.
            with asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
                return runner.run(self._on_own_store(call))

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return run()
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctxstore-langchain") as worker:
            return worker.submit(contextvars.copy_context().run, run).result()

    async def _on_own_store(
        self, call: Callable[[CtxstoreChatMessageHistory], Awaitable[_T]]
    ) -> _T:
        """``call`` on a twin of this history whose store is opened, and closed, on this loop."""
        store = self.store
        async with ContextStore.from_settings(
            store.settings,
            tenant=store.tenant,
            counter=store.counter,
            clock=store.clock,
            keyring=store.keyring,
        ) as own:
            return await call(CtxstoreChatMessageHistory(self.session_id, own))

    # -- the one edge to LangChain's forms ---------------------------------------

    def _encoded(self, messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
        """The messages as they are stored (see the module's docstring)."""
        encoded = []
        for index, message in enumerate(messages):
            role = _role(message)
            if role is None:
                raise InvalidMessageError(
                    f"not a message this history can store: {type(message).__name__}",
                    index=index,
                    tenant=self.store.tenant,
                    session=self.store_session_id,
                )
            encoded.append(_encode(message, role))
        return encoded

    def _read(self, stored: dict[str, Any]) -> BaseMessage:
        """A stored message as LangChain's; a ``CorruptEntryError`` if it cannot be one."""
        try:
            return _decode(stored)
        except (KeyError, TypeError, ValueError, NotImplementedError) as exc:
            raise CorruptEntryError(
                f"a stored message LangChain cannot read: {exc}",
                tenant=self.store.tenant,
                session=self.store_session_id,
            ) from exc


def _role(message: object) -> str | None:
    """The stored role of a LangChain message; ``None`` for what this history does not store."""
    if isinstance(message, HumanMessage | FunctionMessage):
        return "user"
    if isinstance(message, AIMessage):
        return "assistant"
    if isinstance(message, SystemMessage):
        return "system"
    if isinstance(message, ToolMessage):
        return "tool"
    if isinstance(message, ChatMessage):
        role = _ALIASES.get(message.role, message.role)
        return role if role in _CHAT_ROLES else "user"
    return None


def _encode(message: BaseMessage, role: str) -> dict[str, Any]:
    """A LangChain message as it is stored: its chat form, and its own under ``langchain``."""
    own = message_to_dict(message)
    stored: dict[str, Any] = {"role": role}
    if isinstance(message.content, str):
        stored["content"] = own["data"].pop("content")
    else:
        stored["content"] = _blocks(message.content)
    if message.name is not None:
        stored["name"] = message.name
    if isinstance(message, AIMessage) and (calls := _calls(message)):
        stored["tool_calls"] = calls
    if isinstance(message, ToolMessage):
        stored["tool_call_id"] = message.tool_call_id
    stored[LANGCHAIN_KEY] = own
    return stored


def _blocks(content: list[Any]) -> list[dict[str, Any]]:
    """The blocks of a content list the store counts: texts, and images as a stand-in."""
    blocks: list[dict[str, Any]] = []
    for block in content:
        if isinstance(block, str):
            blocks.append({"type": "text", "text": block})
        elif not isinstance(block, dict):
            continue
        elif block.get("type") == "text" and isinstance(block.get("text"), str):
            blocks.append({"type": "text", "text": block["text"]})
        elif block.get("type") in _IMAGE_BLOCKS:
            blocks.append({"type": "image", "source": {}})  # the image itself is LangChain's
    return blocks


def _calls(message: AIMessage) -> list[dict[str, Any]]:
    """An AI message's tool calls that have an id, in OpenAI Chat form."""
    made = [
        (call["id"], call["name"], json.dumps(call["args"], ensure_ascii=False, default=repr))
        for call in message.tool_calls
    ]
    # An invalid call is sent to the model too, and may be answered by a ToolMessage.
    made += [(call["id"], call["name"], call["args"]) for call in message.invalid_tool_calls]
    return [
        {
            "id": call_id,
            "type": "function",
            "function": {"name": name or _UNNAMED, "arguments": arguments or ""},
        }
        for call_id, name, arguments in made
        if call_id
    ]


def _decode(stored: dict[str, Any]) -> BaseMessage:
    """A stored message as LangChain's: its own form when it has one, else converted."""
    own = stored.get(LANGCHAIN_KEY)
    if own is None:  # the view's summary, or a chat message another client stored
        return convert_to_messages([stored])[0]
    data = own["data"]
    if "content" not in data:
        data = {**data, "content": stored["content"]}
    return messages_from_dict([{"type": own["type"], "data": data}])[0]


def _as_sent(message: BaseMessage, sent: dict[str, Any]) -> BaseMessage:
    """``message`` as the view sent it: without the calls it dropped, its preview if any.

    A string content comes back from the top of the stored message, so it
    is already the preview; a list is replaced by the preview's text blocks.
    """
    content = message.content
    if isinstance(content, list) and _blocks(content) != sent.get("content"):
        previewed = [block for block in sent["content"] if block.get("type") == "text"]
        message = message.model_copy(update={"content": previewed})
    if isinstance(message, AIMessage):
        kept = {call["id"] for call in sent.get("tool_calls") or ()}
        dropped = {call["id"] for call in _calls(message)} - kept
        if dropped:
            message = _without_calls(message, dropped)
    return message


def _without_calls(message: AIMessage, dropped: set[str]) -> AIMessage:
    """``message`` without the tool calls ``dropped``, wherever LangChain keeps them."""

    def kept(call: object) -> bool:
        return not (isinstance(call, dict) and call.get("id") in dropped)

    update: dict[str, Any] = {
        "tool_calls": [call for call in message.tool_calls if kept(call)],
        "invalid_tool_calls": [call for call in message.invalid_tool_calls if kept(call)],
    }
    if isinstance(message.content, list):  # Anthropic's tool_use blocks
        update["content"] = [
            block
            for block in message.content
            if kept(block) or not (isinstance(block, dict) and block.get("type") == "tool_use")
        ]
    raw = message.additional_kwargs.get("tool_calls")
    if isinstance(raw, list):  # OpenAI's own form, as older integrations kept it
        kwargs = dict(message.additional_kwargs)
        kwargs["tool_calls"] = [call for call in raw if kept(call)]
        if not kwargs["tool_calls"]:
            del kwargs["tool_calls"]
        update["additional_kwargs"] = kwargs
    return message.model_copy(update=update)
