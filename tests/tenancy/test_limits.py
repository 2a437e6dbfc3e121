"""Tenant quotas on real Redis: what each one refuses, and that a refusal writes nothing.

Limits come from the settings (the defaults) and from ``set_limits`` (a
tenant's own, over the defaults). A store caches the limits in force for
30 s, so these tests set a tenant's limits through one store (the
operator's) and then write through a store built afterwards, whose cache is
empty; ``set_limits`` also clears the cache of the store it is called on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis
from support.helpers import USER, key_states

from ctxstore import (
    AppendResult,
    ContextStore,
    InvalidInputError,
    MessageTooLargeError,
    QuotaExceededError,
    Settings,
    TenantLimits,
    TiktokenCounter,
    count_message,
)

_EMPTY_USER = len(b'{"role":"user","content":""}')

Snapshot = dict[str, tuple[Any, str]]
MakeStore = Callable[..., ContextStore]


def size(message: dict[str, Any]) -> int:
    """The bytes a message takes in a session: its compact JSON form."""
    return len(json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode())


def tokens(message: dict[str, Any]) -> int:
    """A message's tokens, counted as the store counts them."""
    return count_message(TiktokenCounter(), message)


def sized(n: int, fill: str = "x") -> dict[str, Any]:
    """A user message whose JSON form is exactly ``n`` bytes."""
    message = {"role": "user", "content": (fill * n)[: n - _EMPTY_USER]}
    assert size(message) == n
    return message


async def snapshot(raw: Redis, store: ContextStore, session: str) -> Snapshot:
    """Every key of the session: its value (:func:`key_states`) and whether it expires."""
    return await key_states(raw, store.keys(session).all())


async def meta_fields(raw: Redis, store: ContextStore, session: str) -> dict[bytes, bytes]:
    """The session's meta hash."""
    return await raw.hgetall(store.keys(session).meta)


def without(snap: Snapshot, key: str) -> Snapshot:
    """``snap`` without one key."""
    return {k: v for k, v in snap.items() if k != key}


@pytest.fixture
async def stores(settings: Settings, tenant: str) -> AsyncIterator[MakeStore]:
    """Builds stores for this test's tenant, each with its own connections and caches.

    Keyword arguments override the settings (the defaults a tenant's own limits sit over).
    """
    opened: list[ContextStore] = []

    def make(**overrides: Any) -> ContextStore:
        made = ContextStore.from_settings(settings.model_copy(update=overrides), tenant=tenant)
        opened.append(made)
        return made

    yield make
    for made in opened:
        await made.aclose()


async def limited(stores: MakeStore, limits: TenantLimits, **defaults: Any) -> ContextStore:
    """A fresh writer store for a tenant whose own limits an operator store has just set."""
    await stores(**defaults).set_limits(limits)
    return stores(**defaults)


# -- TenantLimits and set_limits -------------------------------------------------------

LIMIT_FIELDS = [
    "message_bytes",
    "session_bytes",
    "session_tokens",
    "sessions",
    "appends_per_second",
    "append_burst",
    "ttl_seconds",
]


@pytest.mark.parametrize("field", LIMIT_FIELDS)
@pytest.mark.parametrize("value", [0, -1, -0.5])
def test_tenant_limits_refuse_values_that_are_not_positive(field: str, value: float) -> None:
    """Every TenantLimits field refuses zero and negative values."""
    with pytest.raises(ValidationError):
        TenantLimits(**{field: value})


def test_tenant_limits_refuse_unknown_fields() -> None:
    """A misspelt limit is refused, not silently ignored."""
    with pytest.raises(ValidationError):
        TenantLimits(sesions=3)  # type: ignore[call-arg]


async def test_limits_are_empty_until_set(store: ContextStore) -> None:
    """A tenant with no limits of its own has every field None (the settings' defaults)."""
    assert await store.limits() == TenantLimits()


async def test_limits_returns_what_set_limits_stored(stores: MakeStore) -> None:
    """limits() answers exactly what set_limits stored, through the same store and a new one."""
    operator = stores()
    chosen = TenantLimits(
        message_bytes=4_096,
        session_bytes=50_000,
        session_tokens=9_000,
        sessions=7,
        appends_per_second=2.5,
        append_burst=11,
        ttl_seconds=3_600,
    )
    await operator.set_limits(chosen)
    assert await operator.limits() == chosen
    assert await stores().limits() == chosen
    await operator.set_limits(TenantLimits(sessions=3))
    assert await stores().limits() == TenantLimits(sessions=3)


async def test_set_limits_refuses_anything_but_tenant_limits(store: ContextStore) -> None:
    """set_limits takes a TenantLimits, not a dict that looks like one."""
    with pytest.raises(InvalidInputError):
        await store.set_limits({"sessions": 1})  # type: ignore[arg-type]
    assert await store.limits() == TenantLimits()


# -- the message cap -------------------------------------------------------------------


async def test_message_cap_per_tenant(stores: MakeStore, raw_redis: Redis) -> None:
    """A tenant's message_bytes refuses a message one byte over it, and writes nothing."""
    writer = await limited(stores, TenantLimits(message_bytes=200))
    await writer.append("s", sized(200))
    before = await snapshot(raw_redis, writer, "s")
    with pytest.raises(MessageTooLargeError) as caught:
        await writer.append("s", sized(201))
    assert isinstance(caught.value, QuotaExceededError)
    assert (caught.value.quota, caught.value.limit, caught.value.value) == (
        "message_bytes",
        200,
        201,
    )
    assert await snapshot(raw_redis, writer, "s") == before
    assert await writer.get_messages("s") == [sized(200)]


@pytest.mark.parametrize(
    ("own", "maximum", "cap"),
    [
        pytest.param(100_000, 500, 500, id="own-above-the-maximum"),
        pytest.param(300, 100_000, 300, id="own-below-the-maximum"),
    ],
)
async def test_message_cap_is_the_lower_of_the_tenants_and_the_settings_maximum(
    stores: MakeStore, raw_redis: Redis, own: int, maximum: int, cap: int
) -> None:
    """A tenant's message_bytes applies below settings.max_message_bytes, which caps it above."""
    writer = await limited(stores, TenantLimits(message_bytes=own), max_message_bytes=maximum)
    before = await snapshot(raw_redis, writer, "s")
    with pytest.raises(MessageTooLargeError) as caught:
        await writer.append("s", sized(cap + 1))
    assert (caught.value.quota, caught.value.limit, caught.value.value) == (
        "message_bytes",
        cap,
        cap + 1,
    )
    assert await snapshot(raw_redis, writer, "s") == before
    await writer.append("s", sized(cap))
    assert await writer.get_messages("s") == [sized(cap)]


async def test_message_cap_on_append_many_and_replace(stores: MakeStore, raw_redis: Redis) -> None:
    """One message over the cap refuses the whole batch or history, naming its index."""
    writer = await limited(stores, TenantLimits(message_bytes=200))
    await writer.append("s", USER)
    before = await snapshot(raw_redis, writer, "s")
    batch = [sized(100), sized(200), sized(201)]
    with pytest.raises(MessageTooLargeError) as caught:
        await writer.append_many("s", batch)
    assert (caught.value.quota, caught.value.index) == ("message_bytes", 2)
    with pytest.raises(MessageTooLargeError) as caught:
        await writer.replace("s", batch)
    assert (caught.value.quota, caught.value.index) == ("message_bytes", 2)
    assert await snapshot(raw_redis, writer, "s") == before


# -- session bytes and tokens ----------------------------------------------------------


async def test_session_bytes_on_append(stores: MakeStore, raw_redis: Redis) -> None:
    """Appends fill a session up to session_bytes exactly; one byte more is refused."""
    writer = await limited(stores, TenantLimits(session_bytes=300))
    await writer.append("s", sized(100))
    await writer.append("s", sized(150))
    before = await snapshot(raw_redis, writer, "s")
    with pytest.raises(QuotaExceededError) as caught:
        await writer.append("s", sized(51))
    assert (caught.value.quota, caught.value.limit, caught.value.value) == (
        "session_bytes",
        300,
        301,
    )
    assert await snapshot(raw_redis, writer, "s") == before
    await writer.append("s", sized(50))
    assert await writer.get_messages("s") == [sized(100), sized(150), sized(50)]


async def test_session_tokens_on_append(stores: MakeStore, raw_redis: Redis) -> None:
    """Appends fill a session up to session_tokens exactly; one token more is refused."""
    first = {"role": "user", "content": "the quick brown fox jumps over the lazy dog"}
    cap = tokens(first) + tokens(USER)
    writer = await limited(stores, TenantLimits(session_tokens=cap))
    await writer.append("s", first)
    before = await snapshot(raw_redis, writer, "s")
    bigger = {"role": "user", "content": "hello there"}
    assert tokens(bigger) == tokens(USER) + 1
    with pytest.raises(QuotaExceededError) as caught:
        await writer.append("s", bigger)
    assert (caught.value.quota, caught.value.limit, caught.value.value) == (
        "session_tokens",
        cap,
        cap + 1,
    )
    assert await snapshot(raw_redis, writer, "s") == before
    await writer.append("s", USER)
    assert (await writer.info("s")).tokens == cap


@pytest.mark.parametrize("quota", ["session_bytes", "session_tokens"])
async def test_append_many_is_all_or_nothing_under_a_session_quota(
    stores: MakeStore, raw_redis: Redis, quota: str
) -> None:
    """A batch whose first messages fit but whose whole does not writes none of them."""
    batch = [sized(100, "ab "), sized(100, "cd "), sized(100, "ef ")]
    measure = size if quota == "session_bytes" else tokens
    seed = sized(60, "gh ")
    cap = measure(seed) + measure(batch[0]) + measure(batch[1])
    writer = await limited(stores, TenantLimits(**{quota: cap}))
    await writer.append("s", seed)
    before = await snapshot(raw_redis, writer, "s")
    with pytest.raises(QuotaExceededError) as caught:
        await writer.append_many("s", batch)
    assert (caught.value.quota, caught.value.limit, caught.value.value) == (
        quota,
        cap,
        measure(seed) + sum(measure(m) for m in batch),
    )
    assert await snapshot(raw_redis, writer, "s") == before
    await writer.append_many("s", batch[:2])
    assert await writer.get_messages("s") == [seed, *batch[:2]]


@pytest.mark.parametrize("quota", ["session_bytes", "session_tokens"])
async def test_replace_is_held_to_the_session_quota(
    stores: MakeStore, raw_redis: Redis, quota: str
) -> None:
    """A replace whose new history is over the quota is refused and leaves the old one as it was.

    The replace takes the session's lease to write, and every acquisition
    bumps the fencing number in meta (by design: it only grows), which then
    records the lease's release; nothing else may change.
    """
    old = [sized(100, "ab "), sized(100, "cd ")]
    measure = size if quota == "session_bytes" else tokens
    cap = sum(measure(m) for m in old)
    writer = await limited(stores, TenantLimits(**{quota: cap}))
    await writer.append_many("s", old)
    meta_key = writer.keys("s").meta
    before = await snapshot(raw_redis, writer, "s")
    meta_before = await meta_fields(raw_redis, writer, "s")
    new = [*old, sized(40, "ef ")]
    with pytest.raises(QuotaExceededError) as caught:
        await writer.replace("s", new)
    assert (caught.value.quota, caught.value.limit, caught.value.value) == (
        quota,
        cap,
        cap + measure(new[2]),
    )
    after = await snapshot(raw_redis, writer, "s")
    assert without(after, meta_key) == without(before, meta_key)
    meta_after = await meta_fields(raw_redis, writer, "s")
    meta_after.pop(b"fence")
    meta_before.pop(b"fence", None)
    assert meta_after.pop(b"released")  # the lease given back, for a retried release
    assert meta_after == meta_before
    # The quota holds the new history alone: the old one it supersedes does not count.
    await writer.replace("s", old[::-1])
    assert await writer.get_messages("s") == old[::-1]
    with pytest.raises(QuotaExceededError):
        await writer.append("s", sized(40, "ef "))


async def test_refused_replace_of_a_new_session_leaves_no_keys(
    stores: MakeStore, raw_redis: Redis
) -> None:
    """A replace refused by a quota, on a session that does not exist, leaves no key behind."""
    writer = await limited(stores, TenantLimits(session_bytes=100), session_ttl_seconds=3_600)
    with pytest.raises(QuotaExceededError):
        await writer.replace("new", [sized(101)])
    assert await meta_fields(raw_redis, writer, "new") == {}


async def test_clear_resets_the_session_quota(stores: MakeStore) -> None:
    """After a clear, a full session takes session_bytes worth of messages again."""
    writer = await limited(stores, TenantLimits(session_bytes=200))
    await writer.append("s", sized(200))
    with pytest.raises(QuotaExceededError):
        await writer.append("s", sized(30))
    await writer.clear("s")
    await writer.append("s", sized(200))


# -- settings defaults, and the tenant's own limits over them --------------------------


async def test_settings_defaults_apply_without_tenant_limits(
    stores: MakeStore, raw_redis: Redis
) -> None:
    """With no limits of its own, a tenant is held to settings.session_bytes."""
    writer = stores(session_bytes=250)
    await writer.append("s", sized(200))
    before = await snapshot(raw_redis, writer, "s")
    with pytest.raises(QuotaExceededError) as caught:
        await writer.append("s", sized(51))
    assert (caught.value.quota, caught.value.limit) == ("session_bytes", 250)
    assert await snapshot(raw_redis, writer, "s") == before


@pytest.mark.parametrize(
    ("own", "default"),
    [pytest.param(150, 100_000, id="downwards"), pytest.param(100_000, 150, id="upwards")],
)
async def test_tenant_limits_override_settings_defaults(
    stores: MakeStore, raw_redis: Redis, own: int, default: int
) -> None:
    """A tenant's own session_bytes, below or above the settings' default, is the one in force.

    The session takes ``own`` bytes (over the default when that is lower),
    and not one message more (under the default when that is higher).
    """
    writer = await limited(stores, TenantLimits(session_bytes=own), session_bytes=default)
    with pytest.raises(QuotaExceededError) as caught:
        await writer.append("s", sized(own + 1, "ab "))
    assert (caught.value.quota, caught.value.limit, caught.value.value) == (
        "session_bytes",
        own,
        own + 1,
    )
    await writer.append("s", sized(own, "ab "))
    assert await writer.get_messages("s") == [sized(own, "ab ")]
    before = await snapshot(raw_redis, writer, "s")
    with pytest.raises(QuotaExceededError) as caught:
        await writer.append("s", USER)
    assert (caught.value.quota, caught.value.limit) == ("session_bytes", own)
    assert await snapshot(raw_redis, writer, "s") == before


async def test_set_limits_applies_at_once_on_the_same_store(stores: MakeStore) -> None:
    """The store that calls set_limits drops its cached limits: the next write obeys them."""
    writer = stores()
    await writer.append("s", sized(300))  # caches "no limits"
    await writer.set_limits(TenantLimits(session_bytes=350))
    with pytest.raises(QuotaExceededError) as caught:
        await writer.append("s", sized(51))
    assert caught.value.limit == 350


# -- the sessions cap ------------------------------------------------------------------


async def test_sessions_cap_counts_distinct_sessions(stores: MakeStore, raw_redis: Redis) -> None:
    """Many writes to the same two sessions count as two; a third session is refused."""
    writer = await limited(stores, TenantLimits(sessions=2))
    for _ in range(3):
        await writer.append("a", USER)
        await writer.append("b", USER)
    await stores().append("a", USER)  # another process writing a counted session
    before = await snapshot(raw_redis, writer, "c")
    with pytest.raises(QuotaExceededError) as caught:
        await writer.append("c", USER)
    assert (caught.value.quota, caught.value.limit, caught.value.value) == ("sessions", 2, 3)
    with pytest.raises(QuotaExceededError):
        await writer.replace("c", [USER])
    assert await snapshot(raw_redis, writer, "c") == before
    assert sorted(s.session for s in await writer.list_sessions()) == ["a", "b"]


async def test_sessions_cap_is_race_safe(stores: MakeStore, raw_redis: Redis) -> None:
    """Ten concurrent first writes of ten new sessions, cap five: exactly five are written."""
    await stores().set_limits(TenantLimits(sessions=5))
    # One store per session: each has its own reservation cache, like ten processes.
    writers = [stores() for _ in range(10)]
    outcomes = await asyncio.gather(
        *(w.append(f"s{i}", {"role": "user", "content": f"m{i}"}) for i, w in enumerate(writers)),
        return_exceptions=True,
    )
    written = [i for i, o in enumerate(outcomes) if isinstance(o, AppendResult)]
    refused = [o for o in outcomes if isinstance(o, QuotaExceededError)]
    assert len(written) == 5 and len(refused) == 5, outcomes
    assert {(e.quota, e.limit, e.value) for e in refused} == {("sessions", 5, 6)}
    listed = await writers[0].list_sessions()
    assert sorted(s.session for s in listed) == sorted(f"s{i}" for i in written)
    for i in set(range(10)) - set(written):
        states = await snapshot(raw_redis, writers[i], f"s{i}")
        assert {state for _, state in states.values()} == {"missing"}


async def test_deleting_a_session_frees_a_slot(stores: MakeStore) -> None:
    """At the cap, deleting a session lets a new one in, from this process and from another."""
    writer = await limited(stores, TenantLimits(sessions=2))
    await writer.append("a", USER)
    await writer.append("b", USER)
    with pytest.raises(QuotaExceededError):
        await writer.append("c", USER)
    assert await writer.delete("a")
    await writer.append("c", USER)
    with pytest.raises(QuotaExceededError):
        await stores().append("d", USER)
    assert await stores().delete("b")
    await stores().append("d", USER)
    assert sorted(s.session for s in await writer.list_sessions()) == ["c", "d"]


async def test_a_deleted_session_written_again_counts_again(stores: MakeStore) -> None:
    """A session deleted and written again by the same store is held to the cap like a new one."""
    writer = await limited(stores, TenantLimits(sessions=1))
    await writer.append("a", USER)
    await writer.delete("a")
    await writer.append("b", USER)
    with pytest.raises(QuotaExceededError) as caught:
        await writer.append("a", USER)
    assert caught.value.quota == "sessions"


async def test_a_refused_first_write_takes_no_session_slot(stores: MakeStore) -> None:
    """A first append refused by a quota leaves the session unlisted and its slot free."""
    writer = await limited(stores, TenantLimits(sessions=1, session_bytes=100))
    with pytest.raises(QuotaExceededError):
        await writer.append("big", sized(101))
    assert await writer.list_sessions() == []
    await stores().append("small", sized(50))


# -- the append rate -------------------------------------------------------------------


async def rewind_rate(raw: Redis, store: ContextStore, session: str, ms: int) -> None:
    """Pretend the session's last append was ``ms`` earlier (the token bucket refills)."""
    meta = store.keys(session).meta
    last = int(await raw.hget(meta, "rl_at"))
    await raw.hset(meta, "rl_at", last - ms)


@pytest.mark.parametrize("source", ["tenant", "settings"])
async def test_append_rate_allows_the_burst_then_refuses(
    stores: MakeStore, raw_redis: Redis, source: str
) -> None:
    """With 2/s and a burst of 3, three quick appends pass and the fourth is refused."""
    if source == "tenant":
        writer = await limited(stores, TenantLimits(appends_per_second=2, append_burst=3))
    else:
        writer = stores(appends_per_second=2, append_burst=3)
    for i in range(3):
        await writer.append("s", {"role": "user", "content": f"m{i}"})
    before = await snapshot(raw_redis, writer, "s")
    with pytest.raises(QuotaExceededError) as caught:
        await writer.append("s", USER)
    assert (caught.value.quota, caught.value.limit) == ("appends_per_second", 2)
    assert await snapshot(raw_redis, writer, "s") == before
    assert len(await writer.get_messages("s")) == 3


async def test_append_rate_refills_with_time(stores: MakeStore, raw_redis: Redis) -> None:
    """One second after an exhausted burst, two more appends pass (2/s), and a third does not."""
    writer = await limited(stores, TenantLimits(appends_per_second=2, append_burst=3))
    await writer.append_many("s", [USER, USER, USER])
    with pytest.raises(QuotaExceededError):
        await writer.append("s", USER)
    await rewind_rate(raw_redis, writer, "s", 1_000)
    await writer.append("s", USER)
    await writer.append("s", USER)
    with pytest.raises(QuotaExceededError) as caught:
        await writer.append("s", USER)
    assert caught.value.quota == "appends_per_second"
    await rewind_rate(raw_redis, writer, "s", 60_000)  # a long pause refills the burst, no more
    await writer.append_many("s", [USER, USER, USER])
    with pytest.raises(QuotaExceededError):
        await writer.append("s", USER)


async def test_append_rate_counts_every_message_of_a_batch(
    stores: MakeStore, raw_redis: Redis
) -> None:
    """A batch of four is refused by a burst of three; a batch of three passes."""
    writer = await limited(stores, TenantLimits(appends_per_second=2, append_burst=3))
    before = await snapshot(raw_redis, writer, "s")
    with pytest.raises(QuotaExceededError) as caught:
        await writer.append_many("s", [USER] * 4)
    assert caught.value.quota == "appends_per_second"
    assert await snapshot(raw_redis, writer, "s") == before
    await writer.append_many("s", [USER] * 3)


async def test_append_rate_is_per_session(stores: MakeStore) -> None:
    """One session's exhausted burst does not hold back another session of the tenant."""
    writer = await limited(stores, TenantLimits(appends_per_second=2, append_burst=3))
    await writer.append_many("a", [USER] * 3)
    with pytest.raises(QuotaExceededError):
        await writer.append("a", USER)
    await writer.append_many("b", [USER] * 3)


async def test_a_fractional_append_rate_is_reported_as_it_is(stores: MakeStore) -> None:
    """The error of a 0.5/s quota says limit 0.5 and a positive shortfall."""
    writer = await limited(stores, TenantLimits(appends_per_second=0.5, append_burst=1))
    await writer.append("s", USER)
    with pytest.raises(QuotaExceededError) as caught:
        await writer.append("s", USER)
    assert caught.value.quota == "appends_per_second"
    assert caught.value.limit == 0.5
    assert caught.value.value > 0


# -- retries are answered whatever the quotas -----------------------------------------


@pytest.mark.parametrize(
    "limits",
    [
        TenantLimits(appends_per_second=2, append_burst=3),
        TenantLimits(session_bytes=3 * len(b'{"role":"user","content":"m0"}')),
    ],
    ids=["appends_per_second", "session_bytes"],
)
async def test_a_retried_append_is_answered_when_the_quota_is_exhausted(
    stores: MakeStore, raw_redis: Redis, limits: TenantLimits
) -> None:
    """A retry (same idempotency key) of an applied append gets its original entry, quota or not."""
    writer = await limited(stores, limits)
    firsts = [
        await writer.append("s", {"role": "user", "content": f"m{i}"}, idempotency_key=f"k{i}")
        for i in range(3)
    ]
    with pytest.raises(QuotaExceededError):
        await writer.append("s", {"role": "user", "content": "m3"}, idempotency_key="k3")
    before = await snapshot(raw_redis, writer, "s")
    retry = await stores().append("s", {"role": "user", "content": "m1"}, idempotency_key="k1")
    assert retry.duplicate
    assert (retry.entry_id, retry.seq) == (firsts[1].entry_id, firsts[1].seq)
    batch = await writer.append_many(
        "s",
        [{"role": "user", "content": "m0"}, {"role": "user", "content": "m2"}],
        idempotency_keys=["k0", "k2"],
    )
    assert [r.entry_id for r in batch] == [firsts[0].entry_id, firsts[2].entry_id]
    assert all(r.duplicate for r in batch)
    assert await snapshot(raw_redis, writer, "s") == before
