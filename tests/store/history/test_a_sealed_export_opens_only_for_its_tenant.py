"""A sealed export opens only for the tenant that sealed it; checkpoint names are sealed too.

Two tenants of one deployment share its master keys (each tenant's key is
derived from them): whatever a session line says, a sealed value is opened as
the tenant that imports it, so another tenant's export is refused, not read.
With encryption on, a checkpoint's name is sealed like the messages are: Redis
holds none in clear, and an export carries it sealed unless asked in clear.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis.asyncio import Redis
from support.config import BACKENDS
from support.helpers import turn

from ctxstore import (
    ContextStore,
    DecryptionError,
    Keyring,
    LocalSummarizer,
    MalformedArchiveError,
    Settings,
)

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)

NAME = "PLANT-checkpoint-name-5150"


def keyed(settings: Settings) -> Settings:
    """The settings with a master key."""
    key = {"encryption_keys": {"k1": Keyring.generate_key()}, "encryption_active_key": "k1"}
    return Settings(**{**settings.model_dump(), **key})


async def exported(store: ContextStore, session: str, **kwargs: Any) -> list[str]:
    return [line async for line in store.export_session(session, **kwargs)]


async def nothing_of(store: ContextStore, raw: Redis, session: str) -> None:
    """The session does not exist, and no key of it (staged or not) is left."""
    assert not (await store.info(session)).exists
    assert [k async for k in raw.scan_iter(match=f"*{store.tenant}:{session}}}*")] == []


async def test_another_tenants_sealed_export_is_refused(
    summary_settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Tenant B importing A's sealed export: refused at its first sealed line, nothing written."""
    async with ContextStore.from_settings(keyed(summary_settings), tenant=tenant) as a:
        await a.append_many("s", [turn(i) for i in range(20)])
        await a.summarize("s", LocalSummarizer())
        sealed = await exported(a, "s")
        b = a.for_tenant(tenant + "b")
        with pytest.raises(MalformedArchiveError, match="opens only for it") as refused:
            await b.import_sessions(sealed, session="stolen")
        assert refused.value.line == 2
        await nothing_of(b, raw_redis, "stolen")

        # The header rewritten to name B: the seal still binds A (B's key, B's data fail).
        header = {**json.loads(sealed[0]), "tenant": b.tenant}
        with pytest.raises(MalformedArchiveError, match="does not open") as forged:
            await b.import_sessions([json.dumps(header), *sealed[1:]], session="stolen")
        assert forged.value.line == 2
        await nothing_of(b, raw_redis, "stolen")

        # A's own: sealed again for the session it goes to. In clear: B may take it.
        await a.import_sessions(sealed, session="moved")
        assert await a.get_messages("moved") == await a.get_messages("s")
        await b.import_sessions(await exported(a, "s", clear=True), session="given")
        assert await b.get_messages("given") == await a.get_messages("s")


async def test_a_sealed_summary_line_alone_is_refused_across_tenants(
    summary_settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A clear history carrying another tenant's sealed ledger: refused at the summary line."""
    async with ContextStore.from_settings(keyed(summary_settings), tenant=tenant) as a:
        await a.append_many("s", [turn(i) for i in range(20)])
        await a.summarize("s", LocalSummarizer())
        clear = [json.loads(line) for line in await exported(a, "s", clear=True)]
        sealed = [json.loads(line) for line in await exported(a, "s")]
        at = next(i for i, r in enumerate(sealed) if r["ctxstore"] == "summary")
        mixed = [*clear[:at], sealed[at], *clear[at + 1 : -1]]
        end = {k: v for k, v in clear[-1].items() if k != "digest"}
        b = a.for_tenant(tenant + "b")
        with pytest.raises(MalformedArchiveError, match="opens only for it") as refused:
            await b.import_sessions([json.dumps(r) for r in [*mixed, end]], session="stolen")
        assert refused.value.line == at + 1
        await nothing_of(b, raw_redis, "stolen")


async def test_checkpoint_names_are_sealed_at_rest(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Redis holds no name in clear; the API shows it; a keyless store cannot read it."""
    sealed_settings = keyed(settings)
    async with (
        ContextStore.from_settings(sealed_settings, tenant=tenant) as store,
        ContextStore.from_settings(settings, tenant=tenant) as keyless,
    ):
        await store.append_many("s", [turn(i) for i in range(3)])
        made = await store.checkpoint("s", name=NAME)
        assert made.name == NAME
        assert [p.name for p in await store.checkpoints("s")] == [NAME]
        keys = store.keys("s")
        stored = await raw_redis.hgetall(keys.checkpoints)  # type: ignore[misc]
        assert stored and NAME.encode() not in b"".join([*stored.keys(), *stored.values()])
        for key in keys.all():
            if await raw_redis.type(key) == b"hash":
                values = await raw_redis.hgetall(key)  # type: ignore[misc]
                assert NAME.encode() not in b"".join(values.values()), key
        with pytest.raises(DecryptionError):
            await keyless.checkpoints("s")
        assert (await keyless.rewind("s", made.checkpoint_id)).count == 3  # a name plays no part

        lines = await exported(store, "s")
        assert NAME not in "".join(lines)
        assert (await exported(keyless, "s"))[1:] == lines[1:]  # as stored, key or not
        assert NAME in "".join(await exported(store, "s", clear=True))
        await store.import_sessions(lines, session="copy")
        assert [p.name for p in await store.checkpoints("copy")] == [NAME]
        assert await store.delete_checkpoint("copy", "cp-1")


async def test_an_existing_clear_name_reads_after_encryption_is_turned_on(
    settings: Settings, tenant: str
) -> None:
    """A name stored before the keyring was set still reads, and exports, as it was."""
    async with ContextStore.from_settings(settings, tenant=tenant) as before:
        await before.append("s", turn(0))
        await before.checkpoint("s", name="plain")
    async with ContextStore.from_settings(keyed(settings), tenant=tenant) as after:
        assert [p.name for p in await after.checkpoints("s")] == ["plain"]
        lines = [json.loads(line) for line in await exported(after, "s")]
        assert [r.get("name") for r in lines if r["ctxstore"] == "checkpoint"] == ["plain"]
