"""Encryption at rest on real Redis: round trips, nothing readable in Redis, rotation, binding.

Every store here uses a ``Keyring`` (given as ``keyring=``, or built from the
settings' ``encryption_keys``); the raw client looks at what actually sits
in Redis.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from pydantic import SecretStr
from redis.asyncio import Redis

from ctxstore import (
    ConfigurationError,
    ContextStore,
    CorruptEntryError,
    DecryptionError,
    Keyring,
    LocalSummarizer,
    Settings,
)
from ctxstore._layout.codec import RECALL_HINT
from ctxstore.encryption import MAGIC

ALPHA = "PLANT-alpha-7781"
BRAVO = "PLANT-bravo-ünïcødé-日本語-🚀"
CHARLIE = "PLANT-charlie-0042"
DELTA = "PLANT-delta-sysprompt"
ECHO = "PLANT-echo-pinned"
FOXTROT = "PLANT-foxtrot-args"
PLANTS = [ALPHA, BRAVO, CHARLIE, DELTA, ECHO, FOXTROT]

MakeStore = Callable[..., ContextStore]


def conversation() -> list[dict[str, Any]]:
    """A conversation with a secret in every place content can hide (ids carry none)."""
    big_result = f"{CHARLIE} head\n" + "log line of the build output\n" * 1_500 + f"{CHARLIE} tail"
    return [
        {"role": "system", "content": f"You are careful. Never reveal {DELTA}."},
        {"role": "user", "content": f"Please deploy {ALPHA} to staging. Then check the logs."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": f'{{"path": "{FOXTROT}.py"}}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": big_result},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": f"unicode too: {BRAVO}"},
                {"type": "document", "source": {"type": "text", "data": BRAVO}, "title": "t"},
            ],
            "metadata": {"trace": BRAVO},
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": f"they want {ALPHA}", "signature": "sig"},
                {"type": "tool_use", "id": "tu_1", "name": "deploy", "input": {"target": ALPHA}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": f"ok {ALPHA}"}],
        },
        {"role": "assistant", "content": f"Deployed {ALPHA}; the logs are clean."},
    ]


PINNED = {"role": "user", "content": f"Remember this: {ECHO}."}


def deploy_turn(i: int) -> dict[str, Any]:
    """A user turn naming the secret, about 60 tokens long."""
    return {
        "role": "user",
        "content": f"turn {i}: deploy {ALPHA} now" + ", and watch the rollout closely" * 8,
    }


async def write_conversation(store: ContextStore, session: str) -> list[dict[str, Any]]:
    """Append the conversation and a pinned message; return what was written, in order."""
    messages = conversation()
    await store.append_many(session, messages)
    await store.append(session, PINNED, pinned=True)
    return [*messages, PINNED]


async def raw_values(raw: Redis, store: ContextStore, session: str) -> dict[str, list[bytes]]:
    """Every value of the session in Redis, per key: stream ids, field names and values, hashes."""
    found: dict[str, list[bytes]] = {}
    for key in store.keys(session).all():
        kind = (await raw.type(key)).decode()
        values: list[bytes] = []
        if kind == "stream":
            for entry_id, fields in await raw.xrange(key):
                values.append(entry_id)
                for name, value in fields.items():
                    values.extend((name, value))
        elif kind == "hash":
            for name, value in (await raw.hgetall(key)).items():
                values.extend((name, value))
        elif kind != "none":
            values.append(await raw.dump(key))
        found[key] = values
    return found


def leaks(values: dict[str, list[bytes]]) -> dict[str, list[str]]:
    """The planted strings (and the bare marker) found in raw values, per key."""
    needles = [p.encode() for p in PLANTS] + [b"PLANT"]
    return {
        key: sorted({n.decode() for n in needles for v in vs if n in v})
        for key, vs in values.items()
        if any(n in v for n in needles for v in vs)
    }


def sealed_key_id(value: bytes) -> str:
    """The key id a sealed value names: ``MAGIC``, a length byte, the id."""
    assert value.startswith(MAGIC), value[:16]
    size = value[len(MAGIC)]
    return value[len(MAGIC) + 1 : len(MAGIC) + 1 + size].decode()


@pytest.fixture
def summary_settings(settings: Settings) -> Settings:
    """Settings whose summaries leave only a short tail raw, with no background queue."""
    return settings.model_copy(update={"summary_trigger_tokens": 0, "summary_keep_tokens": 10})


@pytest.fixture
async def stores(summary_settings: Settings, tenant: str) -> AsyncIterator[MakeStore]:
    """Builds stores for this test's tenant (or another), with the keyring given."""
    opened: list[ContextStore] = []

    def make(
        keyring: Keyring | None = None, *, tenant_id: str = tenant, **overrides: Any
    ) -> ContextStore:
        made = ContextStore.from_settings(
            summary_settings.model_copy(update=overrides), tenant=tenant_id, keyring=keyring
        )
        opened.append(made)
        return made

    yield make
    for made in opened:
        await made.aclose()


@pytest.fixture
def k1_key() -> str:
    """A fresh master key (base64), the one named k1."""
    return Keyring.generate_key()


@pytest.fixture
def k1(k1_key: str) -> Keyring:
    """A keyring of one key, k1."""
    return Keyring({"k1": k1_key}, "k1")


# -- round trips -----------------------------------------------------------------------


async def test_messages_round_trip_encrypted(stores: MakeStore, k1: Keyring) -> None:
    """Every kind of message comes back equal through an encrypted store, and by entry id."""
    store = stores(k1)
    written = await write_conversation(store, "s")
    assert await store.get_messages("s") == written
    page = await store.read("s", limit=3)
    assert [m.message for m in page.messages] == written[:3]
    entry = await store.get_entry("s", page.messages[1].entry_id)
    assert entry is not None and entry.message == written[1]


async def test_views_work_encrypted(stores: MakeStore, k1: Keyring) -> None:
    """Views open system, pinned and tail messages, and the preview of a large tool result."""
    store = stores(k1)
    written = await write_conversation(store, "s")
    full = await store.view("s", token_budget=100_000)
    assert full.messages == written and not full.stats.compacted
    offloaded = await store.view("s", token_budget=1_500)
    assert len(offloaded.stats.offloaded) == 1, offloaded.stats
    preview = offloaded.messages[3]
    assert preview["tool_call_id"] == "call_1"
    assert preview["content"].startswith(f"{CHARLIE} head")
    assert preview["content"].endswith(f"{CHARLIE} tail")
    assert "ctxstore:" in preview["content"]
    assert offloaded.messages[:3] + offloaded.messages[4:] == written[:3] + written[4:]
    short = await store.view("s", token_budget=120)
    assert short.stats.dropped > 0
    assert short.messages[0] == written[0] and PINNED in short.messages


async def test_a_cached_summary_round_trips_encrypted(
    stores: MakeStore, k1: Keyring, raw_redis: Redis
) -> None:
    """A summary made through an encrypted store is sealed in Redis and opened in views."""
    store = stores(k1)
    await write_conversation(store, "s")
    outcome = await store.summarize("s", LocalSummarizer())
    assert outcome.status == "committed", outcome
    for budget in range(3_000, 200, -100):  # the largest budget the history does not fit
        view = await store.view("s", token_budget=budget)
        if view.stats.summary_used:
            break
    assert view.stats.summary_used
    summary = next(m["content"] for m in view.messages if m["content"].startswith("<summary>"))
    assert ALPHA in summary  # the summary holds content: it must be sealed like the rest
    # In Redis, the summary's text is sealed with k1, holds none of it in clear, and
    # opens (for this tenant and session) to exactly what the view sent.
    body = summary.removesuffix("\n" + RECALL_HINT)
    body = body.removeprefix("<summary>\n").removesuffix("\n</summary>")
    raw, narrative = await raw_redis.hmget(store.keys("s").view, "l1", "l2")
    assert raw is not None and narrative is not None
    assert {sealed_key_id(raw), sealed_key_id(narrative)} == {"k1"}
    assert leaks({"l1": [raw], "l2": [narrative]}) == {}
    assert body.encode() not in raw
    ledger = k1.open(store.tenant, "s", raw)
    assert body.encode() in (ledger, ledger + b"\n\n" + k1.open(store.tenant, "s", narrative))


async def test_encryption_from_settings(stores: MakeStore, raw_redis: Redis) -> None:
    """encryption_keys and encryption_active_key in the settings seal writes like a keyring does."""
    store = stores(
        encryption_keys={"k1": SecretStr(Keyring.generate_key())}, encryption_active_key="k1"
    )
    assert store.keyring is not None and store.keyring.active == "k1"
    written = await write_conversation(store, "s")
    assert await store.get_messages("s") == written
    assert leaks(await raw_values(raw_redis, store, "s")) == {}
    for _, fields in await raw_redis.xrange(store.keys("s").log):
        assert sealed_key_id(fields[b"m"]) == "k1"


async def test_values_written_before_encryption_still_read(stores: MakeStore, k1: Keyring) -> None:
    """Turning encryption on leaves the clear entries written before it readable."""
    await stores().append("s", {"role": "user", "content": "written in clear"})
    store = stores(k1)
    await store.append("s", {"role": "user", "content": "written sealed"})
    assert [m["content"] for m in await store.get_messages("s")] == [
        "written in clear",
        "written sealed",
    ]


# -- nothing readable in Redis ---------------------------------------------------------


async def test_no_plaintext_reaches_redis(stores: MakeStore, raw_redis: Redis, k1: Keyring) -> None:
    """No planted string is in any raw value of an encrypted session; a clear one holds them all."""
    clear, sealed = stores(), stores(k1)
    for store, session in ((clear, "c"), (sealed, "s")):
        await write_conversation(store, session)
        assert (await store.summarize(session, LocalSummarizer())).status == "committed"
    # The scan can fail: in clear, the stream, the pinned copies and the summary all hold plants.
    clear_keys = clear.keys("c")
    found = leaks(await raw_values(raw_redis, clear, "c"))
    assert {clear_keys.log, clear_keys.keep, clear_keys.view} <= found.keys()
    assert set(found[clear_keys.log]) == {*PLANTS, "PLANT"}
    assert leaks(await raw_values(raw_redis, sealed, "s")) == {}
    keys = sealed.keys("s")
    for _, fields in await raw_redis.xrange(keys.log):
        assert sealed_key_id(fields[b"m"]) == "k1"
        if b"v" in fields:
            assert sealed_key_id(fields[b"v"]) == "k1"
    assert await raw_redis.hlen(keys.keep) == 2  # the system and the pinned message
    for value in (await raw_redis.hgetall(keys.keep)).values():
        assert sealed_key_id(value.split(b"\x1e", 4)[4]) == "k1"
    assert sealed_key_id(await raw_redis.hget(keys.view, "l1")) == "k1"


async def test_token_counts_are_those_of_the_clear_text(
    stores: MakeStore, raw_redis: Redis, k1: Keyring
) -> None:
    """Entries, previews and sessions count the same tokens encrypted as in clear."""
    clear, sealed = stores(), stores(k1)
    await write_conversation(clear, "c")
    await write_conversation(sealed, "s")

    async def counts(store: ContextStore, session: str) -> list[tuple[Any, Any]]:
        rows = await raw_redis.xrange(store.keys(session).log)
        return [(fields.get(b"t"), fields.get(b"vt")) for _, fields in rows]

    assert await counts(sealed, "s") == await counts(clear, "c")
    assert any(vt for _, vt in await counts(clear, "c"))  # the large tool result has a preview
    assert (await sealed.info("s")).tokens == (await clear.info("c")).tokens
    assert [m.tokens for m in (await sealed.read("s")).messages] == [
        m.tokens for m in (await clear.read("c")).messages
    ]
    for budget in (100_000, 1_500, 120):
        clear_view = await clear.view("c", token_budget=budget)
        sealed_view = await sealed.view("s", token_budget=budget)
        assert sealed_view.stats.tokens == clear_view.stats.tokens
        assert sealed_view.stats.dropped == clear_view.stats.dropped


# -- rotation and the wrong key --------------------------------------------------------


async def test_rotation_writes_with_the_new_key_and_reads_the_old(
    stores: MakeStore, raw_redis: Redis, k1: Keyring, k1_key: str
) -> None:
    """With k2 added and active, new entries name k2 and entries sealed with k1 still open."""
    old = stores(k1)
    await old.append("s", {"role": "user", "content": f"old {ALPHA}"})
    await old.append("s", {"role": "system", "content": f"old {DELTA}"})
    rotated = stores(Keyring({"k1": k1_key, "k2": Keyring.generate_key()}, "k2"))
    await rotated.append("s", {"role": "user", "content": f"new {BRAVO}"})
    await rotated.append("s", {"role": "user", "content": f"pinned {ECHO}"}, pinned=True)
    rows = await raw_redis.xrange(rotated.keys("s").log)
    assert [sealed_key_id(fields[b"m"]) for _, fields in rows] == ["k1", "k1", "k2", "k2"]
    assert [m["content"] for m in await rotated.get_messages("s")] == [
        f"old {ALPHA}",
        f"old {DELTA}",
        f"new {BRAVO}",
        f"pinned {ECHO}",
    ]
    view = await rotated.view("s", token_budget=10_000)
    assert len(view.messages) == 4
    with pytest.raises(DecryptionError):  # the old keyring does not hold k2
        await old.get_messages("s")


async def write_sealed(stores: MakeStore, k1: Keyring) -> ContextStore:
    """A session "s" written through a store with keyring ``k1``."""
    store = stores(k1)
    await write_conversation(store, "s")
    return store


@pytest.mark.parametrize(
    "keyring",
    [
        pytest.param(lambda: Keyring({"k1": Keyring.generate_key()}, "k1"), id="wrong-key"),
        pytest.param(lambda: Keyring({"k9": Keyring.generate_key()}, "k9"), id="no-such-key-id"),
        pytest.param(lambda: None, id="no-keyring"),
    ],
)
@pytest.mark.parametrize("read", ["get_messages", "read", "view", "get_entry"])
async def test_a_store_without_the_right_key_gets_decryption_error(
    stores: MakeStore, k1: Keyring, keyring: Callable[[], Keyring | None], read: str
) -> None:
    """A wrong key, an unknown key id or no keyring raise DecryptionError, never garbage."""
    first = (await (await write_sealed(stores, k1)).read("s", limit=1)).messages[0]
    other = stores(keyring())
    calls = {
        "get_messages": lambda: other.get_messages("s"),
        "read": lambda: other.read("s"),
        "view": lambda: other.view("s", token_budget=100_000),
        "get_entry": lambda: other.get_entry("s", first.entry_id),
    }
    with pytest.raises(DecryptionError) as caught:
        await calls[read]()
    assert isinstance(caught.value, CorruptEntryError)
    assert (caught.value.tenant, caught.value.session) == (other.tenant, "s")


async def test_a_wrong_key_cannot_open_the_summary(stores: MakeStore, k1: Keyring) -> None:
    """A view whose only sealed value is the cached summary raises DecryptionError with a wrong key.

    The entries are written in clear, then summarized through an encrypted store.
    """
    await stores().append_many("s", [deploy_turn(i) for i in range(12)])
    right = stores(k1)
    assert (await right.summarize("s", LocalSummarizer())).status == "committed"
    assert (await right.view("s", token_budget=600)).stats.summary_used
    wrong = stores(Keyring({"k1": Keyring.generate_key()}, "k1"))
    for budget in (600, 500):  # the anchor's copy of the summary, and the summary itself
        with pytest.raises(DecryptionError):
            await wrong.view("s", token_budget=budget)
    assert len(await wrong.get_messages("s")) == 12  # the clear entries still read


# -- binding to the tenant and session -------------------------------------------------


async def test_a_sealed_entry_copied_to_another_session_does_not_open(
    stores: MakeStore, raw_redis: Redis, k1: Keyring, tenant: str
) -> None:
    """A stream entry copied raw into another session (or tenant) fails with DecryptionError."""
    source = await write_sealed(stores, k1)
    (_, fields), *_ = await raw_redis.xrange(source.keys("s").log, count=1)
    elsewhere = stores(k1, tenant_id=f"{tenant}x")
    for store, session in ((source, "t"), (elsewhere, "s")):
        await store.append(session, {"role": "user", "content": "mine"})
        await raw_redis.xadd(store.keys(session).log, fields)
        with pytest.raises(DecryptionError):
            await store.get_messages(session)
    assert await source.get_messages("s") == [*conversation(), PINNED]


async def test_a_sealed_pinned_copy_moved_to_another_session_does_not_open(
    stores: MakeStore, raw_redis: Redis, k1: Keyring
) -> None:
    """The keep hash's sealed copy of a system message, moved to another session, does not open."""
    source = await write_sealed(stores, k1)
    entry_id, value = next(iter((await raw_redis.hgetall(source.keys("s").keep)).items()))
    await source.append("t", {"role": "user", "content": "mine"})
    await raw_redis.hset(source.keys("t").keep, entry_id, value)
    with pytest.raises(DecryptionError):
        await source.view("t", token_budget=100_000)


# -- Keyring validation ----------------------------------------------------------------

GOOD = Keyring.generate_key()


@pytest.mark.parametrize(
    ("keys", "active"),
    [
        pytest.param({"k1": b"\x01" * 31}, "k1", id="31-bytes"),
        pytest.param({"k1": b"\x01" * 33}, "k1", id="33-bytes"),
        pytest.param({"k1": base64.b64encode(b"\x01" * 16).decode()}, "k1", id="16-bytes-b64"),
        pytest.param({"k1": GOOD}, "k2", id="unknown-active-id"),
        pytest.param({}, "k1", id="empty-keyring"),
        pytest.param({"": GOOD}, "", id="empty-id"),
        pytest.param({"k" * 65: GOOD}, "k" * 65, id="65-byte-id"),
    ],
)
def test_keyring_validation_errors_are_configuration_errors(
    keys: dict[str, bytes | str], active: str
) -> None:
    """A key that is not 32 bytes, a bad id or an unknown active id is a ConfigurationError."""
    with pytest.raises(ConfigurationError):
        Keyring(keys, active)


def test_a_key_that_is_not_base64_is_a_configuration_error() -> None:
    """A str key that is not base64 is a ConfigurationError."""
    with pytest.raises(ConfigurationError):
        Keyring({"k1": "not base64!"}, "k1")


def test_settings_with_a_short_key_fail_when_the_store_is_built(settings: Settings) -> None:
    """Settings naming a 16-byte key give a ConfigurationError when a store is built on them."""
    bad = settings.model_copy(
        update={
            "encryption_keys": {"k1": SecretStr(base64.b64encode(b"\x01" * 16).decode())},
            "encryption_active_key": "k1",
        }
    )
    with pytest.raises(ConfigurationError):
        ContextStore.from_settings(bad, tenant="t")


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(MAGIC, id="magic-only"),
        pytest.param(MAGIC + b"\x02k1", id="no-nonce"),
        pytest.param(MAGIC + b"\x02k1" + b"short", id="short-nonce"),
        pytest.param(MAGIC + b"\x02k1" + b"\x00" * 12, id="no-tag"),
        pytest.param(MAGIC + b"\x02k1" + b"\x00" * 40, id="forged"),
        pytest.param(MAGIC + b"\x02\xff\xfe" + b"\x00" * 40, id="key-id-not-utf8"),
    ],
)
def test_a_truncated_or_forged_value_is_a_decryption_error(k1: Keyring, value: bytes) -> None:
    """Keyring.open raises DecryptionError for a value that starts like a sealed one but is not."""
    with pytest.raises(DecryptionError):
        k1.open("t", "s", value)


async def test_a_truncated_sealed_summary_is_a_decryption_error(
    stores: MakeStore, raw_redis: Redis, k1: Keyring
) -> None:
    """A view whose cached summary was cut short raises DecryptionError, not ValueError."""
    store = stores(k1)
    await store.append_many("s", [deploy_turn(i) for i in range(12)])
    assert (await store.summarize("s", LocalSummarizer())).status == "committed"
    await raw_redis.hset(store.keys("s").view, "l1", MAGIC + b"\x02k1short")
    with pytest.raises(DecryptionError):
        await store.view("s", token_budget=600)
