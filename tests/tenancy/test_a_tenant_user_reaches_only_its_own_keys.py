"""A tenant's own Redis user reaches only its own keys, under ``script_mode=functions``.

A private Redis 7 holds the rendered ACL users of two tenants (acme and beta), the
pod's and the worker's, and the functions library. Acme's user runs every function
with each key pointed outside acme, with hostile arguments, and raw commands at beta's,
the tenants' and the queue's keys: each is refused (NOPERM) and nothing changes. It may
write no key another tenant's work reads (the sweep finds it by its user's name), and
hostile values it may write (its index, its own sessions) never stop the worker's sweep
from queueing beta's due summary.

Known leaks are pinned by strict xfails: each one's reason says what leaks. The long
runs are marked ``soak``.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import hypothesis
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from redis import exceptions as rex
from redis.asyncio import Redis
from redis.exceptions import NoPermissionError
from support.config import examples
from support.helpers import append_until_due, key_states, msg
from support.servers import ServerPool, redis7_binary
from support.tenant import listed, set_limits

from ctxstore import (
    ConflictError,
    ContextStore,
    CtxstoreError,
    LeaseHeldError,
    LocalSummarizer,
    QuotaExceededError,
    Settings,
    TenantLimits,
)
from ctxstore._layout.keys import (
    session_keys,
    tenant_pending_keys,
    tenant_sessions_key,
    tenants_key,
)
from ctxstore._redis.scripts import NAMES, SCRIPTS, library
from ctxstore._tenant.acl import POD_USER, WORKER_USER, render_acl, tenant_user_name
from ctxstore.summary_queue import SummaryQueue
from workers.sweep import sweep

ACL_PREFIX = "ctxatk"
ACL_TENANTS = ("acme", "beta")
ACME_USER, BETA_USER = (tenant_user_name(t) for t in ACL_TENANTS)


@dataclass
class AclServer:
    port: int
    url: Callable[..., str]
    settings: Settings
    passwords: dict[str, str]

    def as_user(self, user: str) -> Settings:
        mode = "functions" if user.startswith("ctxstore-t-") else "eval"
        return self.settings.model_copy(
            update={"redis_url": self.url(user, self.passwords[user]), "script_mode": mode}
        )

    @contextlib.asynccontextmanager
    async def client(self, user: str | None = None) -> AsyncIterator[Redis]:
        client = Redis.from_url(self.url(user, None if user is None else self.passwords[user]))
        try:
            yield client
        finally:
            await client.aclose()


@pytest.fixture
def acl(servers: ServerPool) -> AclServer:
    """A private Redis 7 with the rendered users of acme and beta and the functions loaded."""
    if redis7_binary() is None:
        pytest.skip("needs redis-server >= 7")
    settings = Settings(
        key_prefix=ACL_PREFIX,
        queue_name=f"{ACL_PREFIX}:summaries",
        summary_trigger_tokens=400,
        summary_keep_tokens=150,
        worker_name="attack-worker",
        retry_attempts=1,
    )
    names = [POD_USER, WORKER_USER, ACME_USER, BETA_USER]
    passwords = {name: secrets.token_urlsafe(16) for name in names}
    admin = "user default on nopass ~* &* +@all\n"
    server = servers.start(acl=render_acl(settings, ACL_TENANTS, passwords) + admin)
    subprocess.run(
        ["redis-cli", "-p", str(server.port), "-x", "FUNCTION", "LOAD", "REPLACE"],
        input=library(),
        capture_output=True,
        text=True,
        check=True,
    )
    return AclServer(
        server.port, server.url, settings.model_copy(update={"redis_url": server.url()}), passwords
    )


async def _dump(client: Redis, pattern: str) -> dict[str, Any]:
    """Every key matching ``pattern``: its value and whether it expires (an admin's view)."""
    keys = [key.decode() async for key in client.scan_iter(match=pattern, count=1_000)]
    return await key_states(client, keys)


@dataclass(frozen=True)
class ScriptCall:
    """One function call as the SDK sent it."""

    name: str
    keys: tuple[str, ...]
    args: tuple[Any, ...]


@pytest.fixture
async def tour(acl: AclServer) -> dict[str, ScriptCall]:
    """Every function the SDK runs as acme's user, with the keys and args it really sent."""
    by_function = {getattr(SCRIPTS, name).function: name for name in NAMES}
    seen: dict[str, ScriptCall] = {}
    settings = acl.as_user(ACME_USER).model_copy(update={"lease_wait_seconds": 0})
    async with ContextStore.from_settings(settings, tenant="acme") as store:
        real = store._connection.node_call

        async def record(key: str, commands: Any, **kwargs: Any) -> Any:
            first = commands[0]
            if first[0] == "FCALL":
                name, n = by_function[first[1]], int(first[2])
                call = ScriptCall(name, tuple(first[3 : 3 + n]), tuple(first[3 + n :]))
                seen.setdefault(name, call)
            return await real(key, commands, **kwargs)

        store._connection.node_call = record  # type: ignore[method-assign]
        await append_until_due(store, "s")
        first = (await store.read("s", limit=1)).messages[0]
        await store.pin("s", first.entry_id)
        await store.set_ttl("s", 3_600)
        view = await store.view("s", token_budget=200, model="claude-sonnet-4-5")
        if hasattr(store, "record_usage"):  # the learned token ratios (ratio.lua)
            await store.record_usage(view, view.stats.tokens + 10, model="claude-sonnet-4-5")
            await store.record_overflow(model="claude-sonnet-4-5")
        await store.summarize("s", LocalSummarizer())
        await store.request_summary("s", force=True)
        async with await store.lease("s") as lease:
            await lease.renew()
        await store.replace("s", [msg("r")])
        with pytest.raises(ConflictError):  # a refused first write: unlist
            await store.append("new", msg("x"), expected_seq=5)
        await store.delete("s")
        await store.list_sessions()
    return seen


def _foreign(key: str, target: str) -> str:
    """``key`` moved outside acme: beta's key, acme's limits, the tenants set or the queue."""
    if target == "beta":
        return key.replace(f"{ACL_PREFIX}:{{acme", f"{ACL_PREFIX}:{{beta")
    return {
        "limits": f"{ACL_PREFIX}:{{acme}}:limits",
        "tenants": tenants_key(ACL_PREFIX),
        "queue": f"{ACL_PREFIX}:summaries",
    }[target]


def _own_keys(tour: dict[str, ScriptCall], name: str) -> tuple[str, ...]:
    """The keys the SDK sends ``name`` as acme's user (else three of acme's own keys).

    A function the SDK never calls as a tenant's user (the queue's) gets acme's keys.
    """
    if name in tour:
        return tour[name].keys
    keys = session_keys(ACL_PREFIX, "acme", "s")
    return keys.meta, keys.log, keys.keep


async def test_every_function_naming_a_key_outside_the_tenant_is_refused(
    acl: AclServer, tour: dict[str, ScriptCall]
) -> None:
    """FCALL of each function, each key slot pointed outside acme: NOPERM, and no change."""
    assert len(tour) >= 13  # the SDK's tour reached every function a tenant's user runs
    async with ContextStore.from_settings(acl.as_user(BETA_USER), tenant="beta") as beta:
        await append_until_due(beta, "s")
        await beta.lease("s")
    async with acl.client() as admin, acl.client(ACME_USER) as client:
        await admin.hset(f"{ACL_PREFIX}:{{acme}}:limits", "limits", "{}")
        before = await _dump(admin, f"{ACL_PREFIX}:*")
        refused = 0
        for name in NAMES:
            own = _own_keys(tour, name)
            args = tour[name].args if name in tour else ("x", "{}", 60_000, 1)
            for position, key in enumerate(own):
                for target in ("beta", "limits", "tenants", "queue"):
                    keys = list(own)
                    keys[position] = _foreign(key, target)
                    function = getattr(SCRIPTS, name).function
                    with pytest.raises(NoPermissionError):
                        await client.fcall(function, len(keys), *keys, *args)
                    refused += 1
        after = await _dump(admin, f"{ACL_PREFIX}:*")
    assert refused == 4 * sum(len(_own_keys(tour, name)) for name in NAMES)
    assert after == before


HOSTILE_ARGS = st.lists(
    st.one_of(
        st.integers(-(2**63), 2**63 - 1),
        st.text(max_size=30),
        st.sampled_from(["", "-1", "1e400", "nan", "inf", "0", "99999999999999999999", "a:1,b:2"]),
        st.binary(max_size=30),
    ),
    max_size=40,
)


@hypothesis.settings(
    max_examples=examples(60),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(calls=st.lists(st.tuples(st.sampled_from(NAMES), HOSTILE_ARGS), min_size=1, max_size=6))
async def test_hostile_arguments_to_the_functions_never_reach_another_tenant(
    acl: AclServer, tour: dict[str, ScriptCall], calls: list[tuple[str, list[Any]]]
) -> None:
    """Acme FCALLs every function on its own keys with hostile args: beta unchanged, server up."""
    async with acl.client() as admin, acl.client(ACME_USER) as client:
        before = await _dump(admin, f"{ACL_PREFIX}:{{beta*")
        for name, args in calls:
            keys = _own_keys(tour, name)
            with contextlib.suppress(rex.ResponseError):
                await client.fcall(getattr(SCRIPTS, name).function, len(keys), *keys, *args)
        assert await _dump(admin, f"{ACL_PREFIX}:{{beta*") == before
        assert await admin.ping()
        planted = [k async for k in admin.scan_iter(match=f"{ACL_PREFIX}:{{acme*")]
        if planted:
            await admin.delete(*planted)


async def _sweep_as_worker(acl: AclServer) -> Any:
    settings = acl.as_user(WORKER_USER)
    queue = await SummaryQueue.connect(settings)
    try:
        async with ContextStore.from_settings(settings, tenant="beta") as base:
            return await sweep(base, queue, grace_seconds=0)
    finally:
        await queue.aclose()


async def _beta_due(acl: AclServer) -> None:
    async with ContextStore.from_settings(acl.as_user(BETA_USER), tenant="beta") as store:
        await append_until_due(store, "long")


HOSTILE_PLANTS: dict[str, Callable[[Redis], Awaitable[Any]]] = {
    "index: bad members and scores": lambda c: c.zadd(
        tenant_sessions_key(ACL_PREFIX, "acme"),
        {"bad{x": 1, "x" * 300: float("inf"), "a*b": float("-inf"), "..": 5, "ok": 2**60},
    ),
    "index: a valid member whose meta is a string": lambda c: _wrongtype(c),
    "pending: junk reservations": lambda c: _junk_pending(c),
}


async def _wrongtype(client: Redis) -> None:
    await client.set(session_keys(ACL_PREFIX, "acme", "w").meta, "not a hash")
    await client.zadd(tenant_sessions_key(ACL_PREFIX, "acme"), {"w": time.time() * 1000})


async def _junk_pending(client: Redis) -> None:
    pending, due = tenant_pending_keys(ACL_PREFIX, "acme")
    await client.hset(pending, mapping={"s": "x:99999999999999999999999,::,a:b:c," * 200, "t": ""})
    await client.zadd(due, {"s": 1, "t": float("inf")})
    await client.zadd(tenant_sessions_key(ACL_PREFIX, "acme"), {"s": time.time() * 1000})


@pytest.mark.parametrize("plant", list(HOSTILE_PLANTS))
async def test_hostile_values_in_the_index_never_stop_the_sweep(
    acl: AclServer, plant: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Acme's user plants hostile index/pending values: beta's due summary is queued."""
    await _beta_due(acl)
    async with ContextStore.from_settings(acl.as_user(ACME_USER), tenant="acme") as acme:
        await acme.append("s", msg("acme"))
    async with acl.client(ACME_USER) as client:
        await HOSTILE_PLANTS[plant](client)
    caplog.set_level(logging.WARNING)
    report = await _sweep_as_worker(acl)
    assert report.queued == 1
    if plant != "pending: junk reservations":
        assert "skipped" in caplog.text  # a hostile value is skipped and logged


@pytest.mark.parametrize(
    ("key", "field", "value"),
    [("meta", "epoch", "x"), ("meta", "sq_at", "soon"), ("meta", "first_id", "zz-top")],
)
async def test_hostile_values_in_a_tenants_own_session_never_stop_the_sweep(
    acl: AclServer, key: str, field: str, value: str
) -> None:
    """Acme's user writes junk into its own session's meta: beta's due summary is still queued."""
    await _beta_due(acl)
    async with ContextStore.from_settings(acl.as_user(ACME_USER), tenant="acme") as acme:
        await acme.append("s", msg("acme"))
    async with acl.client(ACME_USER) as client:
        await client.hset(getattr(session_keys(ACL_PREFIX, "acme", "s"), key), field, value)
    report = await _sweep_as_worker(acl)
    assert report.queued == 1


async def test_two_tenant_user_pods_race_through_the_index_under_functions(acl: AclServer) -> None:
    """Two acme-user pods (FCALL only): create, delete, recreate, lease, refuse, list, forget."""
    await set_limits(acl.settings, "acme", TenantLimits(sessions=2))
    settings = acl.as_user(ACME_USER).model_copy(update={"lease_wait_seconds": 0})
    async with (
        ContextStore.from_settings(settings, tenant="acme") as a,
        ContextStore.from_settings(settings, tenant="acme") as b,
    ):
        await a.append("s", msg("0"))
        with pytest.raises(ConflictError):  # a refused first write gives its reservation back
            await b.append("u", msg("6"), expected_seq=7)
        await b.append("s", msg("1"))
        assert await b.delete("s")
        await a.append("s", msg("2"))  # a knows s: its script asks for a reservation again
        await b.append_many("t", [msg("3"), msg("4")])
        with pytest.raises(QuotaExceededError):
            await a.append("u", msg("5"))
        lease = await a.lease("s")
        with pytest.raises(LeaseHeldError):
            await b.clear("s")
        await a.replace("s", [msg("7")], lease=lease)
        assert await listed(a) == {"s", "t"}
        with contextlib.suppress(CtxstoreError):  # its limits are the operator's
            await b.forget_tenant()
        assert await listed(a) == set()


BETA_S = session_keys(ACL_PREFIX, "beta", "s")
ACME_S = session_keys(ACL_PREFIX, "acme", "s")
RAW_REFUSED: dict[str, Callable[[Redis], Awaitable[Any]]] = {
    "RENAME acme's log onto beta's": lambda c: c.rename(ACME_S.log, BETA_S.log),
    "RENAME beta's log onto acme's": lambda c: c.rename(BETA_S.log, ACME_S.log),
    "XADD to beta's log": lambda c: c.xadd(BETA_S.log, {"m": "{}"}),
    "HSET beta's meta": lambda c: c.hset(BETA_S.meta, "seq", 0),
    "DEL beta's meta": lambda c: c.delete(BETA_S.meta),
    "PEXPIRE beta's log": lambda c: c.pexpire(BETA_S.log, 1),
    "PERSIST beta's gone": lambda c: c.persist(BETA_S.gone),
    "ZADD beta's index": lambda c: c.zadd(tenant_sessions_key(ACL_PREFIX, "beta"), {"x": 1}),
    "ZREM beta's index": lambda c: c.zrem(tenant_sessions_key(ACL_PREFIX, "beta"), "s"),
    "HSET beta's pending": lambda c: c.hset(tenant_pending_keys(ACL_PREFIX, "beta")[0], "s", ""),
    "SADD to the tenants set": lambda c: c.sadd(tenants_key(ACL_PREFIX), "x" * 300, "zz"),
    "SREM the tenants set": lambda c: c.srem(tenants_key(ACL_PREFIX), "beta"),
    "DEL the tenants set": lambda c: c.delete(tenants_key(ACL_PREFIX)),
    "HSET beta's limits": lambda c: c.hset(f"{ACL_PREFIX}:{{beta}}:limits", "limits", "{}"),
    "XRANGE beta's log": lambda c: c.xrange(BETA_S.log),
    "EXISTS beta's meta": lambda c: c.exists(BETA_S.meta),
    "PTTL beta's log": lambda c: c.pttl(BETA_S.log),
    "GET a queue key": lambda c: c.get(f"{ACL_PREFIX}:summaries"),
}


async def test_a_tenant_users_raw_commands_never_touch_another_tenant(acl: AclServer) -> None:
    """Acme's user sends raw commands at beta's, the tenants' and the queue's keys: NOPERM each."""
    async with ContextStore.from_settings(acl.as_user(BETA_USER), tenant="beta") as beta:
        await beta.append("s", msg("beta's"))
        await beta.delete("s")  # a tombstone
        await beta.append("s", msg("beta's again"))
    async with ContextStore.from_settings(acl.as_user(ACME_USER), tenant="acme") as acme:
        await acme.append("s", msg("acme's"))
    async with acl.client() as admin, acl.client(ACME_USER) as client:
        before = await _dump(admin, f"{ACL_PREFIX}:*")
        for what, command in RAW_REFUSED.items():
            with pytest.raises(NoPermissionError):
                await command(client)
            assert await _dump(admin, f"{ACL_PREFIX}:*") == before, what


async def test_a_tenant_users_pods_are_swept_though_no_shared_key_names_them(
    acl: AclServer,
) -> None:
    """Acme's pods write as acme's user, which cannot list acme: the sweep still queues it."""
    async with ContextStore.from_settings(acl.as_user(ACME_USER), tenant="acme") as acme:
        await append_until_due(acme, "long")
    async with acl.client() as admin:
        assert not await admin.sismember(tenants_key(ACL_PREFIX), "acme")
    report = await _sweep_as_worker(acl)
    assert report.queued == 1
