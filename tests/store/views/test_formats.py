"""OpenAI Responses items beside chat and Anthropic messages: stored, checked, paired, budgeted.

The OpenAI Agents SDK stores Responses items (role-less dicts with a
``type``): a parallel tool call is one ``function_call`` item per call, its
outputs are ``function_call_output`` items, and a reasoning item must be sent
with the item after it. Every view of a history in any of the three formats,
or a mix, sends no orphan, keeps each result after its call, and fits the
budget.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import hypothesis
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from support.config import examples
from support.helpers import paired

from ctxstore import ContextStore, Settings
from ctxstore.errors import InvalidMessageError
from ctxstore.summarizers import LocalSummarizer
from ctxstore.testing import orphans
from ctxstore.tokens import count_message


def _call(cid: str, city: str = "paris") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{cid}",
        "call_id": cid,
        "name": "weather",
        "arguments": f'{{"city": "{city}"}}',
    }


def _output(cid: str, text: str = "sunny") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": cid, "output": text}


def _reasoning(rid: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": rid,
        "summary": [{"type": "summary_text", "text": "look both cities up"}],
        "encrypted_content": "gAAAA" + "x" * 400,
    }


def _answer(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "id": f"msg_{uuid.uuid4().hex[:6]}",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


EVERY_KIND = [
    {"role": "user", "content": "weather in paris and rome?"},
    {"role": "user", "content": [{"type": "input_text", "text": "and a picture"}]},
    _reasoning("rs_1"),
    _call("c1"),
    _call("c2", "rome"),
    _output("c1"),
    _output("c2", "rain"),
    {"type": "custom_tool_call", "call_id": "c3", "name": "grep", "input": "TODO"},
    {"type": "custom_tool_call_output", "call_id": "c3", "output": "3 matches"},
    {
        "type": "local_shell_call",
        "id": "ls_1",
        "call_id": "c4",
        "status": "completed",
        "action": {"type": "exec", "command": ["ls"], "env": {}},
    },
    {"type": "local_shell_call_output", "id": "c4", "output": "README.md"},
    {"type": "mcp_approval_request", "id": "apr_1", "name": "deploy", "arguments": "{}"},
    {"type": "mcp_approval_response", "approval_request_id": "apr_1", "approve": True},
    {"type": "web_search_call", "id": "ws_1", "status": "completed"},
    _answer("paris is sunny, rome rainy"),
]


async def test_every_item_kind_round_trips_exactly(store: ContextStore) -> None:
    """Each Responses item kind is stored and read back as appended, in order."""
    await store.append_many("s", EVERY_KIND)
    assert await store.get_messages("s") == EVERY_KIND
    assert [m.message for m in await store.tail("s", 3)] == EVERY_KIND[-3:]


@pytest.mark.parametrize(
    ("item", "says"),
    [
        ({"content": "no role, no type"}, "needs a role, or (an OpenAI Responses item) a type"),
        ({"type": "message", "content": "hi"}, "a message item needs a role"),
        ({"type": "function_call", "name": "f", "arguments": "{}"}, "needs a call_id"),
        ({"type": "function_call", "call_id": "c", "arguments": "{}"}, "needs a name"),
        ({"type": "function_call", "call_id": "c", "name": "f"}, "needs its arguments"),
        ({"type": "function_call", "call_id": "c\n", "name": "f", "arguments": "{}"}, "control"),
        ({"type": "function_call_output", "output": "x"}, "needs a call_id"),
        ({"type": "function_call_output", "call_id": "c"}, "needs an output"),
        ({"type": "mcp_approval_response", "approval_request_id": "a"}, "needs approve"),
        ({"type": "reasoning", "summary": "not a list"}, "summary is a list"),
    ],
)
async def test_a_malformed_item_is_refused_and_its_batch_written_nowhere(
    store: ContextStore, item: dict[str, Any], says: str
) -> None:
    """A bad item in a batch: InvalidMessageError naming its index and fault, nothing stored."""
    with pytest.raises(InvalidMessageError, match=re.escape(says)) as caught:
        await store.append_many("s", [{"role": "user", "content": "fine"}, item])
    assert caught.value.index == 1
    assert await store.get_messages("s") == []


async def test_parallel_calls_keep_their_stored_order(store: ContextStore) -> None:
    """[call 1, call 2, output 1, output 2] is sent as stored: no move, no repair."""
    items = [
        {"role": "user", "content": "go"},
        _call("c1"),
        _call("c2"),
        _output("c1"),
        _output("c2"),
    ]
    await store.append_many("s", items)
    view = await store.view("s", token_budget=5_000)
    assert view.messages == items and view.stats.repairs == []
    assert paired(view.messages) == 2


async def test_outputs_stored_before_their_calls_are_moved_after_them(store: ContextStore) -> None:
    """Two pods raced: the outputs came first. The view sends each after its call, and says so."""
    await store.append_many("s", [{"role": "user", "content": "go"}, _output("c1"), _output("c2")])
    await store.append_many("s", [_call("c1"), _call("c2")])
    view = await store.view("s", token_budget=5_000)
    assert paired(view.messages) == 2 and orphans(view.messages) == 0
    assert any(r.startswith("moved result") for r in view.stats.repairs)


async def test_unanswered_calls_and_orphan_outputs_are_not_sent(store: ContextStore) -> None:
    """A call with no output, an output with no call: neither is sent; both are reported."""
    await store.append_many(
        "s", [{"role": "user", "content": "go"}, _call("c1"), _output("nobody"), _answer("done")]
    )
    view = await store.view("s", token_budget=5_000)
    assert orphans(view.messages) == 0
    assert view.messages == [{"role": "user", "content": "go"}, view.messages[-1]]
    assert sorted(view.stats.repairs) == [
        "dropped orphan result nobody",
        "dropped unanswered call c1",
    ]


async def test_a_reasoning_item_is_never_sent_without_the_item_after_it(
    store: ContextStore,
) -> None:
    """At every budget, the reasoning item and its call are sent both or neither."""
    turn = [
        {"role": "user", "content": "weather?"},
        _reasoning("rs_1"),
        _call("c1"),
        _output("c1"),
        _answer("sunny"),
    ]
    await store.append_many("s", turn)
    seen = set()
    for budget in range(1, 400, 3):
        view = await store.view("s", token_budget=budget)
        types = [m.get("type") or m.get("role") for m in view.messages]
        assert ("reasoning" in types) == ("function_call" in types), (budget, types)
        if "reasoning" in types:
            assert types[types.index("reasoning") + 1] == "function_call"
        paired(view.messages)
        seen.add(tuple(types))
    assert len(seen) >= 3  # the sweep saw the turn whole, cut, and answer-only


async def test_reasoning_is_counted_by_its_text_not_its_encrypted_blob(
    store: ContextStore,
) -> None:
    """The opaque encrypted_content is not text a model reads: it does not swell the count."""
    small = _reasoning("rs_1")
    large = {**small, "encrypted_content": "gAAAA" + "y" * 40_000}
    assert count_message(store.counter, large) == count_message(store.counter, small)
    assert count_message(store.counter, _call("c1")) < 40


# -- views of random histories, per format ---------------------------------------------------


def _chat(index: int, ids: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    calls = [
        {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids
    ]
    results = [{"role": "tool", "tool_call_id": i, "content": f"out {index} " * 5} for i in ids]
    return {"role": "assistant", "content": None, "tool_calls": calls}, results


def _anthropic(index: int, ids: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    uses = [{"type": "tool_use", "id": i, "name": "f", "input": {}} for i in ids]
    results = [
        {"type": "tool_result", "tool_use_id": i, "content": f"out {index} " * 5} for i in ids
    ]
    return {"role": "assistant", "content": uses}, [{"role": "user", "content": results}]


def _responses(index: int, ids: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    calls = [_call(i) for i in ids]
    return calls, [_output(i, f"out {index} " * 5) for i in ids]


FORMATS = ("chat", "anthropic", "responses")


@st.composite
def format_histories(draw: st.DrawFn, formats: tuple[str, ...]) -> list[list[dict[str, Any]]]:
    """Batches as agents append them: a user turn, tool exchanges, an answer, in the formats given.

    Results come right after their calls, one batch later, or (two pods
    racing) one batch before them; some calls are never answered.
    """
    batches: list[list[dict[str, Any]]] = []
    for turn in range(draw(st.integers(1, 8))):
        batches.append(
            [{"role": "user", "content": f"turn {turn} " + "word " * draw(st.integers(0, 30))}]
        )
        for step in range(draw(st.integers(0, 3))):
            ids = [f"t{turn}s{step}c{j}" for j in range(draw(st.integers(1, 3)))]
            kind = draw(st.sampled_from(formats))
            if kind == "chat":
                calling, results = _chat(turn, ids)
                calls = [calling]
            elif kind == "anthropic":
                calling, results = _anthropic(turn, ids)
                calls = [calling]
            else:
                calls, results = _responses(turn, ids)
                if draw(st.booleans()):
                    calls = [_reasoning(f"rs_{turn}_{step}"), *calls]
            shape = draw(st.sampled_from(["together", "split", "raced", "unanswered"]))
            if shape == "together":
                batches.append(calls + results)
            elif shape == "split":
                batches.extend([calls, results])
            elif shape == "raced":
                batches.extend([results, calls])
            else:
                batches.append(calls)
        batches.append(
            [_answer(f"answer {turn}")]
            if "responses" in formats
            else [{"role": "assistant", "content": f"answer {turn}"}]
        )
    return batches


FUZZ = hypothesis.settings(
    max_examples=examples(200),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
async def small_store(settings: Settings, tenant: str) -> AsyncIterator[ContextStore]:
    """A store with small offload and summary thresholds."""
    own = settings.model_copy(
        update={
            "offload_threshold_tokens": 30,
            "offload_preview_tokens": 10,
            "summary_trigger_tokens": 60,
            "summary_keep_tokens": 30,
        }
    )
    async with ContextStore.from_settings(own, tenant=tenant) as store:
        yield store


async def _check_views(
    store: ContextStore, batches: list[list[dict[str, Any]]], budget: int
) -> None:
    session = uuid.uuid4().hex[:10]
    for index, batch in enumerate(batches):
        await store.append_many(session, batch)
        if index == len(batches) // 2:
            await store.summarize(session, LocalSummarizer())
    view = await store.view(session, token_budget=budget)
    assert orphans(view.messages) == 0, view.messages
    paired(view.messages)
    assert view.stats.over_budget or view.stats.tokens <= view.stats.budget_cl100k
    assert view.stats.tokens == sum(count_message(store.counter, m) for m in view.messages)
    await store.delete(session)


@FUZZ
@given(
    formats=st.sampled_from([("chat",), ("anthropic",), ("responses",), FORMATS]).flatmap(
        lambda f: st.tuples(st.just(f), format_histories(f))
    ),
    budget=st.integers(1, 3_000),
)
async def test_views_of_random_histories_in_each_format_are_paired_and_fit(
    small_store: ContextStore,
    formats: tuple[tuple[str, ...], list[list[dict[str, Any]]]],
    budget: int,
) -> None:
    """Random histories in chat, Anthropic, Responses and mixed form, tiny to whole budgets."""
    kinds, batches = formats
    hypothesis.event("+".join(kinds))
    await _check_views(small_store, batches, budget)
