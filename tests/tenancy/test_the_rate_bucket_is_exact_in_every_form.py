"""The append rate's bucket is exact in every form and script, and a refusal writes nothing.

The bucket, 'rl_tokens' and 'rl_at', is read and written in the append's one HMGET and
one HSET: each message and each other write takes one token, whichever form (lean or
full) or script (append, pin, checkpoint, pop) takes it, an older pod's script shares it
exactly, edited values (fractional, exponents) read back as written, a refusal leaves
every key as it was, and a delete's tombstone keeps the bucket for the next life.

Time is never slept through: the bucket's clock is moved by editing 'rl_at'.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from support.append_forms import FULL, LEAN_LIMITED, force_full, sent
from support.config import BACKENDS, REPO
from support.expiry import now_ms, states, together
from support.helpers import turn

from ctxstore import ContextStore, QuotaExceededError, Settings, TenantLimits
from ctxstore._redis.scripts import SCRIPTS, _used


async def full_append(pod: ContextStore, session: str, message: dict[str, Any]) -> Any:
    force_full(pod, session)
    return await pod.append(session, message)


def rated(settings: Settings, burst: int, rate: float = 0.001) -> Settings:
    return settings.model_copy(update={"appends_per_second": rate, "append_burst": burst})


async def bucket(raw: Redis, pod: ContextStore, session: str) -> tuple[float, int]:
    tokens, at = await raw.hmget(pod.keys(session).meta, ["rl_tokens", "rl_at"])  # type: ignore[misc]
    return float(tokens), int(at)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_each_message_and_each_other_write_takes_one_token_whichever_script_or_form(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Each message, and each other write, takes one token, whichever script or form.

    Burst 7: creation (full), lean, full, a batch of 2 (lean), a pin and a checkpoint
    take the 7 tokens, each script its own. Then an append (lean or full) and a pop are
    refused, leaving the session's keys as they were (the bucket's two fields included).
    """
    async with ContextStore.from_settings(rated(settings, 7), tenant=tenant) as pod:
        runs = sent(pod)
        first = await pod.append("s", turn(0))  # 6 left
        runs.clear()  # (on a cluster, the node's first may be EVALSHA then EVAL)
        await pod.append("s", turn(1))  # 5
        force_full(pod, "s")
        await pod.append("s", turn(2))  # 4
        await pod.append_many("s", [turn(3), turn(4)])  # 2
        assert runs == [LEAN_LIMITED, FULL, LEAN_LIMITED], runs
        assert (await bucket(raw_redis, pod, "s"))[0] == pytest.approx(2, abs=0.01)
        assert await pod.pin("s", first.entry_id)  # 1
        await pod.checkpoint("s")  # 0
        tokens, _ = await bucket(raw_redis, pod, "s")
        assert tokens == pytest.approx(0, abs=0.01)
        before = await states(raw_redis, pod, "s")
        attempts: dict[str, Callable[[], Awaitable[Any]]] = {
            "lean": lambda: pod.append("s", turn(9)),
            "full": lambda: full_append(pod, "s", turn(9)),
            "pop": lambda: pod.pop("s"),
        }
        for attempt, write in attempts.items():
            with pytest.raises(QuotaExceededError) as refused:
                await write()
            assert refused.value.quota == "appends_per_second"
            assert await states(raw_redis, pod, "s") == before, attempt
        assert (await pod.info("s")).count == 5


@pytest.mark.parametrize("form", ["lean", "full"])
@pytest.mark.parametrize(
    ("stored", "allowed"),
    [
        ("0.999", False),
        ("9.99e-1", False),
        ("1", True),
        ("1e0", True),
        ("1.0000000000000002", True),
    ],
)
async def test_the_bucket_boundary_is_exact_for_edited_values(
    settings: Settings, tenant: str, raw_redis: Redis, form: str, stored: str, allowed: bool
) -> None:
    """The bucket boundary is exact for edited values.

    rl_tokens as another writer may have left it (fraction, exponent), rl_at now, a
    rate of 1e-6/s: an append needs a whole token. Refused: nothing written, the value
    short ~1 - stored. Allowed: the bucket left at stored - 1 and its clock moved on.
    """
    async with ContextStore.from_settings(rated(settings, 5, 1e-6), tenant=tenant) as pod:
        await pod.append("s", turn(0))
        meta = pod.keys("s").meta
        at = await now_ms(raw_redis)
        await raw_redis.hset(meta, mapping={"rl_tokens": stored, "rl_at": at})  # type: ignore[misc]
        before = await states(raw_redis, pod, "s")
        if form == "full":
            force_full(pod, "s")
        if not allowed:
            with pytest.raises(QuotaExceededError) as refused:
                await pod.append("s", turn(1))
            assert refused.value.value == pytest.approx(1 - float(stored), abs=1e-4)
            assert await states(raw_redis, pod, "s") == before
            return
        await pod.append("s", turn(1))
        tokens, new_at = await bucket(raw_redis, pod, "s")
        assert tokens == pytest.approx(float(stored) - 1, abs=1e-4) and tokens >= 0
        assert new_at >= at


async def test_a_fractional_rate_keeps_a_fraction_that_later_writes_read_back(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A fractional rate keeps a fraction that later writes read back.

    Rate 2.5/s, burst 2: with the bucket's clock moved back 300 ms after each take, each
    append refills 0.75, plus what the server's clock moved on meanwhile (read back from
    the bucket's own time), and takes 1: 1 -> 0.75 -> 0.5 -> 0.25 -> 0, as the calls
    take no time. The fraction is stored as a float Redis and Python read alike.
    """
    async with ContextStore.from_settings(rated(settings, 2, 2.5), tenant=tenant) as pod:
        await pod.append("s", turn(0))
        meta = pod.keys("s").meta
        tokens, at = await bucket(raw_redis, pod, "s")
        assert tokens == pytest.approx(1.0, abs=0.05)
        for i in range(1, 5):
            await raw_redis.hset(meta, "rl_at", at - 300)  # type: ignore[misc,arg-type]
            if i % 2:
                force_full(pod, "s")
            await pod.append("s", turn(i))
            before, moved_to = tokens, at - 300
            tokens, at = await bucket(raw_redis, pod, "s")
            expected = min(2.0, before + (at - moved_to) * 2.5 / 1000) - 1
            assert tokens == pytest.approx(expected, abs=1e-9), i
            assert at - moved_to >= 300
        raw = await raw_redis.hget(meta, "rl_tokens")  # type: ignore[misc]
        assert float(raw) == tokens  # type: ignore[arg-type]


RATE_COMMIT = "ddbcc24"
"""A commit whose append.lua is an older pod's: it takes the rate with its own HMGET/HSET."""


def _shown(commit: str, name: str) -> bytes:
    """ctxstore/scripts/``name`` at ``commit`` (the test skips where the checkout lacks it)."""
    try:
        return subprocess.check_output(
            ["git", "show", f"{commit}:ctxstore/scripts/{name}"], cwd=REPO, stderr=subprocess.PIPE
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"the older script is not in this checkout: {exc}")


def _script_at(commit: str) -> tuple[str, bytes]:
    """append.lua at ``commit`` behind what it uses of that commit's _lib.lua.

    Not ``support.append_forms.old_append``: its ``OLD_COMMIT`` predates the lean form
    carrying the limits, which a pod under a rate quota sends.
    """
    body = _shown(commit, "append.lua")
    source = _used(_shown(commit, "_lib.lua"), body) + body
    return hashlib.sha1(source).hexdigest(), source


def older_every_other(pod: ContextStore, commit: str) -> list[bool]:
    """Send every other append of ``pod`` to the append script of ``commit``; which went."""
    sha, source = _script_at(commit)
    assert b"rate_taken" not in source and b"take_rate" in source
    names = {SCRIPTS.append.sha, SCRIPTS.append.source}
    real = pod._connection.node_call
    older: list[bool] = []
    turn_old = [False]

    async def node_call(key: str, commands: Any, **kwargs: Any) -> Any:
        first = commands[0]
        if first[0] in ("EVALSHA", "EVAL") and first[1] in names:
            if first[0] == "EVALSHA":  # a new call (EVAL follows its NOSCRIPT)
                turn_old[0] = not turn_old[0]
            if turn_old[0]:
                name = sha if first[0] == "EVALSHA" else source
                commands = [(first[0], name, *first[2:]), *commands[1:]]
            older.append(turn_old[0])
        return await real(key, commands, **kwargs)

    pod._connection.node_call = node_call  # type: ignore[method-assign]
    return older


async def test_an_older_pods_append_shares_the_bucket_exactly(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """An older pod's append shares the bucket exactly.

    Appends alternate between an older pod's script (``RATE_COMMIT``: take_rate's own
    HMGET/HSET) and this one: burst 6, six appends, six tokens; the seventh is refused by either.
    """
    async with ContextStore.from_settings(rated(settings, 6), tenant=tenant) as pod:
        await pod.append("s", turn(0))  # created by this script
        older = older_every_other(pod, RATE_COMMIT)
        for i in range(1, 6):
            if i % 3 == 0:
                force_full(pod, "s")
            await pod.append("s", turn(i))
        assert True in older and False in older
        assert (await bucket(raw_redis, pod, "s"))[0] == pytest.approx(0, abs=0.01)
        before = await states(raw_redis, pod, "s")
        for _ in range(2):
            with pytest.raises(QuotaExceededError):
                await pod.append("s", turn(9))
        assert await states(raw_redis, pod, "s") == before
        assert (await pod.info("s")).count == 6


async def test_a_bucket_emptied_before_a_delete_stays_empty_after_it(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A bucket emptied before a delete stays empty after it.

    Burst 3, rate 1e-6/s: three appends (lean and full), a delete, and the new life's
    first append is refused (the tombstone carried the empty bucket), nothing written.
    """
    async with ContextStore.from_settings(rated(settings, 3, 1e-6), tenant=tenant) as pod:
        await pod.append("s", turn(0))
        await pod.append("s", turn(1))
        force_full(pod, "s")
        await pod.append("s", turn(2))
        assert await pod.delete("s")
        tomb = (await raw_redis.get(pod.keys("s").gone)).split()  # type: ignore[union-attr]
        assert len(tomb) == 4 and float(tomb[2]) == pytest.approx(0, abs=1e-3)
        with pytest.raises(QuotaExceededError):
            await pod.append("s", turn(3))
        assert not await raw_redis.exists(pod.keys("s").meta)
        assert await raw_redis.exists(pod.keys("s").gone)


async def test_a_delete_does_not_round_the_bucket_up(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A delete does not round the bucket up.

    0.9996 tokens (rate 1e-6/s): an append is refused; deleted, the new life's first
    append is refused too ("a delete does not refill it"): the tombstone keeps the
    bucket rounded down to 0.999, not '%.3f''s 1.000.
    """
    async with ContextStore.from_settings(rated(settings, 3, 1e-6), tenant=tenant) as pod:
        await pod.append("s", turn(0))
        meta = pod.keys("s").meta
        at = await now_ms(raw_redis)
        await raw_redis.hset(meta, mapping={"rl_tokens": "0.9996", "rl_at": at})  # type: ignore[misc]
        with pytest.raises(QuotaExceededError):
            await pod.append("s", turn(1))
        assert await pod.delete("s")
        tomb = (await raw_redis.get(pod.keys("s").gone)).split()  # type: ignore[union-attr]
        assert tomb[2] == b"0.999", tomb
        with pytest.raises(QuotaExceededError):
            await pod.append("s", turn(1))


async def test_a_duplicate_retry_over_an_empty_bucket_takes_the_removed_ttl_away(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A duplicate retry over an empty bucket takes the removed ttl away.

    TTL removed, bucket empty: a retry of the last call (its idempotency key) is no
    write, so it is answered (no quota refusal), takes no token and PERSISTs the keys.
    """
    async with ContextStore.from_settings(settings, tenant=tenant) as pod:
        await pod.set_limits(
            TenantLimits(ttl_seconds=600, appends_per_second=0.001, append_burst=2)
        )
        await pod.append("s", turn(0))
        await pod.append("s", turn(1), idempotency_key="k")
        await pod.set_limits(TenantLimits(appends_per_second=0.001, append_burst=2))
        before = await bucket(raw_redis, pod, "s")
        again = await pod.append("s", turn(1), idempotency_key="k")
        assert again.duplicate and again.seq == 2
        assert await bucket(raw_redis, pod, "s") == before
        assert await together(raw_redis, pod, "s") == -1
