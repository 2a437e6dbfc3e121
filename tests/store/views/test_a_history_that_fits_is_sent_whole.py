"""A history that fits the budget in full is sent whole, and a summary comes in when it adds.

Whole: every message as appended, tool results in full (no preview), in the
history's own order (Responses outputs of parallel calls in whatever order
they were appended), on a warm pod's views and a cold pod's, at any budget
that holds the history's tokens. The system message is appended first, so
the store's hoisting of system messages leaves the order as it is.
"""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import HealthCheck, given
from hypothesis import settings as settings_
from hypothesis import strategies as st
from support.config import examples
from support.helpers import SYSTEM, assistant, dumped, oa_call, oa_result, user
from support.pods import warm_and_cold_pods

from ctxstore import ContextStore, LocalSummarizer, Settings


def big(n: int, words: int) -> str:
    """A tool result past the offload threshold (a preview is stored beside it)."""
    return " ".join(f"w{n}x{i}" for i in range(words))


def fc(cid: str) -> dict[str, Any]:
    """A Responses function call item."""
    return {"type": "function_call", "call_id": cid, "name": "look", "arguments": "{}"}


def fo(cid: str, output: str) -> dict[str, Any]:
    """A Responses function call output item."""
    return {"type": "function_call_output", "call_id": cid, "output": output}


OPS = ("user", "assistant", "exchange", "big", "parallel")


def batch(op: str, n: int, pick: int) -> list[dict[str, Any]]:
    """The messages one step of a drawn history appends."""
    if op == "user":
        return [user(f"u{n} " + "w " * (pick % 40))]
    if op == "assistant":
        return [assistant(f"a{n} " + "k " * (pick % 40))]
    if op == "exchange":
        return [oa_call(f"c{n}"), oa_result(f"c{n}", "o " * (pick % 120))]
    if op == "big":
        return [oa_call(f"c{n}"), oa_result(f"c{n}", big(n, 300 + pick % 600))]
    ids = [f"p{n}-{i}" for i in range(2 + pick % 3)]
    outputs = [fo(cid, big(n, 300) if pick % 2 else f"out {cid}") for cid in ids]
    order = sorted(range(len(ids)), key=lambda i: (i * (pick + 1)) % len(ids) + i / 10)
    return [*(fc(cid) for cid in ids), *(outputs[i] for i in reversed(order))]


async def whole(
    pod: ContextStore, session: str, budget: int, history: list[dict[str, Any]]
) -> None:
    """``pod``'s view at ``budget`` is ``history`` itself, no result previewed."""
    view = await pod.view(session, token_budget=budget)
    assert view.messages == history, (budget, view.stats)
    assert not view.stats.offloaded and not view.stats.dropped


@settings_(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(OPS), st.integers(0, 10_000), st.booleans()),
        min_size=1,
        max_size=14,
    ),
    budget=st.integers(2_500, 12_000),
    slack=st.integers(0, 400),
)
async def test_a_history_that_fits_is_sent_whole_warm_and_cold(
    settings: Settings,
    tenant: str,
    steps: list[tuple[str, int, bool]],
    budget: int,
    slack: int,
) -> None:
    """Any history whose full tokens fit the budget is the view, warm and cold, in order."""
    session = f"w{uuid.uuid4().hex[:8]}"
    async with warm_and_cold_pods(settings, tenant) as (a, _, c):
        history: list[dict[str, Any]] = [SYSTEM]
        await a.append(session, SYSTEM)
        for n, (op, pick, one_by_one) in enumerate(steps):
            messages = batch(op, n, pick)
            if one_by_one:
                for message in messages:
                    await a.append(session, message)
            else:
                await a.append_many(session, messages)
            history += messages
            tokens = (await c.view(session, token_budget=1)).stats.history_tokens
            if tokens > budget:
                break
            await whole(a, session, budget, history)  # warm: the pod that appended
            await whole(c, session, budget, history)  # cold
        tokens = (await c.view(session, token_budget=1)).stats.history_tokens
        for exact in (tokens, tokens + slack):  # any budget that holds it, the least too
            await whole(a, session, exact, history)
            await whole(c, session, exact, history)
        await a.delete(session)


async def test_a_csv_that_fits_at_64k_is_sent_whole(settings: Settings, tenant: str) -> None:
    """A 14k-token CSV in a 47k-token history goes whole at 64k, its middle row included."""
    rows = [f"{i},acct-{i},Acme {i} GmbH,2026-0{1 + i % 9}-1{i % 10},{100 + i}" for i in range(700)]
    rows[350] = "350,acct-350,Initech AG,renewal 2027-03-14,999"
    csv = "id,account,customer,renewal,seats\n" + "\n".join(rows)
    history: list[dict[str, Any]] = [SYSTEM]
    for i in range(60):
        history += [user(f"q{i} " + "word " * 300), assistant(f"a{i} " + "reply " * 300)]
    history += [oa_call("csv"), oa_result("csv", csv), assistant("Read the contract list.")]
    async with warm_and_cold_pods(settings, tenant) as (a, _, c):
        await a.append_many("s", history)
        view = await c.view("s", token_budget=64_000)
        assert 40_000 < view.stats.history_tokens < 64_000
        for pod in (a, c):
            view = await pod.view("s", token_budget=64_000)
            assert view.messages == history
            assert "renewal 2027-03-14" in view.messages[-2]["content"]
        # Short of the budget, the CSV goes as its preview: the preview is what was at stake.
        short = await c.view("s", token_budget=12_000)
        assert short.stats.offloaded


async def test_a_summary_of_dropped_messages_is_used_at_the_next_view(
    summary_settings: Settings, tenant: str
) -> None:
    """A summary committed after a view that dropped messages is sent by the next view."""
    history = [SYSTEM, *(user(f"m{i} " + "word " * 60) for i in range(242))]
    async with ContextStore.from_settings(summary_settings, tenant=tenant) as store:
        await store.append_many("s", history)
        first = await store.view("s", token_budget=8_000)
        assert not first.stats.summary_used and first.stats.dropped > 100
        assert (await store.summarize("s", LocalSummarizer())).status == "committed"
        await store.append("s", user("one more"))
        after = await store.view("s", token_budget=8_000)
        assert after.stats.summary_used, after.stats
        assert after.stats.summary_covers is not None
        again = await store.view("s", token_budget=8_000)  # and it stays: the anchor moved once
        assert dumped(again) == dumped(after)
        await store.delete("s")
