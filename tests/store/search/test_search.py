"""History search: BM25 over the whole history, following its epoch, life, TTL and tenant."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from redis.asyncio import Redis
from support.config import BACKENDS
from support.helpers import user

from bench.conversations import DOMAINS, generate, text_of
from ctxstore import ContextStore, Keyring, Settings
from ctxstore._parts.search import message_text, terms
from ctxstore.errors import InvalidIdError, InvalidInputError

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)

PLANTED = [
    ("The Kestrel cluster fails over to region eu-north-3 during maintenance.", "Kestrel failover"),
    ("Our staging database listens on port 6543, not the default.", "staging database port"),
    (
        "Rotate the signing key stored at /srv/keys/orchard-signing.pem every 90 days.",
        "signing key",
    ),
    ("Callum Ferreira owns the invoice reconciliation job.", "who owns invoice reconciliation"),
    ("We decided to cap the refund goodwill at 17.5% of the order value.", "goodwill cap"),
]


def _filler(count: int) -> list[dict[str, Any]]:
    """Realistic agent conversations (bench's generator), back to back, ``count`` messages."""
    messages: list[dict[str, Any]] = []
    seed = 1
    while len(messages) < count:
        for domain in DOMAINS:
            messages += generate(domain, seed).messages
        seed += 1
    return messages[:count]


async def _append(store: ContextStore, session: str, messages: list[dict[str, Any]]) -> list[str]:
    ids: list[str] = []
    for start in range(0, len(messages), 500):
        ids += [r.entry_id for r in await store.append_many(session, messages[start : start + 500])]
    return ids


async def test_facts_planted_far_back_in_10000_messages_are_found_in_the_top_3(
    store: ContextStore, backend: str
) -> None:
    """Facts stated once in the first turns of 10,000 messages: a query naming each finds it."""
    if backend == "cluster":
        pytest.skip("the long history runs once; the cluster runs the other contracts")
    filler = _filler(10_000 - len(PLANTED))
    history = [user(fact) for fact, _ in PLANTED] + filler
    ids = await _append(store, "long", history)
    for (fact, query), entry_id in zip(PLANTED, ids, strict=False):
        hits = await store.search("long", query, limit=3)
        assert entry_id in [h.entry_id for h in hits], (query, hits)
        found = next(h for h in hits if h.entry_id == entry_id)
        assert found.role == "user" and found.snippet in fact
    # The generator's own planted facts (preferences, numbers, errors, names...),
    # queried by what they are about and their value, where that value is rare.
    texts = [text_of(m).lower() for m in history]
    found = total = 0
    for conversation in (generate(domain, 1) for domain in DOMAINS):  # the oldest turns
        for fact in conversation.facts:
            if sum(fact.key.lower() in t for t in texts) > 3:
                continue
            hits = await store.search("long", f"{fact.subject} {fact.key}", limit=3)
            total += 1
            found += any(fact.key.lower() in texts[ids.index(h.entry_id)] for h in hits)
    assert total >= 20
    assert found / total >= 0.85, (found, total)


async def test_every_format_is_searchable(store: ContextStore) -> None:
    """Text, tool names, arguments and results of OpenAI Chat, Anthropic and Responses."""
    ids = await _append(
        store,
        "s",
        [
            user("please look at the quarterly numbers"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {
                            "name": "read_file",
                            "arguments": json.dumps({"path": "/etc/pelican/pelican.conf"}),
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "listen_port = 9931\nworkers = 4"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "grep", "input": {"q": "zephyr"}}
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "ZephyrTimeoutError at line 88"}],
                    }
                ],
            },
            {
                "type": "function_call",
                "call_id": "f1",
                "name": "lookup_customer",
                "arguments": json.dumps({"email": "ines.okafor@example.org"}),
            },
            {"type": "function_call_output", "call_id": "f1", "output": "plan: platinum-annual"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Ines is on the platinum plan."}],
            },
        ],
    )
    expected = {
        "pelican.conf": ids[1],
        "listen_port 9931": ids[2],
        "zephyr grep": ids[3],
        "ZephyrTimeoutError": ids[4],
        "ines.okafor@example.org": ids[5],
        "platinum-annual": ids[6],
    }
    for query, entry_id in expected.items():
        hits = await store.search("s", query, limit=1)
        assert [h.entry_id for h in hits] == [entry_id], query
    roles = {h.entry_id: h.role for h in await store.search("s", "platinum", limit=5)}
    assert roles == {ids[6]: "function_call_output", ids[7]: "assistant"}


async def test_search_follows_replace_clear_pop_and_a_new_life(store: ContextStore) -> None:
    """The index never answers from a history the session no longer has."""
    await _append(store, "s", [user("the ferry leaves from pier 39"), user("bring the heron map")])
    assert len(await store.search("s", "ferry pier")) == 1
    await store.replace("s", [user("the train leaves from platform 7")])
    assert await store.search("s", "ferry pier") == []
    assert [h.snippet for h in await store.search("s", "train platform")] == [
        "the train leaves from platform 7"
    ]
    appended = await store.append("s", user("the tram leaves from stop 12"))
    assert [h.entry_id for h in await store.search("s", "tram")] == [appended.entry_id]
    popped = await store.pop("s")
    assert popped is not None and popped.entry_id == appended.entry_id
    assert await store.search("s", "tram") == []
    assert len(await store.search("s", "train")) == 1
    await store.clear("s")
    assert await store.search("s", "train") == []
    await store.append("s", user("the bus leaves at noon"))
    assert await store.delete("s")
    await store.append("s", user("a new life: the boat leaves at dawn"))
    assert await store.search("s", "bus noon") == []
    assert len(await store.search("s", "boat dawn")) == 1


async def test_forget_and_delete_leave_no_index(store: ContextStore, raw_redis: Redis) -> None:
    """After delete or forget_tenant, nothing is found and the index key is gone."""
    await _append(store, "a", [user("the vault password rotates monthly")])
    await _append(store, "b", [user("the vault is in the basement")])
    assert await store.search("a", "vault") and await store.search("b", "vault")
    assert await raw_redis.exists(store.keys("a").index, store.keys("b").index) == 2
    await store.delete("a")
    assert await store.search("a", "vault") == []
    assert not await raw_redis.exists(store.keys("a").index)
    await store.forget_tenant()
    assert await store.search("b", "vault") == []
    assert not await raw_redis.exists(store.keys("b").index)


async def test_another_tenant_finds_nothing_of_this_one(store: ContextStore) -> None:
    """The same session id in another tenant has its own history and index."""
    await _append(store, "s", [user("the launch code is falcon-umber-42")])
    other = store.for_tenant(store.tenant + "-other")
    assert await other.search("s", "launch code falcon umber") == []
    await other.append("s", user("nothing secret here"))
    assert await other.search("s", "launch code falcon umber") == []
    assert len(await store.search("s", "falcon umber")) == 1


async def test_concurrent_searches_and_appends_index_each_entry_once(
    store: ContextStore, raw_redis: Redis
) -> None:
    """Searchers and a writer racing: every entry is indexed exactly once."""
    writes = [user(f"entry {i} mentions the lantern") for i in range(600)]

    async def writer() -> None:
        for start in range(0, 600, 20):
            await store.append_many("s", writes[start : start + 20])

    async def searcher() -> None:
        for _ in range(15):
            await store.search("s", "lantern")

    await asyncio.gather(writer(), searcher(), searcher(), searcher())
    await store.index("s")
    header = (await raw_redis.hget(store.keys("s").index, "@")).decode().split(" ")
    assert int(header[4]) == 600  # entries indexed
    postings = (await raw_redis.hget(store.keys("s").index, "w:lantern")).decode().split(";")[:-1]
    ids = [p.split(",")[0] for p in postings]
    assert len(ids) == len(set(ids)) == 600
    assert len(await store.search("s", "lantern", limit=100)) == 100


async def test_catching_up_reads_only_what_is_new(store: ContextStore) -> None:
    """An index brought up to date adds only the entries appended since."""
    await _append(store, "s", [user(f"note {i}") for i in range(300)])
    assert await store.index("s") == 300
    assert await store.index("s") == 0
    await store.append_many("s", [user("note a"), user("note b")])
    assert await store.index("s") == 2
    assert await store.index("absent") == 0


async def test_the_index_expires_with_the_session(store: ContextStore, raw_redis: Redis) -> None:
    """The index takes the session's TTL, and set_ttl moves both."""
    await store.append("s", user("the otter sleeps"))
    await store.set_ttl("s", 500)
    await store.search("s", "otter")
    keys = store.keys("s")
    assert 0 < await raw_redis.pttl(keys.index) <= 500_000
    await store.set_ttl("s", None)
    assert await raw_redis.pttl(keys.index) == -1
    await store.set_ttl("s", 50)
    assert 0 < await raw_redis.pttl(keys.index) <= 50_000


async def test_bad_queries_are_refused_and_common_words_find_nothing(store: ContextStore) -> None:
    """Typed errors for a bad query, limit or id; nothing is written."""
    await store.append("s", user("the heron flies"))
    for query in (None, 42, b"heron", "x" * 2_001):
        with pytest.raises(InvalidInputError):
            await store.search("s", query)  # type: ignore[arg-type]
    for limit in (0, 101, "5", True):
        with pytest.raises(InvalidInputError):
            await store.search("s", "heron", limit=limit)  # type: ignore[arg-type]
    with pytest.raises(InvalidIdError):
        await store.search("a}b", "heron")
    assert await store.search("s", "the and of it") == []
    assert await store.search("s", "") == []
    assert await store.search("absent", "heron") == []


async def test_with_encryption_the_index_holds_no_term_in_clear(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Terms are keyed hashes; a new active key starts the index over, and search still works."""
    k1, k2 = Keyring.generate_key(), Keyring.generate_key()
    async with ContextStore.from_settings(
        settings, tenant=tenant, keyring=Keyring({"k1": k1}, "k1")
    ) as store:
        await store.append("s", user("the quokka password is marmalade"))
        assert len(await store.search("s", "quokka marmalade")) == 1
        fields = await raw_redis.hkeys(store.keys("s").index)
        assert b"@" in fields and not any(f.startswith(b"w:") for f in fields)
        raw = b" ".join([*fields, *await raw_redis.hvals(store.keys("s").index)])
        assert b"quokka" not in raw and b"marmalade" not in raw
        first = await raw_redis.hget(store.keys("s").index, "@")
    async with ContextStore.from_settings(
        settings, tenant=tenant, keyring=Keyring({"k1": k1, "k2": k2}, "k2")
    ) as rotated:
        hits = await rotated.search("s", "marmalade")
        assert [h.snippet for h in hits] == ["the quokka password is marmalade"]
        head = await raw_redis.hget(rotated.keys("s").index, "@")
        assert head is not None and first is not None
        # The header names the key by a digest of its id: started over under k2.
        assert head.split(b" ")[2] not in (first.split(b" ")[2], b"-", b"k2")


def test_terms_and_text_cover_the_formats() -> None:
    """Words, numbers with their dots, snake_case whole and split; protocol fields left out."""
    assert terms("Set max_retries to 3.25 for PR-32734 at 10.0.0.7 (the ports)") == [
        "set",
        "max_retries",
        "max",
        "retry",
        "3.25",
        "pr",
        "32734",
        "10.0.0.7",
        "port",
    ]
    text = message_text(
        {
            "type": "function_call",
            "call_id": "call_secret_id",
            "name": "deploy",
            "arguments": json.dumps({"target": "line one\nline two"}),
        }
    )
    assert "call_secret_id" not in text
    assert terms(text) == ["deploy", "target", "line", "one", "line", "two"]
