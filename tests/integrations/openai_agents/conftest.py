"""The OpenAI Agents SDK's own tests, ported: their session under test is a CtxstoreSession.

Each ported module names, at its top, the SDK file it comes from and the SDK
version. The session each test builds (``SQLiteSession(...)``,
``SimpleListSession(...)``) is a :class:`CtxstoreSession` here, on the test Redis,
under a key prefix of the test's own; everything else (the assertions, the
runner calls, the threads and event loops) is the SDK's. The SDK's
``session.close()`` calls are left to the ``new_session`` fixture, which closes
the store after the test, from an event loop of its own in another thread (a
store serves any loop).

The SDK is installed in the pods' environments only: elsewhere these modules
are not collected.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.config import RUN_PREFIX

from ctxstore import ContextStore, Settings

if importlib.util.find_spec("agents") is None:  # the pods' environments run them
    collect_ignore_glob = ["test_*.py"]

NewSession = Callable[..., Any]
"""``new_session(session_id, session_settings=None)``: a CtxstoreSession of the test's store."""


@pytest.fixture
def own_settings(settings: Settings, tenant: str) -> Settings:
    """The test's settings under a key prefix (and summary queue) of its own."""
    prefix = f"{RUN_PREFIX}-{tenant}"
    return settings.model_copy(update={"key_prefix": prefix, "queue_name": f"{prefix}:summaries"})


@pytest.fixture
def new_session(own_settings: Settings, tenant: str) -> Iterator[NewSession]:
    """Builds CtxstoreSessions on one store of the test's own; the store is closed after."""
    from ctxstore.integrations.openai_agents import CtxstoreSession

    store = ContextStore.from_settings(own_settings, tenant=tenant)

    def make(session_id: str, session_settings: Any = None) -> CtxstoreSession:
        return CtxstoreSession(session_id, store, session_settings=session_settings)

    yield make
    with concurrent.futures.ThreadPoolExecutor(1) as closer:
        closer.submit(asyncio.run, store.aclose()).result()


@pytest.fixture(autouse=True)
def sdk_test_defaults(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """What the SDK's own test configuration sets: no traces exported, no real model called."""
    from agents import set_tracing_disabled
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
    from agents.models.openai_responses import OpenAIResponsesModel
    from agents.run import set_default_agent_runner

    def no_real_model(*args: Any, **kwargs: Any) -> Any:
        pytest.fail("Real models should not be used in tests!")

    for model in (OpenAIResponsesModel, OpenAIChatCompletionsModel):
        monkeypatch.setattr(model, "get_response", no_real_model)
        monkeypatch.setattr(model, "stream_response", no_real_model)
    set_default_agent_runner(None)
    set_tracing_disabled(True)
    try:
        yield
    finally:
        set_tracing_disabled(False)
