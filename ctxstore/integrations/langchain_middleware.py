"""LangChain 1.x agents over ctxstore: a middleware that stores the messages and sends the view.

An agent from ``create_agent`` takes a :class:`CtxstoreMiddleware`; the
session is the run's ``thread_id`` unless ``session_id=`` says otherwise::

    from langchain.agents import create_agent
    from langgraph.checkpoint.memory import InMemorySaver
    from ctxstore.integrations.langchain_middleware import CtxstoreMiddleware

    agent = create_agent(
        model,
        tools,
        system_prompt="You are a careful agent.",
        middleware=[CtxstoreMiddleware(store, token_budget=60_000)],
        checkpointer=InMemorySaver(),
    )
    await agent.ainvoke(
        {"messages": [{"role": "user", "content": "Hello"}]},
        {"configurable": {"thread_id": "Ada Lovelace/1"}},
    )

At each step of the agent's loop:

- before each model call (``before_model``), the messages of the agent's
  state not yet stored (the user's, the model's last answer, the tool
  results) are appended to the session, in one atomic append;
- the model call (``wrap_model_call``) is sent the session's view in place of
  the state's messages: system and pinned messages, the cached summary, the
  newest messages that fit ``token_budget``, tool calls kept with their
  results, a large tool result as its preview. The agent's system prompt and
  tools go as they are, outside the budget: leave room for them;
- when the agent finishes (``after_agent``), its last messages are appended.

The state keeps every message, as LangChain's agents do; only what the model
is sent changes. How many of the state's messages are stored is kept in the
state itself (two private fields), so with a checkpointer nothing is stored
twice across runs, and the session holds what the thread's state holds. When
something takes stored messages out of the state or swaps them (a
``RemoveMessage``, ``update_state``), the session is rewritten to the state's
messages. A stored message changed in place (the same id, other content) is
not stored again. Without a checkpointer each run's state starts from its
input alone, and the session is the conversation's memory: the view sends
the turns of earlier runs too.

List it last in ``middleware=[...]``: its ``before_model`` then runs after the
others', so what they add is stored before the view is read, and its
``wrap_model_call`` is the innermost. The view replaces the request's
messages, so middleware that edits the messages sent (trimming, summarizing)
has nothing to do next to it; middleware that changes the model, the tools
or the system prompt works as before.

The hooks are async: run the agent with ``ainvoke`` or ``astream`` (its sync
``invoke`` raises LangGraph's ``TypeError`` that no sync hook is provided).

Needs the ``langgraph`` extra (``langchain`` 1.x, which brings LangGraph).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Final, NotRequired

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain.agents.middleware.types import OmitFromSchema
from langgraph.config import get_config
from langgraph.runtime import Runtime

from ctxstore._layout.validate import check_int, check_model
from ctxstore.errors import ConfigurationError
from ctxstore.integrations._ids import encode_session_id
from ctxstore.integrations.langchain import CtxstoreChatMessageHistory
from ctxstore.store import ContextStore

__all__ = ["LAST_STORED_FIELD", "STORED_FIELD", "CtxstoreMiddleware", "CtxstoreState"]

STORED_FIELD: Final = "ctxstore_stored"
"""The state's field that counts its messages already in the session (the first ones)."""
LAST_STORED_FIELD: Final = "ctxstore_last_stored_id"
"""The state's field that holds the id of the last message stored, to see a rewritten state."""

_PRIVATE = OmitFromSchema(input=True, output=True)
"""Neither given to the agent nor returned by it: the middleware's own bookkeeping."""

SessionId = str | Callable[[Runtime[Any]], str]
"""A fixed session id, or one made from the run's ``Runtime`` (its ``context``, say)."""


class CtxstoreState(AgentState[Any]):  # type: ignore[misc]
    """The agent's state, with what the middleware has stored of it."""

    # A TypedDict's fields; mypy sees one only where LangChain is installed (ignores: valid-type).
    ctxstore_stored: NotRequired[Annotated[int, _PRIVATE]]  # type: ignore[valid-type]
    ctxstore_last_stored_id: NotRequired[Annotated[str | None, _PRIVATE]]  # type: ignore[valid-type]


class CtxstoreMiddleware(AgentMiddleware[CtxstoreState, Any]):  # type: ignore[misc]
    """Stores an agent's messages in a ctxstore session and sends the model its view.

    Args:
        store: The store, bound to the tenant; the caller closes it.
        session_id: The session: a string, or a function of the run's
            ``Runtime``; any non-empty string, stored as
            :class:`~ctxstore.integrations.langchain.CtxstoreChatMessageHistory`
            stores it. ``None``: the run's ``thread_id``.
        token_budget: The view's budget, in the model's tokens; the store's
            default if ``None``.
        model: The model's name, for its tokens-per-stored-token factor.

    Attributes:
        store: The store it reads and writes.
        token_budget: The view's budget.
        model: The model's name.

    Raises:
        InvalidInputError: A budget that is not a positive integer, a bad
            model name, or a ``session_id`` string that is empty.
    """

    state_schema = CtxstoreState

    def __init__(
        self,
        store: ContextStore,
        *,
        session_id: SessionId | None = None,
        token_budget: int | None = None,
        model: str | None = None,
    ) -> None:
        super().__init__()
        if isinstance(session_id, str):
            encode_session_id(session_id)  # refuses an empty id now, not at the first run
        self.store = store
        self.token_budget: int | None = check_int(
            token_budget, "token_budget", low=1, optional=True
        )
        self.model = None if model is None else check_model(model)
        self._session_id = session_id

    async def abefore_model(
        self, state: CtxstoreState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Store the state's messages that are not in the session yet."""
        return await self._store_new(state, runtime)

    async def aafter_agent(
        self, state: CtxstoreState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Store the run's last messages (the final answer)."""
        return await self._store_new(state, runtime)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        """Call the model with the session's view in place of the state's messages.

        Raises:
            BudgetExceededError: System and pinned messages alone exceed the budget.
        """
        history = self._history(request.runtime)
        view: list[Any] = await history.aget_view(self.token_budget, model=self.model)
        return await handler(request.override(messages=view))

    async def _store_new(
        self, state: CtxstoreState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Make the session hold the state's messages; the state's new count, if it moved."""
        messages = state["messages"]
        stored = state.get(STORED_FIELD, 0)
        history = self._history(runtime)
        if stored and (
            stored > len(messages) or messages[stored - 1].id != state.get(LAST_STORED_FIELD)
        ):
            await history.areplace_messages(messages)  # the stored ones left the state
        elif stored < len(messages):
            await history.aadd_messages(messages[stored:])
        else:
            return None
        return {
            STORED_FIELD: len(messages),
            LAST_STORED_FIELD: messages[-1].id if messages else None,
        }

    def _history(self, runtime: Runtime[Any]) -> CtxstoreChatMessageHistory:
        """The history of this run's session.

        Raises:
            ConfigurationError: No ``session_id`` was given and the run has no ``thread_id``.
        """
        chosen = self._session_id
        if callable(chosen):
            session = chosen(runtime)
        elif chosen is not None:
            session = chosen
        else:
            thread = get_config().get("configurable", {}).get("thread_id")
            if thread is None:
                raise ConfigurationError(
                    "CtxstoreMiddleware has no session for this run: give it session_id=, "
                    "or run the agent with config={'configurable': {'thread_id': ...}}",
                    tenant=self.store.tenant,
                )
            session = str(thread)  # LangGraph takes a UUID or a number as a thread id too
        return CtxstoreChatMessageHistory(session, self.store)
