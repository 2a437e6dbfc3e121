"""The least-privilege ACL users of ``ctxstore._tenant.acl``, loaded by a private Redis 7.

Each test renders the users (``render_acl`` or ``ctxstore._tenant.acl``), adds an
admin ``default`` user for the test itself, and starts a redis-server of its
own with ``--aclfile``; then it works as one of the users.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, NoPermissionError
from support.helpers import append_until_due, conversation, turn
from support.servers import PrivateRedis, ServerPool, redis7_binary, run_burst

from ctxstore import (
    ConfigurationError,
    ContextStore,
    ForgetIncompleteError,
    LocalSummarizer,
    PermissionDeniedError,
    Settings,
    TenantLimits,
)
from ctxstore._layout.keys import (
    SessionKeys,
    session_keys,
    tenant_limits_key,
    tenant_sessions_key,
    tenants_key,
)
from ctxstore._redis.scripts import LIBRARY_NAME, SCRIPTS, library
from ctxstore._tenant.acl import POD_USER, WORKER_USER, render_acl, tenant_user_name
from ctxstore.summary_queue import JobState, SummaryQueue, job_id
from workers.sweep import sweep

REDIS7 = redis7_binary()
if REDIS7 is None:
    pytest.skip(
        "needs redis-server >= 7 on PATH: the rendered ACL uses selectors and %R~ key permissions",
        allow_module_level=True,
    )

PREFIX = "ctxacl"
QUEUE = f"{PREFIX}:summaries"
TENANTS = ("acme", "beta")
ACME_USER = tenant_user_name("acme")
BETA_USER = tenant_user_name("beta")
ADMIN = "user default on nopass ~* &* +@all\n"
"""The test's own admin (an ACL file may hold no comments, and ctxstore renders no default)."""
CTXSTORE = str(Path(sys.executable).with_name("ctxstore"))

ACME = session_keys(PREFIX, "acme", "s")
ACME_UNUSED = session_keys(PREFIX, "acme", "unused")
BETA = session_keys(PREFIX, "beta", "s")
ACME_LIMITS = tenant_limits_key(PREFIX, "acme")
TENANTS_SET = tenants_key(PREFIX)
READ_SEQ = "return redis.call('HGET', KEYS[1], 'seq')"


@dataclass
class AclServer:
    """A private Redis that loaded the rendered users, and their passwords."""

    server: PrivateRedis
    settings: Settings
    passwords: dict[str, str]

    def as_user(self, user: str) -> Settings:
        """The settings, connecting as ``user`` (a tenant's user runs the scripts by FCALL)."""
        url = self.server.url(user, self.passwords[user])
        mode = "functions" if user.startswith("ctxstore-t-") else "eval"
        return self.settings.model_copy(update={"redis_url": url, "script_mode": mode})

    @asynccontextmanager
    async def client(self, user: str | None = None) -> AsyncIterator[Redis]:
        """A raw redis-py client as ``user`` (the admin by default)."""
        password = None if user is None else self.passwords[user]
        client = Redis.from_url(self.server.url(user, password))
        try:
            yield client
        finally:
            await client.aclose()


@pytest.fixture
def acl(servers: ServerPool) -> AclServer:
    """A private Redis 7 running the users ``render_acl`` renders for acme and beta."""
    settings = Settings(
        key_prefix=PREFIX,
        queue_name=QUEUE,
        summary_trigger_tokens=400,
        summary_keep_tokens=150,
        worker_name="acl-test-worker",
        retry_attempts=1,
    )
    names = [POD_USER, WORKER_USER, ACME_USER, BETA_USER]
    passwords = {name: secrets.token_urlsafe(16) for name in names}
    server = servers.start(acl=render_acl(settings, TENANTS, passwords) + ADMIN)
    # The operator loads the scripts as Functions: tenants' users may not EVAL.
    loaded = subprocess.run(
        ["redis-cli", "-p", str(server.port), "-x", "FUNCTION", "LOAD", "REPLACE"],
        input=library(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == LIBRARY_NAME, loaded.stdout + loaded.stderr
    return AclServer(server, settings.model_copy(update={"redis_url": server.url()}), passwords)


@pytest.fixture
async def admin(acl: AclServer) -> AsyncIterator[Redis]:
    """A raw client as the test's admin."""
    async with acl.client() as client:
        yield client


async def run_cli(*args: str) -> tuple[int, str]:
    """Run ``ctxstore`` with settings of this module only; its exit status and output."""
    env = {
        "PATH": "/usr/bin:/bin",
        "CTXSTORE_KEY_PREFIX": PREFIX,
        "CTXSTORE_QUEUE_NAME": QUEUE,
    }
    proc = await asyncio.create_subprocess_exec(
        CTXSTORE,
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


def mode(path: Path) -> int:
    """The permission bits of a file."""
    return stat.S_IMODE(path.stat().st_mode)


# -- rendering ---------------------------------------------------------------


async def test_the_cli_writes_owner_only_files_whose_passwords_redis_accepts(
    tmp_path: Path, servers: ServerPool
) -> None:
    """`ctxstore acl` writes 0600 files, one password per user, that a Redis 7 loads and accepts."""
    out, credentials = tmp_path / "users.acl", tmp_path / "credentials.json"
    code, output = await run_cli(
        "acl", "--out", str(out), "--credentials", str(credentials), "--tenant", "acme"
    )
    assert code == 0, output
    assert mode(out) == 0o600
    assert mode(credentials) == 0o600
    passwords = json.loads(credentials.read_text())
    assert set(passwords) == {POD_USER, WORKER_USER, ACME_USER}
    assert len(set(passwords.values())) == 3
    rendered = out.read_text()
    assert sorted(line.split()[1] for line in rendered.splitlines()) == sorted(passwords)
    assert not any(password in rendered for password in passwords.values())  # hashes only

    server = servers.start(acl=rendered + ADMIN)
    for user, password in passwords.items():
        client = Redis.from_url(server.url(user, password))
        try:
            assert await client.ping()
        finally:
            await client.aclose()
    wrong = Redis.from_url(server.url(ACME_USER, passwords[POD_USER]))
    try:
        with pytest.raises(AuthenticationError):
            await wrong.ping()
    finally:
        await wrong.aclose()


async def test_the_cli_makes_existing_output_files_owner_only(tmp_path: Path) -> None:
    """`ctxstore acl` leaves its files 0600 even when they existed with wider permissions."""
    out, credentials = tmp_path / "users.acl", tmp_path / "credentials.json"
    out.write_text("old\n")
    credentials.write_text("{}\n")  # credentials it handed out before: none
    for path in (out, credentials):
        path.chmod(0o644)
    code, output = await run_cli(
        "acl", "--out", str(out), "--credentials", str(credentials), "--tenant", "acme"
    )
    assert code == 0, output
    assert json.loads(credentials.read_text()).keys() == {POD_USER, WORKER_USER, ACME_USER}
    assert (mode(out), mode(credentials)) == (0o600, 0o600)


# -- a tenant's own user -------------------------------------------------------


async def test_a_tenant_user_runs_the_whole_sdk_surface(acl: AclServer, admin: Redis) -> None:
    """As ctxstore-t-acme, every SDK call on acme's sessions works, summaries included."""
    async with ContextStore.from_settings(acl.settings, tenant="acme") as operator:
        await operator.set_limits(TenantLimits(session_tokens=1_000_000))
    history = conversation(10)
    async with ContextStore.from_settings(acl.as_user(ACME_USER), tenant="acme") as store:
        await store.append("chat", history[0])
        rest = await store.append_many("chat", history[1:])
        assert [r.seq for r in rest] == list(range(2, len(history) + 1))
        assert await store.get_messages("chat") == history

        truncated = await store.view("chat", token_budget=300)
        assert truncated.stats.dropped > 0
        assert truncated.messages[0] == history[0]

        outcome = await store.summarize("chat", LocalSummarizer())
        assert outcome.status == "committed"
        info = await store.info("chat")
        assert info.summary_covers == outcome.covers_upto
        system_tokens = (await store.read("chat", limit=1)).messages[0].tokens
        budget = system_tokens + info.summary_tokens + info.tokens_unsummarized
        summarized = await store.view("chat", token_budget=budget)
        assert summarized.stats.summary_used
        assert summarized.messages[1]["content"].startswith("<summary>\n")

        page = await store.read("chat", limit=4)
        assert [s.message for s in page.messages] == history[:4]
        assert page.next_after == page.messages[-1].entry_id
        entry = await store.get_entry("chat", rest[2].entry_id)
        assert entry is not None and entry.message == history[3]
        assert await store.get_entry("chat", "1-0") is None

        assert await store.pin("chat", rest[0].entry_id)
        assert (await store.info("chat")).pinned == (rest[0].entry_id,)
        assert await store.pin("chat", rest[0].entry_id, pinned=False)
        assert (await store.info("chat")).pinned == ()

        await store.set_ttl("chat", 3600)
        assert (await store.info("chat")).ttl_seconds == 3600
        assert 0 < await admin.pttl(store.keys("chat").log) <= 3_600_000
        await store.set_ttl("chat", None)
        assert await admin.pttl(store.keys("chat").log) == -1

        assert await store.limits() == TenantLimits(session_tokens=1_000_000)

        # Checkpoints, a fork that freezes the log into a segment, a rewind into it,
        # its branch, an export and an import: every script and key of the history's.
        point = await store.checkpoint("chat", name="here")
        assert [c.checkpoint_id for c in await store.checkpoints("chat")] == [point.checkpoint_id]
        freezing = acl.as_user(ACME_USER).model_copy(update={"bridge_entries": 3})
        async with ContextStore.from_settings(freezing, tenant="acme") as forker:
            fork = await forker.fork("chat", "chat-fork")
        assert fork.copied == 3 and await store.get_messages("chat-fork") == history
        rewound = await store.rewind("chat-fork", rest[1].entry_id)  # into the segment
        assert await store.get_messages("chat-fork") == history[:3]
        assert rewound.branch is not None
        assert (
            len((await store.read_branch("chat-fork", rewound.branch)).messages) == len(history) - 3
        )
        lines = [line async for line in store.export_session("chat-fork")]
        (imported,) = await store.import_sessions(lines, session="chat-copy")
        assert imported.count == 3
        for session in ("chat-fork", "chat-copy"):
            assert await store.delete(session)
        assert await store.delete_checkpoint("chat", point.checkpoint_id)

        assert [m.message for m in await store.tail("chat", 2)] == history[-2:]
        popped = await store.pop("chat")
        assert popped is not None and popped.message == history[-1]

        replaced = await store.replace("chat", history[:3])
        assert replaced.count == 3
        assert await store.get_messages("chat") == history[:3]
        cleared = await store.clear("chat")
        assert cleared.count == 0
        assert await store.get_messages("chat") == []
        assert (await store.info("chat")).epoch == 3  # the pop, the replace, the clear

        await store.append("other", history[0])
        assert {row.session for row in await store.list_sessions()} == {"chat", "other"}
        assert await store.delete("other")
        assert not (await store.info("other")).exists
        assert {row.session for row in await store.list_sessions()} == {"chat"}


async def test_a_tenant_user_can_forget_its_own_tenant(acl: AclServer, admin: Redis) -> None:
    """As ctxstore-t-acme, forget deletes acme's sessions, then names what it could not delete."""
    async with ContextStore.from_settings(acl.settings, tenant="acme") as operator:
        await operator.set_limits(TenantLimits(sessions=10))
    async with ContextStore.from_settings(acl.as_user(ACME_USER), tenant="acme") as store:
        for session in ("one", "two"):
            await store.append(session, turn(0))
        with pytest.raises(ForgetIncompleteError) as refused:
            await store.forget_tenant()
        assert refused.value.deleted == 2
        assert refused.value.remaining == ("the tenant's limits", "its entry in the tenants set")
        assert isinstance(refused.value.__cause__, PermissionDeniedError)
        assert await store.list_sessions() == []
    assert await admin.exists(tenant_limits_key(PREFIX, "acme"))
    keys = [k.decode() async for k in admin.scan_iter(match=f"{PREFIX}:{{acme:*")]
    assert keys == []
    assert not await admin.exists(tenant_sessions_key(PREFIX, "acme"))


# -- what a tenant's user may not do ----------------------------------------------


def ttl_keys(keys: SessionKeys) -> tuple[str, str, str, str]:
    """set_ttl.lua's KEYS for a session."""
    return keys.log, keys.meta, keys.keep, keys.view


async def _subscribe(client: Redis) -> Any:
    pubsub = client.pubsub()
    try:
        await pubsub.subscribe(f"{PREFIX}:events")
        return await pubsub.get_message(timeout=5)  # the refusal, or the confirmation
    finally:
        await pubsub.aclose()


Call = Callable[[Redis], Awaitable[Any]]

REFUSED: list[tuple[str, Call, Call | None]] = [
    # (what, the refused call, the same kind of call on acme's own keys, which works)
    ("GET beta's key", lambda c: c.get(BETA.meta), None),
    ("XRANGE beta's log", lambda c: c.xrange(BETA.log), lambda c: c.xrange(ACME.log)),
    ("HGETALL beta's meta", lambda c: c.hgetall(BETA.meta), lambda c: c.hgetall(ACME.meta)),
    ("EVAL of its own", lambda c: c.eval(READ_SEQ, 1, ACME.meta), None),
    ("EVALSHA of a ctxstore script", lambda c: c.evalsha(SCRIPTS.set_ttl.sha, 0), None),
    (
        "FCALL set_ttl on beta's keys",
        lambda c: c.fcall(SCRIPTS.set_ttl.function, 4, *ttl_keys(BETA), 0),
        lambda c: c.fcall(SCRIPTS.set_ttl.function, 4, *ttl_keys(ACME_UNUSED), 0),
    ),
    ("KEYS", lambda c: c.keys("*"), None),
    ("SCAN", lambda c: c.scan(0), None),
    ("RANDOMKEY", lambda c: c.randomkey(), None),
    ("DBSIZE", lambda c: c.dbsize(), None),
    ("SCRIPT LOAD", lambda c: c.script_load("return 1"), None),
    ("SCRIPT FLUSH", lambda c: c.script_flush(), None),
    ("SCRIPT EXISTS", lambda c: c.script_exists(SCRIPTS.set_ttl.sha), None),
    ("FUNCTION LIST", lambda c: c.function_list(), None),
    ("FUNCTION FLUSH", lambda c: c.function_flush(), None),
    ("FLUSHALL", lambda c: c.flushall(), None),
    ("FLUSHDB", lambda c: c.flushdb(), None),
    ("CONFIG GET", lambda c: c.config_get("*"), None),
    ("INFO", lambda c: c.info(), None),
    (
        "HSET its own limits",
        lambda c: c.hset(ACME_LIMITS, "limits", "{}"),
        lambda c: c.hgetall(ACME_LIMITS),
    ),
    ("SMEMBERS the tenants set", lambda c: c.smembers(TENANTS_SET), None),
    ("SADD to the tenants set", lambda c: c.sadd(TENANTS_SET, "acme"), None),
    ("PUBLISH", lambda c: c.publish(f"{PREFIX}:events", "x"), None),
    ("SUBSCRIBE", _subscribe, None),
]


@pytest.fixture
async def seeded(acl: AclServer, admin: Redis) -> None:
    """Session ``s`` of acme and of beta (each written by its own user), limits, scripts loaded."""
    for tenant, user in (("acme", ACME_USER), ("beta", BETA_USER)):
        async with ContextStore.from_settings(acl.as_user(user), tenant=tenant) as store:
            await store.append("s", turn(0))
    async with ContextStore.from_settings(acl.settings, tenant="acme") as operator:
        await operator.set_limits(TenantLimits(sessions=5))
    await admin.script_load(SCRIPTS.set_ttl.source)  # so EVALSHA would find it


async def _state(admin: Redis) -> tuple[Any, ...]:
    """What a refused command must leave as it was."""
    return (
        await admin.dbsize(),
        await admin.xlen(BETA.log),
        await admin.hgetall(ACME_LIMITS),
        await admin.smembers(TENANTS_SET),
        await admin.script_exists(SCRIPTS.set_ttl.sha),
    )


@pytest.mark.usefixtures("seeded")
@pytest.mark.parametrize(
    ("refused", "allowed"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
async def test_a_tenant_user_is_refused(
    acl: AclServer, admin: Redis, refused: Call, allowed: Call | None
) -> None:
    """As ctxstore-t-acme, this command gets NOPERM and changes nothing; on acme's keys it works."""
    before = await _state(admin)
    async with acl.client(ACME_USER) as client:
        with pytest.raises(NoPermissionError):
            await refused(client)
        if allowed is not None:
            await allowed(client)
    assert await _state(admin) == before


@pytest.mark.usefixtures("seeded")
async def test_a_tenant_users_scripts_reach_only_its_own_keys(acl: AclServer, admin: Redis) -> None:
    """A tenant user runs no script of its own, and the project's only on its own keys."""
    before = await admin.hgetall(BETA.meta)
    async with acl.client(ACME_USER) as client:
        with pytest.raises(NoPermissionError):  # no script of its own, whatever it declares
            await client.eval(
                "redis.call('HSET', KEYS[1], 'x', 1) "
                f"return redis.call('HSET', '{BETA.meta}', 'x', 1)",
                1,
                ACME.meta,
            )
        with pytest.raises(NoPermissionError):  # declared: refused before the function runs
            await client.fcall(SCRIPTS.pin.function, 3, ACME.log, ACME.keep, BETA.meta, "1-0", "1")
    assert await admin.hgetall(BETA.meta) == before


# -- the pods' and the workers' users ------------------------------------------


async def test_the_pod_user_serves_both_tenants_and_queues_due_summaries(
    acl: AclServer, admin: Redis
) -> None:
    """As ctxstore-pod, the SDK works for acme and beta, and a due summary lands in the queue."""
    jobs = set()
    for tenant in TENANTS:
        async with ContextStore.from_settings(acl.as_user(POD_USER), tenant=tenant) as store:
            await store.append_many("s", [turn(i) for i in range(3)])
            assert [m["content"] for m in await store.get_messages("s")] == [
                turn(i)["content"] for i in range(3)
            ]
            assert (await store.view("s", token_budget=60)).stats.dropped > 0
            assert (await store.replace("s", [turn(9)])).count == 1
            await store.set_ttl("s", 600)
            assert (await store.info("s")).ttl_seconds == 600
            await append_until_due(store, "long")
            assert {r.session for r in await store.list_sessions()} == {"s", "long"}
            assert (await store.info("long")).summary_generation > 0
            # The truncating view of "s" queued one too (no summary yet, enough to cover).
            for session in ("s", "long"):
                gen = (await store.info(session)).summary_generation
                if gen:
                    jobs.add(job_id(acl.settings, tenant, session, gen))
    queued = {m.decode() for m in await admin.zrange(QUEUE, 0, -1)}
    assert queued == jobs


async def test_the_worker_user_starts_a_burst_worker_though_info_and_dbsize_are_refused(
    acl: AclServer, caplog: pytest.LogCaptureFixture
) -> None:
    """As ctxstore-worker, INFO and DBSIZE are refused; arq skips its start-up log; it runs."""
    caplog.set_level(logging.INFO, logger="ctxstore.worker")
    async with acl.client(WORKER_USER) as client:
        with pytest.raises(NoPermissionError):
            await client.info()
        with pytest.raises(NoPermissionError):
            await client.dbsize()
    worker = await run_burst(acl.as_user(WORKER_USER), LocalSummarizer())
    assert (worker.jobs_complete, worker.jobs_failed) == (0, 0)
    assert "not logging the queue's Redis info" in caplog.text
    assert "worker acl-test-worker up" in caplog.text


async def test_the_worker_user_runs_a_queued_job_and_commits(acl: AclServer, admin: Redis) -> None:
    """As ctxstore-worker, a burst worker runs the job a pod queued and commits the summary."""
    async with ContextStore.from_settings(acl.as_user(POD_USER), tenant="acme") as pod:
        await append_until_due(pod, "long")
    assert await admin.zcard(QUEUE) == 1
    worker = await run_burst(acl.as_user(WORKER_USER), LocalSummarizer())
    assert (worker.jobs_complete, worker.jobs_failed) == (1, 0)
    async with ContextStore.from_settings(acl.settings, tenant="acme") as store:
        info = await store.info("long")
    assert info.summary_runs == 1
    assert info.summary_covers is not None
    assert not info.summary_due


async def test_the_sweep_as_the_worker_user_queues_what_a_tenant_user_could_not(
    acl: AclServer, admin: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A tenant user may not queue its due summary; the sweep, as ctxstore-worker, does."""
    caplog.set_level(logging.INFO, logger="ctxstore.summary_queue")
    async with ContextStore.from_settings(acl.as_user(BETA_USER), tenant="beta") as store:
        await append_until_due(store, "long")
    assert "may not queue summaries" in caplog.text
    assert await admin.zcard(QUEUE) == 0

    settings = acl.as_user(WORKER_USER)
    queue = await SummaryQueue.connect(settings)
    try:
        async with ContextStore.from_settings(settings) as base:
            report = await sweep(base, queue, grace_seconds=0)
            gen = (await base.for_tenant("beta").info("long")).summary_generation
        assert (report.sessions, report.queued, report.waiting) == (1, 1, 0)
        assert await queue.status("beta", "long", gen) == JobState.QUEUED
    finally:
        await queue.aclose()
    assert [m.decode() for m in await admin.zrange(QUEUE, 0, -1)] == [
        job_id(acl.settings, "beta", "long", gen)
    ]


# -- one tenant cannot stall the others ----------------------------------------------------------


async def test_hostile_entries_a_tenant_user_can_write_never_stop_the_sweep_for_others(
    acl: AclServer, admin: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Acme's user may not touch the tenants set; bad index members do not stop beta's job."""
    async with ContextStore.from_settings(acl.as_user(BETA_USER), tenant="beta") as store:
        await append_until_due(store, "long")
    assert await admin.zcard(QUEUE) == 0  # beta's own user may not queue it
    async with acl.client(ACME_USER) as client:
        with pytest.raises(NoPermissionError):  # no key shared with other tenants
            await client.sadd(TENANTS_SET, "../../etc", "bad{tenant", "x" * 300, "acme")
        index = tenant_sessions_key(PREFIX, "acme")
        await client.zadd(index, {"bad{member": 1, "at-infinity": float("inf")})
        await client.zadd(index, {"before-time": float("-inf"), "s" * 200: 5})
    caplog.set_level(logging.WARNING, logger="ctxstore.worker")
    settings = acl.as_user(WORKER_USER)
    queue = await SummaryQueue.connect(settings)
    try:
        async with ContextStore.from_settings(settings, tenant="beta") as base:
            report = await sweep(base, queue, grace_seconds=0)
    finally:
        await queue.aclose()
    assert report.queued == 1
    assert await admin.zcard(QUEUE) == 1
    assert "skipped" in caplog.text


async def test_a_tenant_user_may_run_no_script_of_its_own(acl: AclServer) -> None:
    """No EVAL, EVALSHA or SCRIPT for a tenant user: it cannot block the server with a script."""
    async with acl.client(ACME_USER) as client:
        with pytest.raises(NoPermissionError):
            await client.eval("return 1", 0)
        with pytest.raises(NoPermissionError):
            await client.evalsha(SCRIPTS.set_ttl.sha, 4, *ttl_keys(ACME_UNUSED), 0)
        with pytest.raises(NoPermissionError):
            await client.execute_command("FUNCTION", "LOAD", "#!lua name=x\n")


async def test_a_tenant_user_runs_the_library_by_default_and_is_told_when_it_is_gone(
    acl: AclServer, admin: Redis
) -> None:
    """script_mode auto (the default) as a tenant's user: FCALL.

    Once the library is deleted, a ConfigurationError naming the load (it may not fall
    back to EVALSHA), and nothing written.
    """
    settings = acl.as_user(ACME_USER).model_copy(update={"script_mode": "auto"})
    async with ContextStore.from_settings(settings, tenant="acme") as store:
        assert (await store.append("auto", turn(0))).seq == 1
    await admin.execute_command("FUNCTION", "DELETE", LIBRARY_NAME)
    try:
        async with ContextStore.from_settings(settings, tenant="acme") as store:
            with pytest.raises(
                ConfigurationError, match=r"neither by FCALL .* nor by EVALSHA.*functions load"
            ):
                await store.append("auto", turn(1))
            assert (await store.info("auto")).count == 1
            # Loaded again: the same store's next call goes by FCALL, not by EVALSHA (refused).
            await admin.execute_command("FUNCTION", "LOAD", "REPLACE", library())
            assert (await store.append("auto", turn(1))).seq == 2
    finally:
        await admin.execute_command("FUNCTION", "LOAD", "REPLACE", library())
