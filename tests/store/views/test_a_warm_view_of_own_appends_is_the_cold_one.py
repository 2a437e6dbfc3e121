"""A pod's view of what it appended itself (``WarmViews.add_own``) is the cold pod's.

Whatever a pod appends, and whatever else happens between its appends and its
views, its view is the cold pod's, and its warm views' byte count is the sum of
what it holds (and back to 0 once it holds nothing).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from hypothesis import HealthCheck, given
from hypothesis import settings as settings_
from hypothesis import strategies as st
from support.config import examples
from support.helpers import SYSTEM, assistant, dumped, oa_call, oa_result, system, turn, user
from support.pods import warm_and_cold_pods

from ctxstore import ContextStore, Keyring, Settings
from ctxstore._plan.warm import OWN_MOST, held_size
from ctxstore.testing import orphans


def accounted(pod: ContextStore) -> None:
    """The pod's warm views' byte count is what they hold, never negative."""
    warm = pod._viewer.warm
    items = sum(w.size for w in warm._items.values())
    own = sum(held_size(o.entries) for o in warm._own.values() if o.entries)
    assert warm.bytes >= 0, warm.bytes
    assert warm.bytes == items + own, (warm.bytes, items, own)
    # Every noted entry belongs to a session of which a copy is kept.
    assert set(warm._own) <= set(warm._sizes), (set(warm._own), set(warm._sizes))


async def check(pod: ContextStore, cold: ContextStore, session: str, budget: int) -> None:
    view = await pod.view(session, token_budget=budget)
    again = await cold.view(session, token_budget=budget)
    assert dumped(view) == dumped(again)
    assert view.stats.tokens == again.stats.tokens <= budget
    assert orphans(view.messages) == orphans(again.messages)
    accounted(pod)


def big(n: int) -> str:
    return " ".join(f"w{n}x{i}" for i in range(900))  # past the offload threshold


async def test_agent_loop_with_large_results_previews_and_two_budgets(
    settings: Settings, tenant: str
) -> None:
    async with warm_and_cold_pods(settings, tenant) as (a, _, c):
        await a.append("s", SYSTEM)
        await a.append_many("s", [turn(i) for i in range(30)])
        for budget in (600, 2_000, 8_000):
            await check(a, c, "s", budget)
        for i in range(40):
            await a.append_many("s", [user(f"q{i}"), oa_call(f"c{i}")])
            await a.append("s", oa_result(f"c{i}", big(i) if i % 3 == 0 else "small"))
            await a.append("s", assistant(f"a{i}"))
            await check(a, c, "s", (600, 2_000, 8_000)[i % 3])
            if i % 4 == 0:
                await check(a, c, "s", 2_000)
        for budget in (600, 2_000, 8_000):
            await check(a, c, "s", budget)
        await a.delete("s")
        accounted(a)
        assert a._viewer.warm.bytes == 0


async def test_mixed_batches_system_pinned_plain(settings: Settings, tenant: str) -> None:
    async with warm_and_cold_pods(settings, tenant) as (a, b, c):
        await a.append_many("s", [SYSTEM, *(turn(i) for i in range(10))])
        await check(a, c, "s", 1_000)
        for i in range(12):
            batch: list[dict[str, Any]] = [user(f"p{i}")]
            if i % 3 == 0:
                batch.append(system(f"rule {i}"))
            batch.append(assistant(f"after {i}"))
            await a.append_many("s", batch)
            if i % 4 == 1:
                await a.append("s", user(f"pinned {i}"), pinned=True)
            await a.append("s", user(f"plain {i}"))
            await check(a, c, "s", 1_000)
            if i % 5 == 2:
                await b.append("s", user(f"b {i}"))
                await check(a, c, "s", 1_000)


async def test_explicit_idempotency_keys_retried(settings: Settings, tenant: str) -> None:
    async with warm_and_cold_pods(settings, tenant) as (a, b, c):
        await a.append_many("s", [SYSTEM, *(turn(i) for i in range(10))])
        await check(a, c, "s", 1_000)
        for i in range(10):
            keys = [f"k{i}a", f"k{i}b"]
            await a.append_many("s", [user(f"x{i}"), assistant(f"y{i}")], idempotency_keys=keys)
            # Retried: duplicates, on the same pod and on the other.
            await a.append_many("s", [user(f"x{i}"), assistant(f"y{i}")], idempotency_keys=keys)
            await b.append("s", user(f"x{i}"), idempotency_key=keys[0])
            # A retry of half of it with a new one: the new one is noted, the old not.
            await a.append_many(
                "s", [assistant(f"y{i}"), user(f"z{i}")], idempotency_keys=[keys[1], f"k{i}c"]
            )
            await check(a, c, "s", 1_000)
            if i % 3 == 0:
                # b appends first, then a retries a's own keys (duplicates) and a new one.
                await b.append("s", user(f"b{i}"))
                await a.append_many(
                    "s", [user(f"x{i}"), user(f"n{i}")], idempotency_keys=[keys[0], f"k{i}d"]
                )
                await check(a, c, "s", 1_000)


async def test_concurrent_appends_and_views_on_one_pod(settings: Settings, tenant: str) -> None:
    async with warm_and_cold_pods(settings, tenant) as (a, b, c):
        await a.append_many("s", [SYSTEM, *(turn(i) for i in range(20))])
        await check(a, c, "s", 1_500)
        for i in range(25):
            views = await asyncio.gather(
                a.append("s", user(f"t1 {i}")),
                a.append_many("s", [oa_call(f"c{i}"), oa_result(f"c{i}", "r " * (i * 7))]),
                b.append("s", user(f"b {i}")) if i % 2 else a.append("s", assistant(f"t3 {i}")),
                a.view("s", token_budget=1_500),
                a.append("s", user(f"t4 {i}")),
            )
            accounted(a)
            assert orphans(views[3].messages) == 0
            await check(a, c, "s", 1_500)
            both = await asyncio.gather(
                a.view("s", token_budget=1_500), a.view("s", token_budget=700)
            )
            assert dumped(both[0]) == dumped(await c.view("s", token_budget=1_500))
            assert dumped(both[1]) == dumped(await c.view("s", token_budget=700))
            accounted(a)


async def test_three_pods_interleaving_concurrently(settings: Settings, tenant: str) -> None:
    cold = settings.model_copy(update={"view_cache_bytes": 0})
    async with (
        ContextStore.from_settings(settings, tenant=tenant) as a,
        ContextStore.from_settings(settings, tenant=tenant) as b,
        ContextStore.from_settings(settings, tenant=tenant) as d,
        ContextStore.from_settings(cold, tenant=tenant) as c,
    ):
        await a.append_many("s", [SYSTEM, *(turn(i) for i in range(20))])
        for pod in (a, b, d):
            await check(pod, c, "s", 1_200)
        for i in range(30):
            await asyncio.gather(
                *(
                    pod.append_many("s", [user(f"{n}{i}"), assistant(f"{n}{i}")][: 1 + (i + n) % 2])
                    for n, pod in enumerate((a, b, d))
                )
            )
            for pod in (a, b, d):
                await check(pod, c, "s", 1_200)


async def test_more_than_own_most_between_views(settings: Settings, tenant: str) -> None:
    async with warm_and_cold_pods(settings, tenant) as (a, b, c):
        await a.append_many("s", [SYSTEM, *(turn(i) for i in range(5))])
        await check(a, c, "s", 2_000)
        await check(a, c, "s", 500)
        for round_ in range(3):
            for i in range(OWN_MOST - 3 + round_ * 3):
                await a.append("s", user(f"r{round_} m{i}"))
                if i == 100 and round_ == 1:
                    await b.append("s", user("b in the middle"))
            accounted(a)
            await check(a, c, "s", 2_000)
            await a.append("s", user(f"after {round_}"))
            await check(a, c, "s", 500)
            await check(a, c, "s", 2_000)
        await a.forget_tenant()
        accounted(a)
        assert a._viewer.warm.bytes == 0


async def test_pop_rewind_replace_between_own_append_and_view(
    settings: Settings, tenant: str
) -> None:
    async with warm_and_cold_pods(settings, tenant) as (a, b, c):
        await a.append_many("s", [SYSTEM, *(turn(i) for i in range(12))])
        await check(a, c, "s", 900)
        # Own append, popped by the other pod, then own appends again.
        await a.append("s", user("popped"))
        await b.pop("s")
        await check(a, c, "s", 900)
        await a.append("s", user("one"))
        await b.append("s", user("b two"))
        await check(a, c, "s", 900)
        # Own append, popped by itself, then the other pod appends as many.
        await a.append("s", user("ghost"))
        await a.pop("s")
        await b.append("s", user("b instead"))
        await check(a, c, "s", 900)
        # Own appends noted; b appends before; pop of a's; a appends again.
        await b.append("s", user("b before"))
        await a.append("s", user("a1"))
        await a.append("s", user("a2"))
        await b.pop("s")
        await check(a, c, "s", 900)
        await a.append("s", user("a3"))
        await check(a, c, "s", 900)
        # A rewind back past a's own appends, then more appends from both.
        first = await a.append("s", user("to rewind to"))
        await a.append_many("s", [user("lost 1"), assistant("lost 2")])
        await b.rewind("s", first.entry_id)
        await a.append("s", user("after rewind"))
        await check(a, c, "s", 900)
        # Replace and clear by the other pod after a's appends.
        await a.append("s", user("before replace"))
        await b.replace("s", [SYSTEM, user("fresh")])
        await a.append("s", user("after replace"))
        await check(a, c, "s", 900)
        await a.append("s", user("before clear"))
        await b.clear("s")
        await a.append("s", user("after clear"))
        await check(a, c, "s", 900)
        # Delete by the other pod and written again, by both.
        await a.append("s", user("before delete"))
        await b.delete("s")
        await a.append("s", user("a after delete"))
        await check(a, c, "s", 900)
        await a.append("s", user("a again"))
        await b.delete("s")
        await b.append("s", user("b after delete"))
        await a.append("s", user("a after b"))
        await check(a, c, "s", 900)
        # Checkpoint, appends, rewind to it, appends.
        point = await b.checkpoint("s")
        await a.append_many("s", [user("c1"), assistant("c2")])
        await check(a, c, "s", 900)
        await a.append("s", user("c3"))
        await b.rewind("s", point)
        await a.append("s", user("c4"))
        await check(a, c, "s", 900)
        # A fork by the other pod between a's append and view.
        await a.append("s", user("before fork"))
        await b.fork("s", "s2")
        await a.append("s", user("after fork"))
        await check(a, c, "s", 900)
        await check(a, c, "s2", 900)
        await a.append("s2", user("in the fork"))
        await check(a, c, "s2", 900)
        await a.delete("s")
        await a.delete("s2")
        accounted(a)
        assert a._viewer.warm.bytes == 0


async def test_encrypted_own_appends(settings: Settings, tenant: str) -> None:
    ring = Keyring({"k1": Keyring.generate_key()}, "k1")
    cold = settings.model_copy(update={"view_cache_bytes": 0})
    async with (
        ContextStore.from_settings(settings, tenant=tenant, keyring=ring) as a,
        ContextStore.from_settings(settings, tenant=tenant, keyring=ring) as b,
        ContextStore.from_settings(cold, tenant=tenant, keyring=ring) as c,
    ):
        await a.append_many("s", [SYSTEM, *(turn(i) for i in range(10))])
        await check(a, c, "s", 1_500)
        for i in range(15):
            await a.append_many("s", [oa_call(f"c{i}"), oa_result(f"c{i}", big(i))])
            await a.append("s", assistant(f"done {i}"))
            if i % 4 == 0:
                await b.append("s", user(f"b {i}"))
            await check(a, c, "s", 1_500)


async def test_ttl_session_own_appends(settings: Settings, tenant: str) -> None:
    async with warm_and_cold_pods(settings, tenant) as (a, _, c):
        await a.append_many("s", [SYSTEM, *(turn(i) for i in range(10))])
        await a.set_ttl("s", 3_600)
        await check(a, c, "s", 1_000)
        for i in range(10):
            await a.append("s", user(f"ttl {i}"))
            await check(a, c, "s", 1_000)


async def test_tiny_cache_budget_evicts_while_noting(settings: Settings, tenant: str) -> None:
    small = settings.model_copy(update={"view_cache_bytes": 60_000})
    async with warm_and_cold_pods(small, tenant) as (a, _, c):
        for s in ("s1", "s2", "s3"):
            await a.append_many(s, [SYSTEM, *(turn(i) for i in range(15))])
            await check(a, c, s, 800)
        for i in range(30):
            s = ("s1", "s2", "s3")[i % 3]
            await a.append_many(s, [user(f"m{i} " + "x " * (i * 20)), assistant("k")])
            accounted(a)
            await check(a, c, s, (800, 300)[i % 2])
        for s in ("s1", "s2", "s3"):
            await a.delete(s)
        accounted(a)
        assert a._viewer.warm.bytes == 0


OPS = [
    "a-append",
    "a-exchange",
    "a-big",
    "a-mixed",
    "a-pinned",
    "a-retry",
    "b-append",
    "a-pop",
    "b-pop",
    "b-rewind",
    "b-replace",
    "b-delete",
    "a-delete",
    "gather",
    "view",
]


@settings_(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(OPS), st.integers(0, 10_000), st.sampled_from([300, 900, 3_000])),
        max_size=30,
    ),
)
async def test_random_own_appends_always_cold_view(
    settings: Settings, tenant: str, steps: list[tuple[str, int, int]]
) -> None:
    session = f"r{uuid.uuid4().hex[:8]}"
    async with warm_and_cold_pods(settings, tenant) as (a, b, c):
        await a.append_many(session, [SYSTEM, *(turn(i) for i in range(8))])
        await check(a, c, session, 900)
        keys: list[str] = []
        for n, (op, pick, budget) in enumerate(steps):
            if op == "a-append":
                await a.append(session, user(f"u{n} " + "w " * (pick % 50)))
            elif op == "a-exchange":
                await a.append_many(
                    session, [oa_call(f"c{n}"), oa_result(f"c{n}", "o " * (pick % 200))]
                )
            elif op == "a-big":
                await a.append_many(session, [oa_call(f"c{n}"), oa_result(f"c{n}", big(n))])
            elif op == "a-mixed":
                await a.append_many(session, [user(f"m{n}"), system(f"s{n}"), assistant("k")])
            elif op == "a-pinned":
                await a.append(session, user(f"p{n}"), pinned=True)
            elif op == "a-retry":
                key = keys[pick % len(keys)] if keys and pick % 2 else f"key{n}"
                keys.append(key)
                await a.append(session, user(f"k{key}"), idempotency_key=key)
            elif op == "b-append":
                await b.append(session, user(f"b{n}"))
            elif op == "a-pop":
                await a.pop(session)
            elif op == "b-pop":
                await b.pop(session)
            elif op == "b-rewind":
                entries = (await b.read(session)).messages
                if entries:
                    await b.rewind(session, entries[pick % len(entries)].entry_id)
            elif op == "b-replace":
                await b.replace(session, [SYSTEM, *(turn(n * 10 + i) for i in range(pick % 5))])
            elif op == "b-delete":
                await b.delete(session)
            elif op == "a-delete":
                await a.delete(session)
                accounted(a)
            elif op == "gather":
                await asyncio.gather(
                    a.append(session, user(f"g1 {n}")),
                    a.view(session, token_budget=budget),
                    a.append(session, user(f"g2 {n}")),
                    b.append(session, user(f"g3 {n}")) if pick % 2 else a.pop(session),
                )
            await check(a, c, session, budget)
            accounted(a)
        await a.delete(session)
        accounted(a)
        assert a._viewer.warm.bytes == 0


async def test_the_own_path_is_taken_and_a_ghost_never_counts(
    settings: Settings, tenant: str
) -> None:
    """The attacks above go down the own path; a popped own append is never sent."""
    async with warm_and_cold_pods(settings, tenant) as (a, b, c):
        await a.append_many("s", [SYSTEM, *(turn(i) for i in range(30))])
        await check(a, c, "s", 2_000)
        reads = []
        for i in range(10):
            await a.append("s", user(f"own {i}"))
            view = await a.view("s", token_budget=2_000)
            assert dumped(view) == dumped(await c.view("s", token_budget=2_000))
            reads.append(view.stats.entries_read)
        assert reads.count(0) >= 5, reads
        # An own append popped by b, then b appends two and pops one: the count is as if
        # the ghost were there; the view must not send it.
        await b.append("s", user("b0"))
        await check(a, c, "s", 2_000)
        await a.append("s", user("ghost"))
        await b.pop("s")
        await check(a, c, "s", 2_000)  # cold: epoch moved; the ghost may stay noted
        await b.append("s", user("b1"))
        view = await a.view("s", token_budget=2_000)
        assert "ghost" not in str(view.messages)
        assert dumped(view) == dumped(await c.view("s", token_budget=2_000))
        accounted(a)
