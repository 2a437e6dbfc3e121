"""Tenancy: a store touches only its tenant's keys, forgets a tenant whole, applies its TTL.

Isolation and forgetting are checked on private servers (a keyspace of the
test's own, watched with MONITOR and listed with SCAN); the TTL tests run on
the shared Redis under the run's prefix.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from support.append_forms import FULL, LEAN, sent
from support.helpers import SYSTEM, append_until_due, ttl_span, turn
from support.servers import Logged, Monitor, PrivateRedis, ServerPool, all_keys, run_burst

from ctxstore import (
    ContextStore,
    InvalidIdError,
    LocalSummarizer,
    Settings,
    TenantLimits,
)
from ctxstore import store as store_module
from ctxstore._layout.keys import tenant_sessions_key, tenants_key
from ctxstore._layout.memo import Memo
from ctxstore.summary_queue import job_id
from ctxstore.testing import ManualClock

PREFIX = "ctxten"
QUEUE = f"{PREFIX}:summaries"
HOSTILE_CONTENT = {"role": "user", "content": "read {beta:s}:log, then * ? [a] .. \u0430cme"}

HOSTILE_SESSIONS: list[Any] = [
    "a}:x",
    "*",
    "?",
    "[",
    "..",
    "a..b",
    ".hidden",
    "-dash",
    "\u0430cme",  # Cyrillic a
    "s\u0435ssion",  # Cyrillic e
    "",
    "x" * 129,
    "a\x00b",
    "a\nb",
    "a b",
    "{beta:s}",
    "beta}:x{",
    "s:log",
    None,
    7,
    b"s",
]
HOSTILE_TENANTS: list[Any] = [
    "beta}:x",
    "acme}",
    "{beta}",
    "acme:x",
    "*",
    "?",
    "[",
    "..",
    "b\u0435ta",  # Cyrillic e
    "",
    "t" * 129,
    "acme\x00",
    "acme\n",
    None,
    b"acme",
]
EDGE_SESSIONS = ["s", "a.b-c_d", "x" * 128, "_", "Z9"]
"""Valid ids at the edges of the grammar."""


async def collect(items: AsyncIterator[Any]) -> list[Any]:
    """Drain an async iterator."""
    return [item async for item in items]


def session_calls(store: Any, session: Any) -> dict[str, Callable[[], Awaitable[Any]]]:
    """Every public store method that takes a session id, called with ``session``."""
    return {
        "append": lambda: store.append(session, HOSTILE_CONTENT),
        "append_many": lambda: store.append_many(session, [HOSTILE_CONTENT]),
        "read": lambda: store.read(session),
        "iter_history": lambda: collect(store.iter_history(session)),
        "get_messages": lambda: store.get_messages(session),
        "get_entry": lambda: store.get_entry(session, "1-0"),
        "view": lambda: store.view(session, token_budget=1_000),
        "get_messages_for_request": lambda: store.get_messages_for_request(session, 1_000),
        "lease": lambda: store.lease(session),
        "replace": lambda: store.replace(session, [HOSTILE_CONTENT]),
        "clear": lambda: store.clear(session),
        "summarize": lambda: store.summarize(session, LocalSummarizer()),
        "request_summary": lambda: store.request_summary(session),
        "info": lambda: store.info(session),
        "delete": lambda: store.delete(session),
        "set_ttl": lambda: store.set_ttl(session, 60),
        "pin": lambda: store.pin(session, "1-0"),
        "pop": lambda: store.pop(session),
        "tail": lambda: store.tail(session, 5),
        "search": lambda: store.search(session, "hostile content"),
        "index": lambda: store.index(session),
        "checkpoint": lambda: store.checkpoint(session),
        "checkpoints": lambda: store.checkpoints(session),
        "delete_checkpoint": lambda: store.delete_checkpoint(session, "cp-1"),
        "rewind": lambda: store.rewind(session, "1-0"),
        "branches": lambda: store.branches(session),
        "read_branch": lambda: store.read_branch(session, "br-1"),
        "fork": lambda: store.fork(session, "fork-of-it"),
        "export_session": lambda: collect(store.export_session(session)),
        # None is the default there (the export's own id): "" stands for it.
        "import_sessions": lambda: store.import_sessions([], session=session or ""),
    }


def acmes(key: str) -> bool:
    """True for a key tenant acme's store may name: its own, the tenants set, its jobs."""
    return (
        key.startswith((f"{PREFIX}:{{acme:", f"{PREFIX}:{{acme}}:"))
        or key in (f"{PREFIX}:tenants", QUEUE)
        or any(
            key.startswith(f"arq:{kind}:{PREFIX}:sum:acme:")
            for kind in ("job", "result", "retry", "in-progress")
        )
    )


KEYLESS = {
    b"PING",
    b"MULTI",
    b"EXEC",
    b"DISCARD",
    b"TIME",
    b"ECHO",
    b"SCAN",
    b"UNWATCH",
    b"HELLO",
    b"CLIENT",
}


async def keys_named(admin: Redis, logged: list[Logged]) -> set[str]:
    """Every key named by the logged commands, as the server itself finds them (COMMAND GETKEYS)."""
    found: set[str] = set()
    for entry in logged:
        if entry.args[0].upper() in KEYLESS:
            continue
        keys = await admin.command_getkeys(*entry.args)
        found.update(k.decode() if isinstance(k, bytes) else k for k in keys)
    return found


@pytest.fixture
def private(servers: ServerPool) -> PrivateRedis:
    """A private server with an empty keyspace."""
    return servers.start()


@pytest.fixture
async def admin(private: PrivateRedis) -> AsyncIterator[Redis]:
    """A raw client on the private server."""
    client = Redis.from_url(private.url())
    yield client
    await client.aclose()


def private_settings(server: PrivateRedis, **overrides: Any) -> Settings:
    """Settings on a private server, under this module's prefix and queue."""
    return Settings(
        redis_url=server.url(), key_prefix=PREFIX, queue_name=QUEUE, retry_attempts=1, **overrides
    )


# -- isolation -------------------------------------------------------------------


def test_the_hostile_walk_covers_every_public_method_that_takes_a_session() -> None:
    """Every public ContextStore method with a session parameter is in the hostile-id walk."""
    takes_session = {
        name
        for name, method in inspect.getmembers(ContextStore, inspect.isfunction)
        if not name.startswith("_") and "session" in inspect.signature(method).parameters
    }
    # keys() is sync, checked on its own; limits() takes the session for error messages only.
    assert takes_session - {"keys", "limits"} == set(session_calls(None, "s"))


async def test_hostile_ids_are_refused_and_a_store_names_only_its_tenants_keys(
    private: PrivateRedis, admin: Redis
) -> None:
    """Hostile ids raise before any I/O; every key acme's store names (MONITOR, SCAN) is acme's."""
    settings = private_settings(private, summary_trigger_tokens=0, summary_keep_tokens=20)
    raw = Redis.from_url(private.url())
    async with (
        Monitor(private.port) as monitor,
        ContextStore(raw, tenant="acme", settings=settings) as store,
    ):
        for bad in HOSTILE_SESSIONS:
            with pytest.raises(InvalidIdError):
                store.keys(bad)
            for call in session_calls(store, bad).values():
                with pytest.raises(InvalidIdError):
                    await call()
        for bad in HOSTILE_TENANTS:
            with pytest.raises(InvalidIdError):
                ContextStore(raw, tenant=bad, settings=settings)
            with pytest.raises(InvalidIdError):
                store.for_tenant(bad)
            if bad:  # None and "" mean "the settings' tenant" here: see the test below
                with pytest.raises(InvalidIdError):
                    ContextStore.from_settings(settings, tenant=bad)
                with pytest.raises(InvalidIdError):
                    ContextStore.from_url(settings.redis_url or "", bad, settings=settings)
        assert await monitor.drain() == []  # nothing reached Redis

        await store.set_limits(TenantLimits(sessions=100, ttl_seconds=3_600))
        assert (await store.limits()).sessions == 100
        await store.append("s", SYSTEM)
        batch = await store.append_many(
            "s",
            [HOSTILE_CONTENT, turn(1)] * 3,
            idempotency_keys=[f"{{beta:s}}:log:{i}" for i in range(6)],
        )
        assert (await store.view("s", token_budget=60)).stats.dropped > 0
        assert await store.get_messages_for_request("s", 10_000)
        assert len((await store.read("s", limit=3)).messages) == 3
        assert len(await collect(store.iter_history("s"))) == 7
        assert (await store.get_messages("s"))[1] == HOSTILE_CONTENT
        assert await store.get_entry("s", batch[0].entry_id) is not None
        assert await store.pin("s", batch[0].entry_id)
        assert await store.pin("s", batch[0].entry_id, pinned=False)
        await store.set_ttl("s", 600)
        await store.set_ttl("s", None)
        assert (await store.summarize("s", LocalSummarizer())).status == "committed"
        assert await store.request_summary("s") > 0
        for session in EDGE_SESSIONS[1:]:
            await store.append(session, HOSTILE_CONTENT)
        async with await store.lease(EDGE_SESSIONS[2]) as lease:
            await store.replace(EDGE_SESSIONS[2], [SYSTEM, HOSTILE_CONTENT], lease=lease)
        assert (await store.clear("a.b-c_d")).count == 0
        assert (await store.info("_")).exists
        assert await store.delete("_")
        assert {r.session for r in await store.list_sessions()} == set(EDGE_SESSIONS) - {"_"}
        point = await store.checkpoint("s")
        await store.fork("s", "s-fork", at=point)
        await store.rewind("s-fork", (await store.read("s-fork", limit=1)).messages[0].entry_id)
        assert len(await store.branches("s-fork")) == 1
        lines = await collect(store.export_session("s-fork"))
        assert (await store.import_sessions(lines, session="s-copy"))[0].count == 1
        await store.delete("s-fork")
        await store.delete("s-copy")

        stored = await all_keys(private.url())
        assert stored  # the check below is not vacuous
        assert sorted(k for k in stored if not acmes(k)) == []

        assert await store.forget_tenant() == 4
        logged = await monitor.drain()

    named = await keys_named(admin, logged)
    assert sorted(k for k in named if not acmes(k)) == []
    assert {
        store.keys("s").log,
        tenant_sessions_key(PREFIX, "acme"),
        tenants_key(PREFIX),
    } <= named  # the parse found keys, from clients and from scripts
    assert any(e.source == "lua" for e in logged)
    assert sorted(k for k in await all_keys(private.url()) if not acmes(k)) == []


async def test_an_empty_tenant_id_is_refused_by_every_constructor(private: PrivateRedis) -> None:
    """ContextStore(), from_settings and from_url all refuse an empty tenant id."""
    settings = private_settings(private, tenant="default")
    raw = Redis.from_url(private.url())
    try:
        with pytest.raises(InvalidIdError):
            ContextStore(raw, tenant="", settings=settings)
    finally:
        await raw.aclose()
    makers: list[Callable[[], ContextStore]] = [
        lambda: ContextStore.from_settings(settings, tenant=""),
        lambda: ContextStore.from_url(private.url(), "", settings=settings),
    ]
    for make in makers:
        try:
            store = make()
        except InvalidIdError:
            continue
        await store.aclose()
        pytest.fail(f"an empty tenant id gave a store bound to tenant {store.tenant!r}")


# -- forgetting a tenant -----------------------------------------------------------


async def build_tenant(store: ContextStore) -> None:
    """Sessions with a pin, a summary, a TTL and a queued summary job, and the tenant's limits."""
    await store.set_limits(TenantLimits(sessions=10, ttl_seconds=3_600))
    pinned = await store.append_many("pinned", [SYSTEM, turn(0), turn(1)])
    assert await store.pin("pinned", pinned[1].entry_id)
    await store.append_many("summarized", [turn(i) for i in range(6)])  # below the trigger
    assert (await store.summarize("summarized", LocalSummarizer())).status == "committed"
    await store.append("ttl", turn(0))
    await store.set_ttl("ttl", 120)
    await append_until_due(store, "queued")


async def snapshot(store: ContextStore) -> dict[str, Any]:
    """A tenant's sessions as its users see them (TTLs left out: they tick)."""
    rows = await store.list_sessions()
    return {
        "rows": rows,
        "limits": await store.limits(),
        "messages": {r.session: await store.get_messages(r.session) for r in rows},
        "info": {
            r.session: dataclasses.replace(await store.info(r.session), ttl_seconds=None)
            for r in rows
        },
    }


async def test_forget_tenant_leaves_no_key_of_the_tenant_and_keeps_the_others(
    private: PrivateRedis, admin: Redis
) -> None:
    """After forget_tenant(acme): no key or arq job names acme; beta reads exactly as before."""
    settings = private_settings(private, summary_trigger_tokens=400, summary_keep_tokens=150)
    async with (
        ContextStore.from_settings(settings, tenant="acme") as acme,
        ContextStore.from_settings(settings, tenant="beta") as beta,
    ):
        for store in (acme, beta):
            await build_tenant(store)
        before = await snapshot(beta)
        beta_keys = {k for k in await all_keys(private.url()) if "beta" in k}
        assert any("{acme" in k for k in await all_keys(private.url()))
        assert len(await admin.zrange(QUEUE, 0, -1)) == 2  # a job of each tenant

        assert await acme.forget_tenant() == 4

        keys = await all_keys(private.url())
        assert sorted(k for k in keys if "{acme" in k) == []
        assert sorted(k for k in keys if k.startswith("arq:") and ":acme:" in k) == []
        assert [m.decode() for m in await admin.zrange(QUEUE, 0, -1)] == [
            job_id(settings, "beta", "queued", (await beta.info("queued")).summary_generation)
        ]
        assert await admin.smembers(tenants_key(PREFIX)) == {b"beta"}
        assert {k for k in keys if "beta" in k} == beta_keys
        assert await snapshot(beta) == before
        assert await acme.list_sessions() == []
        assert await acme.limits() == TenantLimits()


async def test_forget_tenant_leaves_no_arq_result_of_an_earlier_job(
    private: PrivateRedis, admin: Redis
) -> None:
    """A session whose first job ran and second is queued: forget leaves no arq key of it."""
    settings = private_settings(
        private, summary_trigger_tokens=400, summary_keep_tokens=150, worker_name="tenancy"
    )
    async with ContextStore.from_settings(settings, tenant="acme") as store:
        await append_until_due(store, "s")
        first = (await store.info("s")).summary_generation
        worker = await run_burst(settings, LocalSummarizer())
        assert worker.jobs_complete == 1
        assert (await store.info("s")).summary_runs == 1
        await append_until_due(store, "s")
        assert (await store.info("s")).summary_generation > first
        # No result was kept: it would name the tenant and session after the forget.
        assert not await admin.exists(f"arq:result:{job_id(settings, 'acme', 's', first)}")

        assert await store.forget_tenant() == 1

    keys = await all_keys(private.url())
    assert sorted(k for k in keys if "{acme" in k) == []
    assert sorted(k for k in keys if k.startswith("arq:") and ":acme:" in k) == []


# -- a tenant's TTL ------------------------------------------------------------------


async def assert_ttls(client: Redis, keys: tuple[str, ...], seconds: int) -> None:
    """Every key exists and expires within ``seconds`` and the stretch a write adds to it."""
    for key in keys:
        pttl = await client.pttl(key)
        assert seconds * 1000 - 10_000 < pttl <= ttl_span(seconds * 1000), (key, pttl)


async def test_a_tenant_ttl_is_given_to_the_session_keys_and_renewed_by_writes_when_due(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """With the tenant's ttl_seconds, writes give the session's keys that TTL and renew it.

    Each write below comes when the keys have 5 s left: due (append.lua's ``stretch``).
    """
    summarizing = settings.model_copy(
        update={"summary_trigger_tokens": 0, "summary_keep_tokens": 20}
    )
    async with ContextStore.from_settings(summarizing, tenant=tenant) as store:
        await store.set_limits(TenantLimits(ttl_seconds=600))
        keys = store.keys("s")
        await store.append_many("s", [SYSTEM, turn(0), turn(1), turn(2), turn(3)])
        assert (await store.summarize("s", LocalSummarizer())).status == "committed"
        lasting = (keys.log, keys.meta, keys.keep, keys.view)
        await assert_ttls(raw_redis, lasting, 600)
        assert 599 <= ((await store.info("s")).ttl_seconds or 0) <= 660  # the time left
        assert await raw_redis.pttl(keys.idem) > 0  # bounded too, by the idempotency period

        writes: list[Callable[[], Awaitable[Any]]] = [
            lambda: store.append("s", turn(4)),
            lambda: store.append_many("s", [turn(5), turn(6)]),
        ]
        for write in writes:
            for key in lasting:
                assert await raw_redis.pexpire(key, 5_000)
            await write()
            await assert_ttls(raw_redis, lasting, 600)

        for key in (keys.log, keys.meta, keys.keep):
            assert await raw_redis.pexpire(key, 5_000)
        await store.replace("s", [SYSTEM, turn(7)])
        await assert_ttls(raw_redis, (keys.log, keys.meta, keys.keep), 600)


@pytest.mark.parametrize("source", ["settings", "tenant limits"])
async def test_list_sessions_forgets_sessions_idle_longer_than_the_ttl(
    settings: Settings, tenant: str, raw_redis: Redis, source: str
) -> None:
    """A session idle past the TTL leaves list_sessions and the index; a fresher one stays."""
    ttl = 60
    clock = ManualClock(int(time.time() * 1000))
    if source == "settings":
        settings = settings.model_copy(update={"session_ttl_seconds": ttl})
    async with ContextStore.from_settings(settings, tenant=tenant, clock=clock) as store:
        if source == "tenant limits":
            await store.set_limits(TenantLimits(ttl_seconds=ttl))
        await store.append("idle", turn(0))
        clock.advance(ttl - 1)
        await store.append("fresh", turn(1))
        assert [r.session for r in await store.list_sessions()] == ["fresh", "idle"]
        clock.advance(2)
        # Redis's TTLs run on real time: expire the idle session's keys as Redis would.
        assert 0 < await raw_redis.pttl(store.keys("idle").meta) <= ttl_span(ttl * 1000)
        await raw_redis.delete(*store.keys("idle").all())
        assert [r.session for r in await store.list_sessions()] == ["fresh"]
    index = tenant_sessions_key(settings.key_prefix, tenant)
    assert await raw_redis.zrange(index, 0, -1) == [b"fresh"]


# -- a store per request: for_tenant gives the same one ------------------------------------


def test_a_memo_forgets_the_least_recently_used_entry() -> None:
    """Reading or writing an entry keeps it; the one untouched longest goes first."""
    memo: Memo[str, int] = Memo(limit=2)
    memo.put("a", 1)
    memo.put("b", 2)
    assert memo.get("a") == 1  # used: "b" is now the oldest
    memo.put("c", 3)
    assert ("a" in memo, "b" in memo, "c" in memo) == (True, False, True)
    memo.put("a", 4)  # written again: "c" is now the oldest
    memo.put("d", 5)
    assert (memo.get("a"), memo.get("c"), memo.get("d")) == (4, None, 5)


async def test_for_tenant_gives_one_store_per_tenant_to_the_whole_family(
    settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same store for a tenant from the root or a sibling; the least recently asked goes."""
    monkeypatch.setattr(store_module, "TENANT_STORES", 3)
    async with ContextStore.from_settings(settings, tenant=tenant) as root:
        first = root.for_tenant(tenant + "-a")
        assert root.for_tenant(tenant) is root
        assert first.for_tenant(tenant + "-a") is first
        assert root.for_tenant(tenant + "-a") is first
        second = first.for_tenant(tenant + "-b")
        assert second.tenant == tenant + "-b" and root.for_tenant(tenant + "-b") is second
        root.for_tenant(tenant + "-a")  # asked for again: "-b" is now the oldest besides root
        root.for_tenant(tenant)
        third = root.for_tenant(tenant + "-c")  # over the bound: "-b" goes
        assert root.for_tenant(tenant + "-a") is first and root.for_tenant(tenant + "-c") is third
        again = root.for_tenant(tenant + "-b")
        assert again is not second and again.tenant == tenant + "-b"
        await again.append("s", turn(0))  # a store built again works as the first did
        assert await second.get_messages("s") == [turn(0)]


async def test_a_store_per_request_keeps_what_the_tenant_s_store_learned(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A store asked for per request knows what the tenant's store learned before.

    The tenant's limits are not read again; a session with a TTL of its own takes the
    lean form until its expiry is due to move, then the full form once.
    """
    async with ContextStore.from_settings(settings, tenant=tenant + "-root") as root:
        request = root.for_tenant(tenant)
        await request.append("s", turn(0))
        await request.set_ttl("s", 600)
        await raw_redis.pexpire(request.keys("s").meta, 599_000)  # a second on: due
        runs = sent(request)
        limits = count_limit_reads(request)
        await request.append("s", turn(1))
        assert runs == [LEAN, FULL]
        runs.clear()
        for n in range(2, 5):  # each request asks for the tenant's store again
            await root.for_tenant(tenant).append("s", turn(n))
        assert runs == [LEAN, LEAN, LEAN]
        assert limits == []
        assert await root.for_tenant(tenant).get_messages("s") == [turn(n) for n in range(5)]


def count_limit_reads(store: ContextStore) -> list[str]:
    """Record each time ``store`` reads its tenant's limits from Redis."""
    quotas = store._quotas
    real = quotas.own
    reads: list[str] = []

    async def own(*args: Any, **kwargs: Any) -> Any:
        reads.append(store.tenant)
        return await real(*args, **kwargs)

    quotas.own = own  # type: ignore[method-assign]
    return reads


class Disguised(str):
    """An id that formats, compares and hashes as another."""

    def __format__(self, spec: str) -> str:
        return "victim"

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return hash("victim")


async def test_a_str_subclass_names_the_keys_of_its_own_characters(
    store: ContextStore,
) -> None:
    """A session or tenant id of a str subclass is taken for its characters, never its methods."""
    victim = store.keys("victim")  # cached first: a disguised id must not find it
    mine = store.keys(Disguised("mine"))
    assert mine.log.endswith(":mine}:log") and mine != victim
    other = store.for_tenant(Disguised("elsewhere"))
    assert other.tenant == "elsewhere" and type(other.tenant) is str
    assert other.keys("s").log.endswith("{elsewhere:s}:log")
    await store.append(Disguised("mine"), turn(0))
    assert await store.get_messages("mine") == [turn(0)]
    assert await store.get_messages("victim") == []
