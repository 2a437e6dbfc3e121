"""The three-pod state machine: one tenant, every write path, the raw keys checked each step.

Test modules run it (or a subclass of it) with ``run_state_machine_as_test``, after
setting its ``base`` settings and ``redis_url``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from redis.asyncio import Redis

from ctxstore import (
    ConflictError,
    ContextStore,
    LeaseHeldError,
    LeaseLostError,
    QuotaExceededError,
    SessionNotFoundError,
    Settings,
    TenantLimits,
)
from ctxstore._layout.keys import tenant_pending_keys, tenant_sessions_key, tenants_key
from ctxstore._redis.scripts import SCRIPTS
from ctxstore._tenant.index import CLOCK_MARGIN_MS
from ctxstore.lease import Lease
from ctxstore.testing import ManualClock, orphans
from support.faults import Action, drop_reply
from support.helpers import msg, paired
from support.tenant import indexed


@dataclass
class _Life:
    """What the pods were told about one session."""

    exists: bool = False
    messages: list[dict[str, Any]] = field(default_factory=list)
    last: tuple[int, int] = (0, 0)  # (epoch, seq) last seen: never goes backwards
    deleted_at: tuple[int, int] | None = None  # a recreate must pass both


SESSIONS = ("a", "b", "c", "d")


class TenantMachine(RuleBasedStateMachine):
    """Three pods on one tenant; after every step the raw keys must agree with what they were told.

    Class attributes are set by the test: the settings and the Redis URL.
    """

    base: ClassVar[Settings]
    redis_url: ClassVar[str]
    steps: ClassVar[int] = 0

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock()
        self.tenant = f"m{uuid.uuid4().hex[:12]}"
        own = self.base.model_copy(
            update={"lease_wait_seconds": 0, "summary_trigger_tokens": 0, "retry_attempts": 2}
        )
        self.settings = own
        self.pods = [
            ContextStore.from_settings(own, tenant=self.tenant, clock=self.clock) for _ in range(3)
        ]
        self.raw = Redis.from_url(self.redis_url)
        self.lives = {s: _Life() for s in SESSIONS}
        self.leases: list[Lease] = []
        self.cap = 0
        self.counter = itertools.count()

    # -- plumbing

    def run(self, coro: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        async def close() -> None:
            for pod in self.pods:
                await pod.aclose()
            prefix = self.settings.key_prefix
            for pattern in (f"{prefix}:{{{self.tenant}:*", f"{prefix}:{{{self.tenant}}}:*"):
                keys = [k async for k in self.raw.scan_iter(match=pattern, count=1_000)]
                if keys:
                    await self.raw.delete(*keys)
            await self.raw.aclose()

        try:
            self.run(close())
        finally:
            self.loop.close()

    def message(self, kind: str) -> list[dict[str, Any]]:
        n = next(self.counter)
        if kind == "system":
            return [msg(f"m{n}", "system")]
        if kind == "exchange":
            call = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call{n}",
                        "type": "function",
                        "function": {"name": "f", "arguments": "{}"},
                    }
                ],
            }
            return [call, {"role": "tool", "tool_call_id": f"call{n}", "content": f"out{n}"}]
        return [msg(f"m{n}")]

    async def base_seq(self, s: str) -> int:
        keys = self.pods[0].keys(s)
        seq = await self.raw.hget(keys.meta, "seq")
        if seq is not None:
            return int(seq)
        gone = await self.raw.get(keys.gone)
        return int(gone.split()[1]) if gone else 0

    async def existing(self) -> set[str]:
        pipe = self.raw.pipeline(transaction=True)
        for s in SESSIONS:
            pipe.hexists(self.pods[0].keys(s).meta, "seq")
        return {s for s, found in zip(SESSIONS, await pipe.execute(), strict=True) if found}

    def expected(self, exp: str, base: int) -> int | None:
        if exp == "none":
            return None
        return base if exp == "current" else base + 1

    def saw(self, s: str, epoch: int, seq: int) -> None:
        life = self.lives[s]
        assert (epoch, seq) >= life.last and seq >= life.last[1], (s, (epoch, seq), life.last)
        if life.deleted_at is not None:
            assert epoch > life.deleted_at[0] and seq > life.deleted_at[1], (s, life.deleted_at)
            life.deleted_at = None
        life.last = (epoch, seq)

    async def live_pending(self) -> set[str]:
        pending, _ = tenant_pending_keys(self.settings.key_prefix, self.tenant)
        now = self.clock.now_ms()
        live = set()
        for session, value in (await self.raw.hgetall(pending)).items():
            deadlines = [int(part.rsplit(b":", 1)[1]) for part in value.split(b",") if b":" in part]
            if any(d >= now - CLOCK_MARGIN_MS for d in deadlines):
                live.add(session.decode())
        return live

    async def write(self, s: str, call: Action, *, creates_if_absent: bool = True) -> Any:
        """Run a write; check a refusal of the sessions quota is not spurious; return the result."""
        before = await self.existing()
        try:
            result = await call()
        except QuotaExceededError as exc:
            if exc.quota == "sessions":
                assert s not in before
                members = await indexed(self.raw, self.pods[0])
                held = (members - before) & await self.live_pending()
                assert len(before) + len(held) >= self.cap > 0, (before, held, self.cap)
            raise
        after = await self.existing()
        if creates_if_absent and s not in before and s in after and self.cap:
            assert len(before) < self.cap, "created a session over the quota"
        return result

    # -- rules

    @rule(
        p=st.integers(0, 2),
        s=st.sampled_from(SESSIONS),
        exp=st.sampled_from(["none", "none", "current", "stale"]),
        kind=st.sampled_from(["plain", "plain", "system", "pinned", "exchange"]),
    )
    def append(self, p: int, s: str, exp: str, kind: str) -> None:
        self.run(self._append(p, s, exp, kind))

    async def _append(self, p: int, s: str, exp: str, kind: str) -> None:
        messages = self.message(kind)
        base = await self.base_seq(s)
        expected_seq = self.expected(exp, base)
        try:
            results = await self.write(
                s,
                lambda: self.pods[p].append_many(
                    s, messages, expected_seq=expected_seq, pinned=kind == "pinned"
                ),
            )
        except ConflictError:
            assert exp == "stale"
            return
        except QuotaExceededError:
            return
        assert exp != "stale"
        assert [r.seq for r in results] == [base + i for i in range(1, len(messages) + 1)]
        life = self.lives[s]
        life.exists = True
        life.messages += messages
        self.saw(s, results[-1].epoch, results[-1].seq)

    @rule(
        p=st.integers(0, 2),
        s=st.sampled_from(SESSIONS),
        n=st.integers(0, 2),
        exp=st.sampled_from(["none", "none", "current", "stale"]),
        with_system=st.booleans(),
    )
    def replace(self, p: int, s: str, n: int, exp: str, with_system: bool) -> None:
        self.run(self._replace(p, s, n, exp, with_system))

    async def _replace(self, p: int, s: str, n: int, exp: str, with_system: bool) -> None:
        messages = [m for _ in range(n) for m in self.message("plain")]
        if with_system:
            messages = self.message("system") + messages
        base = await self.base_seq(s)
        expected_seq = self.expected(exp, base)
        life = self.lives[s]
        try:
            result = await self.write(
                s, lambda: self.pods[p].replace(s, messages, expected_seq=expected_seq)
            )
        except ConflictError:
            assert exp == "stale"
            return
        except (QuotaExceededError, LeaseHeldError):
            return
        assert exp != "stale"
        assert (result.seq, result.count) == (base + 1, len(messages))
        assert result.superseded == (len(life.messages) if life.exists else 0)
        life.exists, life.messages = True, list(messages)
        self.saw(s, result.epoch, result.seq)

    @rule(p=st.integers(0, 2), s=st.sampled_from(SESSIONS))
    def delete(self, p: int, s: str) -> None:
        life = self.lives[s]
        existed = self.run(self.pods[p].delete(s))
        assert existed == life.exists
        if existed:
            life.deleted_at = life.last
        life.exists, life.messages = False, []

    @rule(
        p=st.integers(0, 2), s=st.sampled_from(SESSIONS), which=st.integers(0, 5), pin=st.booleans()
    )
    def pin(self, p: int, s: str, which: int, pin: bool) -> None:
        async def go() -> None:
            rows = await self.raw.xrange(self.pods[0].keys(s).log)
            entry = rows[which % len(rows)][0].decode() if rows else "1-1"
            with contextlib.suppress(QuotaExceededError):
                found = await self.pods[p].pin(s, entry, pin)
                assert found == bool(rows)

        self.run(go())

    @rule(p=st.integers(0, 2), s=st.sampled_from(SESSIONS), ttl=st.floats(0.5, 20))
    def abandon_a_lease(self, p: int, s: str, ttl: float) -> None:
        with contextlib.suppress(LeaseHeldError):
            self.leases.append(self.run(self.pods[p].lease(s, ttl_s=ttl, wait_s=0)))

    @precondition(lambda self: self.leases)
    @rule(which=st.integers(0, 10), n=st.integers(0, 2))
    def write_under_a_held_lease(self, which: int, n: int) -> None:
        lease = self.leases.pop(which % len(self.leases))
        s = lease.session
        pod = next(p for p in self.pods if p._connection is lease._connection)
        messages = [m for _ in range(n) for m in self.message("plain")]
        life = self.lives[s]

        async def go() -> None:
            base = await self.base_seq(s)
            try:
                result = await self.write(s, lambda: pod.replace(s, messages, lease=lease))
            except (LeaseLostError, QuotaExceededError):
                return
            assert result.seq == base + 1
            life.exists, life.messages = True, list(messages)
            self.saw(s, result.epoch, result.seq)

        self.run(go())

    @rule(seconds=st.sampled_from([0.5, 2, 12, 40]))
    def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(
        p=st.integers(0, 2), s=st.sampled_from(SESSIONS), seconds=st.sampled_from([None, 60, 3_600])
    )
    def set_ttl(self, p: int, s: str, seconds: int | None) -> None:
        try:
            self.run(self.pods[p].set_ttl(s, seconds))
        except SessionNotFoundError:
            assert not self.lives[s].exists
        else:
            assert self.lives[s].exists

    @rule(s=st.sampled_from(SESSIONS))
    def expire(self, s: str) -> None:
        """The session's TTL fires (its four keys go, as Redis expires them together)."""
        keys = self.pods[0].keys(s)

        async def go() -> bool:
            if await self.raw.pttl(keys.meta) <= 0 or not self.lives[s].exists:
                return False
            await self.raw.delete(keys.log, keys.meta, keys.keep, keys.view)
            return True

        if self.run(go()):
            self.lives[s] = _Life()  # no tombstone: a new life may start over (pinned elsewhere)

    @rule(p=st.integers(0, 2))
    def list_sessions(self, p: int) -> None:
        rows = self.run(self.pods[p].list_sessions(limit=100))
        assert {r.session for r in rows} == {s for s, life in self.lives.items() if life.exists}

    @rule(p=st.integers(0, 2))
    def forget(self, p: int) -> None:
        count = self.run(self.pods[p].forget_tenant())
        assert count >= sum(life.exists for life in self.lives.values())
        self.lives = {s: _Life() for s in SESSIONS}
        self.cap = 0
        for pod in self.pods:
            pod._quotas.forget()  # the limits went with the tenant (other pods: within 30 s)

    @rule(
        cap=st.sampled_from([0, 1, 2, 3]),
        session_bytes=st.sampled_from([None, 2_000, 20_000]),
        rate=st.sampled_from([None, 20.0]),
    )
    def set_limits(self, cap: int, session_bytes: int | None, rate: float | None) -> None:
        limits = TenantLimits(
            sessions=cap or None,
            session_bytes=session_bytes,
            appends_per_second=rate,
            append_burst=4 if rate else None,
        )
        self.run(self.pods[0].set_limits(limits))
        for pod in self.pods:
            pod._quotas.forget()  # as the 30 s cache would, everywhere
        self.cap = cap

    @rule(p=st.integers(0, 2), s=st.sampled_from(SESSIONS), budget=st.integers(1, 400))
    def view(self, p: int, s: str, budget: int) -> None:
        view = self.run(self.pods[p].view(s, token_budget=budget))
        assert orphans(view.messages) == 0
        paired(view.messages)
        assert view.stats.over_budget or view.stats.tokens <= view.stats.budget_cl100k

    @rule(
        p=st.integers(0, 2),
        s=st.sampled_from(SESSIONS),
        between=st.sampled_from(["nothing", "append", "pin", "replace", "delete"]),
    )
    def append_whose_reply_is_lost(self, p: int, s: str, between: str) -> None:
        other = self.pods[(p + 1) % 3]
        mine = self.message("plain")
        theirs = self.message("plain")
        life = self.lives[s]
        log: list[str] = []

        async def act() -> None:
            life.exists = True  # the append was applied
            life.messages += mine
            if between == "append":
                await other.append(s, theirs[0])
                life.messages += theirs
            elif between == "pin":
                rows = await self.raw.xrange(self.pods[0].keys(s).log, count=1)
                await other.pin(s, rows[0][0].decode())
            elif between == "replace":
                with contextlib.suppress(LeaseHeldError):
                    await other.replace(s, theirs)
                    life.messages = list(theirs)
            elif between == "delete":
                assert await other.delete(s)
                # The append came first: its retry is answered, never written again.
                life.deleted_at = life.last
                life.exists, life.messages = False, []
            log.append(between)

        async def go() -> None:
            with pytest.MonkeyPatch.context() as mp:
                drop_reply(self.pods[p], mp, SCRIPTS.append, act)
                try:
                    await self.write(s, lambda: self.pods[p].append(s, mine[0]))
                except QuotaExceededError:
                    assert not log  # refused before it was applied: nothing written
                    return
            assert log == [between]

        self.run(go())

    # -- invariants

    @invariant()
    def raw_keys_agree(self) -> None:
        type(self).steps += 1
        self.run(self._check())

    async def _check(self) -> None:
        raw, pod = self.raw, self.pods[0]
        pending, due = tenant_pending_keys(self.settings.key_prefix, self.tenant)
        pipe = raw.pipeline(transaction=True)  # one snapshot of everything checked
        for s in SESSIONS:
            keys = pod.keys(s)
            pipe.hgetall(keys.meta)
            pipe.xrange(keys.log)
            pipe.hgetall(keys.keep)
            for key in keys.all():
                pipe.pttl(key)
        pipe.zrange(tenant_sessions_key(self.settings.key_prefix, self.tenant), 0, -1)
        pipe.hkeys(pending)
        pipe.zrange(due, 0, -1)
        pipe.sismember(tenants_key(self.settings.key_prefix), self.tenant)
        replies = iter(await pipe.execute())
        now = set()
        for s in SESSIONS:
            keys = pod.keys(s)
            meta = {k.decode(): v.decode() for k, v in next(replies).items()}
            rows, keep = next(replies), next(replies)
            ttls = {key: next(replies) for key in keys.all()}
            life = self.lives[s]
            assert ("seq" in meta) == life.exists, (s, meta, life)
            if not life.exists:
                assert rows == [] and keep == {}, s
                forever = [key for key, ttl in ttls.items() if ttl == -1]
                assert not forever, f"{forever} last forever, and no quota counts them"
                continue
            now.add(s)
            assert [json.loads(f[b"m"]) for _, f in rows] == life.messages, s
            assert int(meta["count"]) == len(rows)
            assert int(meta["tokens"]) == sum(int(f[b"t"]) for _, f in rows)
            kept = sum(len(v.split(b"\x1e", 4)[4]) for v in keep.values())
            assert int(meta["bytes"]) == sum(len(f[b"m"]) for _, f in rows) + kept, s
            self.saw(s, int(meta.get("epoch", 0)), int(meta["seq"]))
        members = {m.decode() for m in next(replies)}
        assert now <= members, f"exists, not listed: {now - members}"
        holders = {k.decode() for k in next(replies)}
        assert holders <= members
        assert {k.decode() for k in next(replies)} == holders
        registered = next(replies)
        if now:
            assert registered, "the tenant's sessions exist, the sweep does not know the tenant"
