"""A Responses reasoning item is sent only right before the item that follows it in the history.

The Responses API refuses a reasoning item sent without the item it led to. The
store ties the two as an exchange: within a batch at append, and to whatever
comes next in the history for a reasoning item that ended its batch. So a
reasoning item whose call is dropped for tool safety (unanswered), cut by the
budget, popped, rewound or forked away, or that is the last item of the
history, is not sent; once an item follows it, the two go together.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator
from typing import Any

import hypothesis
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from support.config import examples
from support.helpers import paired

from ctxstore import ContextStore, LocalSummarizer, Settings
from ctxstore.testing import orphans

_ids = itertools.count()


def _user(text: str = "go") -> dict[str, Any]:
    return {"role": "user", "content": text}


def _reasoning() -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": f"rs_{next(_ids)}",
        "summary": [{"type": "summary_text", "text": "think it over " * 3}],
        "encrypted_content": "gAAAA" + "x" * 200,
    }


def _call(cid: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{cid}",
        "call_id": cid,
        "name": "weather",
        "arguments": '{"city": "paris"}',
    }


def _output(cid: str, text: str = "sunny") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": cid, "output": text}


def _answer(text: str = "done") -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "id": f"msg_{next(_ids)}",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def assert_reasoning_followed(view: list[dict[str, Any]], history: list[dict[str, Any]]) -> None:
    """Each reasoning item of ``view`` is followed there by the item after it in ``history``."""
    where = {m["id"]: i for i, m in enumerate(history) if m.get("type") == "reasoning"}
    for k, message in enumerate(view):
        if message.get("type") != "reasoning":
            continue
        i = where[message["id"]]
        assert i + 1 < len(history), f"{message['id']} is the history's last item: {view}"
        assert k + 1 < len(view) and view[k + 1] == history[i + 1], (message["id"], view, history)


async def _views(
    store: ContextStore, session: str, budgets: tuple[int, ...], cold: ContextStore | None = None
) -> None:
    """Views at each budget: paired, within it, reasoning followed; a cold pod's the same."""
    history = await store.get_messages(session)
    for budget in budgets:
        view = await store.view(session, token_budget=budget)
        assert orphans(view.messages) == 0, view.messages
        paired(view.messages)
        assert view.stats.tokens <= view.stats.budget_cl100k
        assert_reasoning_followed(view.messages, history)
        if cold is not None:  # what a warm pod grew is what a pod planning afresh sends
            assert (await cold.view(session, token_budget=budget)).messages == view.messages


async def test_a_reasoning_item_whose_call_is_unanswered_is_not_sent(store: ContextStore) -> None:
    """[user, reasoning, call] with no output yet: the view sends the user message alone."""
    await store.append_many("s", [_user(), _reasoning(), _call("c1")])
    view = await store.view("s", token_budget=5_000)
    assert view.messages == [_user()]
    await store.append("s", _output("c1"))
    view = await store.view("s", token_budget=5_000)
    assert view.messages == await store.get_messages("s")


async def test_a_reasoning_item_appended_last_waits_for_the_item_after_it(
    store: ContextStore,
) -> None:
    """A reasoning item alone at the end is not sent; appended after, its item brings it along."""
    reasoning = _reasoning()
    await store.append_many("s", [_user(), reasoning])
    assert (await store.view("s", token_budget=5_000)).messages == [_user()]
    await store.append("s", _answer())  # a later call: the tie is to the history's next item
    view = await store.view("s", token_budget=5_000)
    assert view.messages == await store.get_messages("s")
    cold = await store.view("s", token_budget=4_999)  # another budget: planned from scratch
    assert cold.messages == view.messages


@pytest.mark.parametrize("how", ["pop", "rewind", "fork"])
async def test_a_reasoning_item_left_last_by_a_history_move_is_not_sent(
    store: ContextStore, how: str
) -> None:
    """Popping its call, rewinding to it or forking at it leaves the reasoning item unsent."""
    await store.append_many("s", [_user(), _reasoning(), _call("c1"), _output("c1")])
    session = "s"
    if how == "pop":
        await store.pop("s")
        await store.pop("s")
    else:
        at = (await store.tail("s", 3))[0].entry_id  # the reasoning item
        if how == "rewind":
            await store.rewind("s", at)
        else:
            await store.fork("s", "f", at=at)
            session = "f"
    assert [m.get("type") for m in await store.get_messages(session)] == [None, "reasoning"]
    assert (await store.view(session, token_budget=5_000)).messages == [_user()]
    await store.append(session, _answer())
    await _views(store, session, (5_000, 200, 60))


# -- random histories, budgets and moves -------------------------------------------------


@st.composite
def steps(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    """What an agent does to a session: batches of items, pops, rewinds, forks, summaries.

    Reasoning items come before calls, answers and user turns, and at the end of
    batches; outputs answer a call made before (some never come, some come late).
    """
    calls: list[str] = []
    out: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(1, 10))):
        move = draw(st.sampled_from(["append"] * 5 + ["pop", "rewind", "fork", "summarize"]))
        if move != "append":
            out.append((move, draw(st.floats(0, 1))))
            continue
        batch: list[dict[str, Any]] = []
        for kind in draw(
            st.lists(
                st.sampled_from(["user", "reasoning", "call", "output", "answer"]),
                min_size=1,
                max_size=5,
            )
        ):
            if kind == "user":
                batch.append(_user("word " * draw(st.integers(1, 40))))
            elif kind == "reasoning":
                batch.append(_reasoning())
            elif kind == "call":
                calls.append(f"c{next(_ids)}")
                batch.append(_call(calls[-1]))
            elif kind == "output" and calls:
                batch.append(
                    _output(draw(st.sampled_from(calls)), "out " * draw(st.integers(1, 30)))
                )
            else:
                batch.append(_answer("text " * draw(st.integers(1, 30))))
        out.append(("append", batch))
    return out


SMALL = {
    "summary_trigger_tokens": 60,
    "summary_keep_tokens": 30,
    "offload_threshold_tokens": 40,
    "offload_preview_tokens": 10,
}
"""Summaries after a few messages that keep little raw, and previews of short outputs."""


@pytest.fixture
async def small(settings: Settings, tenant: str) -> AsyncIterator[ContextStore]:
    """A store of SMALL settings (its pod keeps warm views)."""
    async with ContextStore.from_settings(settings.model_copy(update=SMALL), tenant=tenant) as s:
        yield s


@pytest.fixture
async def cold(settings: Settings, tenant: str) -> AsyncIterator[ContextStore]:
    """Another pod of SMALL settings that keeps no view: each one is planned afresh."""
    own = settings.model_copy(update={**SMALL, "view_cache_bytes": 0})
    async with ContextStore.from_settings(own, tenant=tenant) as store:
        yield store


@hypothesis.settings(
    max_examples=examples(150),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    moves=steps(),
    budgets=st.tuples(st.integers(1, 120), st.integers(120, 600), st.integers(600, 4_000)),
)
async def test_no_view_sends_a_reasoning_item_without_the_item_after_it(
    small: ContextStore,
    cold: ContextStore,
    moves: list[tuple[Any, ...]],
    budgets: tuple[int, ...],
) -> None:
    """Random Responses histories, budgets, pops, rewinds, forks: reasoning goes with its item."""
    store = small
    session = uuid.uuid4().hex[:10]
    sessions = [session]
    for move, arg in moves:
        hypothesis.event(move)
        history = [m async for m in store.iter_history(session)]
        if move == "append":
            await store.append_many(session, arg)
        elif move == "pop" and history:
            await store.pop(session)
        elif move == "rewind" and history:
            await store.rewind(session, history[int(arg * (len(history) - 1))].entry_id)
        elif move == "fork" and history:
            fork = uuid.uuid4().hex[:10]
            await store.fork(session, fork, at=history[int(arg * (len(history) - 1))].entry_id)
            session = fork
            sessions.append(fork)
        elif move == "summarize":
            await store.summarize(session, LocalSummarizer())
        await _views(store, session, budgets, cold)  # after each move: warm views grow, or not
    for each in sessions:
        await store.delete(each)
