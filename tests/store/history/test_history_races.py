"""Checkpoints, rewinds, forks, pops and summaries racing appends, drawn by hypothesis.

Pods (stores of their own) run generated schedules at once on one session
and its forks, on one Redis and on a cluster. Whatever the schedule, nothing
acknowledged is lost or doubled (each append is in the history or in exactly
one branch, under the id it was given), no session mixes histories (every
message it holds is one the pods appended, or the start, in id order), and
every session's counters and views agree with what it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as settings_
from hypothesis import strategies as st
from support.config import BACKENDS, examples
from support.helpers import turn

from ctxstore import (
    ContextStore,
    EntryNotFoundError,
    LeaseHeldError,
    LocalSummarizer,
    Settings,
)
from ctxstore._layout.formats import entry_order
from ctxstore.testing import orphans

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)

OPS = ["append", "append", "append", "checkpoint", "rewind", "fork", "pop", "summarize", "view"]
START = 12


async def run_pod(
    store: ContextStore,
    number: int,
    session: str,
    ops: list[tuple[str, int]],
    acked: dict[str, str],
    forks: list[str],
    popped: set[str],
) -> None:
    """One pod's schedule: every append it was acknowledged is recorded."""
    for step, (op, pick) in enumerate(ops):
        tag = f"p{number}-{step}"
        if op == "append":
            acked[tag] = (await store.append(session, {"role": "user", "content": tag})).entry_id
        elif op == "checkpoint":
            await store.checkpoint(session)
        elif op == "rewind":
            tail = await store.tail(session, 1 + pick % 6)
            if tail:
                with contextlib.suppress(EntryNotFoundError, LeaseHeldError):
                    await store.rewind(session, tail[0].entry_id)
        elif op == "fork":
            name = f"{session}-{tag}"
            await store.fork(session, name)
            forks.append(name)
        elif op == "pop":
            taken = await store.pop(session)
            if taken is not None:
                popped.add(str(taken.message["content"]))
        elif op == "summarize":
            with contextlib.suppress(LeaseHeldError):
                await store.summarize(session, LocalSummarizer())
        elif op == "view":
            assert orphans((await store.view(session, token_budget=400)).messages) == 0


async def check_session(store: ContextStore, session: str, known: set[Any]) -> list[Any]:
    """A session's history: ids in order, only known messages, counters that agree."""
    history = [m async for m in store.iter_history(session)]
    ids = [entry_order(m.entry_id) for m in history]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for m in history:
        assert m.message["content"] in known, m
    info = await store.info(session)
    assert (info.count, info.tokens) == (len(history), sum(m.tokens for m in history))
    assert orphans((await store.view(session, token_budget=500)).messages) == 0
    return history


@settings_(
    max_examples=examples(8),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    schedules=st.lists(
        st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 1_000)), min_size=1, max_size=12),
        min_size=2,
        max_size=4,
    )
)
async def test_generated_schedules_lose_nothing_and_mix_nothing(
    summary_settings: Settings, tenant: str, schedules: list[list[tuple[str, int]]]
) -> None:
    """Any schedule of pods at once: acks kept once, histories never mixed, counters true."""
    settings = summary_settings.model_copy(update={"bridge_entries": 6, "bridge_tokens": 400})
    session = f"r{uuid.uuid4().hex[:8]}"
    pods = [ContextStore.from_settings(settings, tenant=tenant) for _ in schedules]
    try:
        start = [turn(i) for i in range(START)]
        await pods[0].append_many(session, start)
        acked: dict[str, str] = {}
        forks: list[str] = []
        popped: set[str] = set()
        # A task group: when one pod fails, the others stop before their stores close.
        async with asyncio.TaskGroup() as group:
            for number, (pod, ops) in enumerate(zip(pods, schedules, strict=True)):
                group.create_task(run_pod(pod, number, session, ops, acked, forks, popped))
        store = pods[0]
        known = {m["content"] for m in start} | set(acked)
        history = await check_session(store, session, known)
        places: dict[str, list[str]] = {}
        for m in history:
            places.setdefault(m.message["content"], []).append(m.entry_id)
        for branch in await store.branches(session):
            page = await store.read_branch(session, branch.branch_id, limit=10_000)
            for m in page.messages:
                places.setdefault(m.message["content"], []).append(m.entry_id)
        for tag, entry in acked.items():
            if tag in popped:
                assert places.get(tag, []) in ([], [entry])  # taken off, or branched first
            else:
                assert places.get(tag) == [entry], (tag, places.get(tag))
        for fork in forks:
            for m in await check_session(store, fork, known):
                content = m.message["content"]
                if content in acked:
                    assert m.entry_id == acked[content]  # the very entry, never a copy of another
    finally:
        for pod in pods:
            await pod.aclose()
