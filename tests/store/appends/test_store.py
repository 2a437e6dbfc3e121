"""The store on real Redis: appends, reads, views, rewrites, sessions, bad input."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from support.config import BACKENDS
from support.helpers import USER, conversation, paired, ttl_span

from ctxstore import (
    ConflictError,
    ContextStore,
    InvalidIdError,
    InvalidInputError,
    InvalidMessageError,
    MessageTooLargeError,
    SessionNotFoundError,
    Settings,
    StoreUnavailableError,
)
from ctxstore.testing import ManualClock

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)


async def session_keys_in_redis(raw: Redis, store: ContextStore, session: str) -> list[bytes]:
    """Every key of ``session`` that exists."""
    found = []
    for key in store.keys(session).all():
        if await raw.exists(key):
            found.append(key.encode())
    return found


# -- appends -------------------------------------------------------------------


async def test_append_returns_increasing_ids_and_seq(store: ContextStore) -> None:
    """Appends answer entry ids in stream order and a sequence number that grows by one."""
    first = await store.append("s", USER)
    second = await store.append("s", {"role": "assistant", "content": "hi"})
    assert (first.seq, second.seq) == (1, 2)
    assert tuple(map(int, first.entry_id.split("-"))) < tuple(map(int, second.entry_id.split("-")))
    assert first.epoch == second.epoch == 0
    assert not first.duplicate


async def test_message_round_trips_with_unknown_keys(store: ContextStore) -> None:
    """A dict that goes in comes back out equal, unknown keys and block types kept."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "rules", "x-trace": {"id": 7}},
        {"role": "developer", "content": "dev note"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look", "cache_control": {"type": "ephemeral"}},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "AAA"},
                },
                {"type": "document", "source": {"type": "text", "data": "doc"}, "title": "t"},
            ],
            "name": "ana",
            "metadata": {"ui": [1, 2, {"a": None}]},
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "redacted_thinking", "data": "xyz"},
                {"type": "tool_use", "id": "tu1", "name": "grep", "input": {"q": "é"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "tu1", "content": "ok", "is_error": False}
            ],
        },
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": [{"type": "text", "text": "r"}],
            "name": "f",
        },
    ]
    await store.append_many("s", messages)
    assert await store.get_messages("s") == messages


async def test_retry_with_same_idempotency_key_is_not_doubled(store: ContextStore) -> None:
    """A second append with the same idempotency key writes nothing and answers the original."""
    first = await store.append("s", USER, idempotency_key="k-1")
    again = await store.append("s", USER, idempotency_key="k-1")
    assert again.duplicate and again.entry_id == first.entry_id and again.seq == first.seq
    assert len(await store.get_messages("s")) == 1
    assert (await store.info("s")).seq == 1


async def test_idempotency_window_rotates_but_keeps_recent_keys(
    settings: Settings, tenant: str
) -> None:
    """Keys stay remembered for at least one window after the generation rotates."""
    small = settings.model_copy(update={"idempotency_window": 3})
    async with ContextStore.from_settings(small, tenant=tenant) as store:
        ids = [(await store.append("s", USER, idempotency_key=f"k{i}")).entry_id for i in range(7)]
        # k4..k6 are in the current or previous generation: still deduplicated.
        for i in (4, 5, 6):
            again = await store.append("s", USER, idempotency_key=f"k{i}")
            assert again.duplicate and again.entry_id == ids[i]
        assert (await store.info("s")).count == 7


async def test_a_batch_larger_than_the_window_answers_its_whole_retry(
    settings: Settings, tenant: str
) -> None:
    """One call rotates the generations at most once, so none of its own keys is dropped.

    With a window of 3, a batch of 10 once rotated three times in its own call: the
    second rotation dropped its first keys, and a retry of the batch (its reply lost)
    wrote them again.
    """
    small = settings.model_copy(update={"idempotency_window": 3})
    async with ContextStore.from_settings(small, tenant=tenant) as store:
        await store.append_many("s", [USER] * 2, idempotency_keys=["a0", "a1"])
        keys = [f"k{i}" for i in range(10)]
        first = await store.append_many("s", [USER] * 10, idempotency_keys=keys)
        again = await store.append_many("s", [USER] * 10, idempotency_keys=keys)
        assert all(r.duplicate for r in again)
        assert [r.entry_id for r in again] == [r.entry_id for r in first]
        assert (await store.info("s")).count == 12
        # The next call rotates again: what the batch put in the new generation is one
        # generation back now (k0, which the batch put in the old one, is a window behind).
        await store.append("s", USER, idempotency_key="after")
        for key in ("k1", "k9"):
            assert (await store.append("s", USER, idempotency_key=key)).duplicate
        assert (await store.info("s")).count == 13


async def test_idempotency_keys_expire_with_the_retry_period(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Key generations expire: the current two periods after the last append, the old in one."""
    short = settings.model_copy(update={"idempotency_window": 2, "idempotency_seconds": 60})
    async with ContextStore.from_settings(short, tenant=tenant) as store:
        for i in range(3):  # the third append rotates the first generation out
            await store.append("s", USER, idempotency_key=f"k{i}")
        keys = store.keys("s")
        assert 60_000 < await raw_redis.pttl(keys.idem) <= 120_000
        assert 0 < await raw_redis.pttl(keys.idem_old) <= 60_000
        assert await raw_redis.pttl(keys.log) == -1  # the history itself does not expire


async def test_append_if_refuses_stale_seq_and_writes_nothing(store: ContextStore) -> None:
    """append-if with a stale expected seq raises ConflictError carrying the current seq."""
    await store.append("s", USER)
    await store.append("s", USER, expected_seq=1)
    with pytest.raises(ConflictError) as caught:
        await store.append("s", USER, expected_seq=1)
    assert caught.value.current == 2 and caught.value.expected == 1
    assert (await store.info("s")).count == 2


async def test_append_if_retry_after_success_is_a_duplicate_not_a_conflict(
    store: ContextStore,
) -> None:
    """A retried append-if that was applied answers the original entry, not a conflict."""
    first = await store.append("s", USER, idempotency_key="once", expected_seq=0)
    again = await store.append("s", USER, idempotency_key="once", expected_seq=0)
    assert again.duplicate and again.entry_id == first.entry_id


async def test_append_many_is_all_or_nothing(store: ContextStore) -> None:
    """A batch with one malformed message writes none of the batch."""
    await store.append("s", USER)
    with pytest.raises(InvalidMessageError) as caught:
        await store.append_many("s", [USER, {"role": "tool", "content": "no call id"}, USER])
    assert caught.value.index == 1
    assert (await store.info("s")).count == 1


async def test_counters_match_the_stream(store: ContextStore, raw_redis: Redis) -> None:
    """Meta's count and tokens equal the stream's length and the sum of entry tokens."""
    await store.append_many("s", conversation(6))
    info = await store.info("s")
    keys = store.keys("s")
    entries = await raw_redis.xrange(keys.log)
    assert info.count == len(entries) == await raw_redis.xlen(keys.log)
    assert info.tokens == sum(int(fields[b"t"]) for _, fields in entries)
    assert info.first_at_ms is not None and info.last_at_ms is not None
    assert info.first_at_ms <= info.last_at_ms


# -- bad input -----------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        {},
        {"role": "wizard", "content": "hi"},
        {"role": "tool", "content": "result without a call id"},
        {"role": "user"},
        {"role": "user", "content": 5},
        {"role": "user", "content": "x", "tool_calls": []},
        {"role": "assistant", "content": None},
        {"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "n", "input": {}}]},
        {"role": "user", "content": [{"type": "text"}]},
        {"role": "user", "content": [{"text": "no type"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "user", "content": "x", "tool_call_id": "c1"},
        {"role": "user", "content": float("nan")},
        {"role": "user", "content": b"bytes"},
        "not a dict",
        None,
    ],
)
async def test_malformed_messages_are_refused_and_nothing_is_written(
    store: ContextStore, raw_redis: Redis, message: Any
) -> None:
    """Each malformed message gets InvalidMessageError and leaves no key behind."""
    with pytest.raises(InvalidMessageError):
        await store.append("s", message)
    assert await session_keys_in_redis(raw_redis, store, "s") == []


async def test_duplicate_call_ids_in_one_message_are_refused(store: ContextStore) -> None:
    """An assistant message that names one tool call id twice is malformed."""
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    with pytest.raises(InvalidMessageError, match="same tool call id"):
        await store.append("s", {"role": "assistant", "content": None, "tool_calls": [call, call]})


async def test_message_over_the_size_cap_is_refused(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A message over max_message_bytes gets MessageTooLargeError with both sizes."""
    capped = settings.model_copy(update={"max_message_bytes": 1000})
    async with ContextStore.from_settings(capped, tenant=tenant) as store:
        with pytest.raises(MessageTooLargeError) as caught:
            await store.append("s", {"role": "user", "content": "x" * 2000})
        assert caught.value.limit == 1000 and caught.value.size > 1000
        assert await session_keys_in_redis(raw_redis, store, "s") == []


@pytest.mark.parametrize(
    "bad_id",
    [
        "",
        "a}:x",
        "{a",
        "a*",
        "a?",
        "a[",
        "a:b",
        "a b",
        "a\tb",
        "a\x00",
        "a\nb",
        "..",
        "a..b",
        "x" * 129,
        "tеnant",
        ".hidden",
        "-x",
        5,
        None,
    ],
)
async def test_hostile_session_ids_are_refused(store: ContextStore, bad_id: Any) -> None:
    """Session ids that could escape their key get InvalidIdError before any I/O."""
    with pytest.raises(InvalidIdError):
        await store.append(bad_id, USER)
    with pytest.raises(InvalidIdError):
        await store.view(bad_id)


@pytest.mark.parametrize("bad_tenant", ["", "a}b", "t:x", "x" * 200, "ténant"])
def test_hostile_tenant_ids_are_refused(settings: Settings, bad_tenant: str) -> None:
    """A store cannot be bound to a tenant id that could escape its key."""
    with pytest.raises(InvalidIdError):
        ContextStore(Redis(), tenant=bad_tenant, settings=settings)


async def test_bad_arguments_get_typed_errors(store: ContextStore) -> None:
    """Bad budgets, seqs, keys and limits are InvalidInputError, not crashes."""
    await store.append("s", USER)
    with pytest.raises(InvalidInputError):
        await store.view("s", token_budget=0)
    with pytest.raises(InvalidInputError):
        await store.append("s", USER, expected_seq=-1)
    with pytest.raises(InvalidInputError):
        await store.append("s", USER, idempotency_key="")
    with pytest.raises(InvalidInputError):
        await store.append_many("s", [USER, USER], idempotency_keys=["a", "a"])
    with pytest.raises(InvalidInputError):
        await store.read("s", limit=0)
    with pytest.raises(InvalidInputError):
        await store.read("s", after="not-an-id")
    with pytest.raises(InvalidInputError):
        await store.append_many("s", USER)  # type: ignore[arg-type]
    assert (await store.info("s")).count == 1


async def test_unreachable_redis_gives_a_typed_error_in_bounded_time(tenant: str) -> None:
    """With nothing listening, calls fail with StoreUnavailableError after their retries alone."""
    settings = Settings(
        redis_url="redis://127.0.0.1:1/0",
        connect_timeout=0.5,
        retry_attempts=2,
        retry_base_delay=0.01,
    )
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        with pytest.raises(StoreUnavailableError, match="after 3 attempts") as caught:
            async with asyncio.timeout(60):  # a safety net: a call that never ends fails here
                await store.append("s", USER)
        assert caught.value.tenant == tenant and caught.value.session == "s"
        assert caught.value.__cause__ is not None


# -- reads ---------------------------------------------------------------------


async def test_history_is_read_in_pages(store: ContextStore) -> None:
    """read() pages through the history oldest first and says where to continue."""
    await store.append_many("s", [{"role": "user", "content": f"m{i}"} for i in range(25)])
    first = await store.read("s", limit=10)
    second = await store.read("s", after=first.next_after, limit=10)
    third = await store.read("s", after=second.next_after, limit=10)
    contents = [m.message["content"] for page in (first, second, third) for m in page.messages]
    assert contents == [f"m{i}" for i in range(25)]
    assert third.next_after is None


async def test_get_messages_reads_long_histories_across_pages(
    settings: Settings, tenant: str
) -> None:
    """get_messages returns every message even when it takes several pages."""
    paged = settings.model_copy(update={"history_page_size": 7})
    async with ContextStore.from_settings(paged, tenant=tenant) as store:
        messages = [{"role": "user", "content": f"m{i}"} for i in range(30)]
        await store.append_many("s", messages)
        assert await store.get_messages("s") == messages


async def test_paging_across_a_replace_is_detected(store: ContextStore) -> None:
    """iter_history raises ConflictError when a replace changes the history mid-read."""
    await store.append_many("s", [USER] * 3)
    one_per_page = store.settings.model_copy(update={"history_page_size": 1})
    async with ContextStore.from_settings(one_per_page, tenant=store.tenant) as paged:
        pages = paged.iter_history("s")
        first = await anext(pages)
        await store.replace("s", [USER] * 3)
        with pytest.raises(ConflictError):
            async for _ in pages:
                pass
    assert first.message == USER


async def test_get_entry_reads_one_message(store: ContextStore) -> None:
    """get_entry returns the message with that id, or None."""
    appended = await store.append("s", USER)
    found = await store.get_entry("s", appended.entry_id)
    assert found is not None and found.message == USER
    assert await store.get_entry("s", "1-0") is None


async def test_empty_session_reads_as_empty(store: ContextStore) -> None:
    """A session never written has no messages, an empty view and exists=False."""
    assert await store.get_messages("nothing") == []
    view = await store.view("nothing", token_budget=100)
    assert view.messages == [] and view.stats.history_messages == 0
    assert not (await store.info("nothing")).exists


# -- views ---------------------------------------------------------------------


async def test_view_fits_the_budget_keeps_system_and_newest(store: ContextStore) -> None:
    """A small budget returns the system message and the newest turns, in order."""
    messages = conversation(30)
    await store.append_many("s", messages)
    view = await store.view("s", token_budget=300)
    assert view.stats.tokens <= 300
    assert view.messages[0] == messages[0]
    assert view.messages[-1] == messages[-1]
    tail = view.messages[1:]
    assert tail == messages[len(messages) - len(tail) :]
    assert view.stats.compacted and view.stats.dropped > 0


async def test_view_never_splits_parallel_tool_calls(store: ContextStore) -> None:
    """Across every budget, each call in the view is answered right after it, by id."""
    await store.append_many("s", conversation(12, tool_every=2, parallel=3))
    kept = []
    for budget in range(40, 1400, 37):
        view = await store.view("s", token_budget=budget)
        kept.append(paired(view.messages))
        assert view.stats.tokens <= budget
    # Exchanges go whole (three calls each): more budget, more of them, none at the least.
    assert kept[0] == 0 and max(kept) >= 3 and kept == sorted(kept)
    assert all(pairs % 3 == 0 for pairs in kept)


async def test_view_is_non_destructive(store: ContextStore) -> None:
    """get_messages is unchanged after any number of views."""
    messages = conversation(10)
    await store.append_many("s", messages)
    for budget in (50, 200, 5000):
        await store.view("s", token_budget=budget)
    assert await store.get_messages("s") == messages


async def test_view_cost_follows_the_budget_not_the_history(store: ContextStore) -> None:
    """With a long history, the script reads about as many entries as the budget holds."""
    await store.append_many("s", conversation(400))
    small = await store.view("s", token_budget=200)
    assert small.stats.history_messages > 1000
    # What the budget holds, plus the first read's margin (64, as before: no setting now).
    assert small.stats.entries_read <= small.stats.messages + 64 + 1


async def test_view_is_one_round_trip(store: ContextStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A view of an active session is one write to Redis, and no script.

    A pod that viewed the session reads only what is new, in one plain pipeline
    (its last command validates the others); a pod that did not, in one MULTI/EXEC.
    """
    await store.append_many("s", conversation(200))
    await store.view("s", token_budget=2000)  # learns the session's mean entry size
    sent: list[bytes] = []
    original = AbstractConnection.send_packed_command

    async def counting(self: Any, command: Any, check_health: bool = True) -> None:
        sent.append(b"".join(command) if isinstance(command, list) else command)
        await original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    view = await store.view("s", token_budget=2000)
    assert len(sent) == 1
    assert b"MULTI" not in sent[0] and b"EVAL" not in sent[0]
    assert view.stats.tokens <= 2000 and view.stats.dropped > 0
    cold = ContextStore.from_settings(
        store.settings.model_copy(update={"view_cache_bytes": 0}), tenant=store.tenant
    )
    async with cold:
        await cold.view("s", token_budget=2000)  # learns where the view starts
        sent.clear()
        again = await cold.view("s", token_budget=2000)
    assert len(sent) == 1
    assert sent[0].count(b"MULTI") == 1 and sent[0].count(b"EXEC") == 1
    assert b"EVAL" not in sent[0]
    assert again.messages == view.messages


async def test_view_repairs_an_unanswered_call(store: ContextStore) -> None:
    """An assistant call with no result yet is stripped from the view and reported."""
    await store.append_many(
        "s",
        [
            USER,
            {
                "role": "assistant",
                "content": "let me check",
                "tool_calls": [
                    {"id": "c9", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
        ],
    )
    view = await store.view("s", token_budget=1000)
    assert view.messages == [USER, {"role": "assistant", "content": "let me check"}]
    assert view.stats.repairs == ["dropped unanswered call c9"]
    assert len(await store.get_messages("s")) == 2


async def test_pinned_messages_are_always_sent(store: ContextStore) -> None:
    """A pinned message survives any cut; unpinning releases it."""
    await store.append("s", {"role": "user", "content": "the task: port the parser"}, pinned=True)
    late = await store.append("s", {"role": "user", "content": "pin me later"})
    await store.append_many("s", conversation(20)[1:])
    view = await store.view("s", token_budget=150)
    assert view.messages[0] == {"role": "user", "content": "the task: port the parser"}
    assert await store.pin("s", late.entry_id)
    view = await store.view("s", token_budget=150)
    assert {"role": "user", "content": "pin me later"} in view.messages
    assert (await store.info("s")).pinned[-1] == late.entry_id
    assert await store.pin("s", late.entry_id, pinned=False)
    view = await store.view("s", token_budget=150)
    assert {"role": "user", "content": "pin me later"} not in view.messages
    assert not await store.pin("s", "1-1")


async def test_protected_floor_over_budget_is_signalled(store: ContextStore) -> None:
    """When system messages alone exceed the budget, the view says so and sends only them."""
    system = {"role": "system", "content": "rule " * 400}
    await store.append_many("s", [system, USER])
    view = await store.view("s", token_budget=50)
    assert view.stats.over_budget
    assert view.messages == [system]
    assert view.stats.protected_tokens > 50


async def test_large_tool_results_are_offloaded_to_a_preview(
    settings: Settings, tenant: str
) -> None:
    """A huge tool result is sent as a preview naming its entry when the budget is short."""
    small = settings.model_copy(
        update={"offload_threshold_tokens": 200, "offload_preview_tokens": 50}
    )
    async with ContextStore.from_settings(small, tenant=tenant) as store:
        call = {"id": "c1", "type": "function", "function": {"name": "cat", "arguments": "{}"}}
        big = "line of log output with details\n" * 600
        results = await store.append_many(
            "s",
            [
                USER,
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": big},
            ],
        )
        view = await store.view("s", token_budget=400)
        preview = view.messages[-1]["content"]
        assert results[2].entry_id in preview and "not shown" in preview
        assert len(preview) < len(big) / 10
        assert view.stats.offloaded == [results[2].entry_id]
        full = await store.get_entry("s", results[2].entry_id)
        assert full is not None and full.message["content"] == big
        roomy = await store.view("s", token_budget=100_000)
        assert roomy.messages[-1]["content"] == big and roomy.stats.offloaded == []


async def test_view_budget_from_provider_and_safety_factor(store: ContextStore) -> None:
    """A provider's window sets the budget; a Claude model gets the safety factor."""

    class Info:
        id = "anthropic"
        defaults = {"context_window": 3000, "max_output_tokens": 1000, "model": "claude-sonnet-4-5"}

    class Provider:
        def get_info(self) -> Info:
            return Info()

    await store.append("s", USER)
    view = await store.view("s", provider=Provider())
    assert view.stats.budget == 3000 - 1000 - store.settings.provider_safety_margin
    assert view.stats.budget_cl100k == int(1000 / store.settings.token_safety_factors["claude"])
    plain = await store.view("s", token_budget=1000, model="gpt-4o")
    assert plain.stats.budget_cl100k == 1000


# -- rewrites --------------------------------------------------------------------


async def test_replace_bumps_epoch_and_rewrites(store: ContextStore) -> None:
    """Replace sets the history, bumps the epoch, and reports what it superseded."""
    await store.append_many("s", conversation(3))
    new = [{"role": "system", "content": "resumed"}, USER]
    result = await store.replace("s", new)
    assert result.epoch == 1 and result.count == 2 and result.superseded == len(conversation(3))
    assert await store.get_messages("s") == new
    info = await store.info("s")
    assert (info.epoch, info.count, info.seq) == (1, 2, result.seq)
    after = await store.append("s", USER)
    assert after.epoch == 1 and after.seq == result.seq + 1


async def test_replace_if_refuses_a_stale_seq(store: ContextStore) -> None:
    """Replace with a stale expected seq raises ConflictError and changes nothing."""
    await store.append_many("s", [USER, USER])
    with pytest.raises(ConflictError) as caught:
        await store.replace("s", [USER], expected_seq=1)
    assert caught.value.current == 2
    assert len(await store.get_messages("s")) == 2
    assert (await store.lease("s", wait_s=0)) is not None  # the lease was given back


async def test_replace_with_a_bad_message_writes_nothing(store: ContextStore) -> None:
    """A replace whose new history holds a malformed message leaves the old one whole."""
    await store.append_many("s", [USER, USER])
    with pytest.raises(InvalidMessageError):
        await store.replace("s", [USER, {"role": "nobody"}])
    assert len(await store.get_messages("s")) == 2
    assert (await store.info("s")).epoch == 0


async def test_clear_drops_messages_but_keeps_the_session(store: ContextStore) -> None:
    """Clear empties the history, bumps the epoch, and appends carry on."""
    await store.append_many("s", [USER] * 4, pinned=True)
    cleared = await store.clear("s")
    assert cleared.superseded == 4 and cleared.count == 0
    assert await store.get_messages("s") == []
    view = await store.view("s", token_budget=100)
    assert view.messages == []
    await store.append("s", USER)
    assert await store.get_messages("s") == [USER]


# -- sessions --------------------------------------------------------------------


async def test_list_sessions_most_recent_first(settings: Settings, tenant: str) -> None:
    """list_sessions returns the tenant's sessions by last activity, paged.

    Last activity is the store's clock: a manual one gives each session its own time.
    """
    clock = ManualClock()
    start = clock.now_ms()
    async with ContextStore.from_settings(settings, tenant=tenant, clock=clock) as store:
        for name in ("a", "b", "c"):
            await store.append(name, USER)
            clock.advance(1)
        rows = await store.list_sessions()
        assert [(r.session, r.last_active_ms) for r in rows] == [
            ("c", start + 2_000),
            ("b", start + 1_000),
            ("a", start),
        ]
        older = await store.list_sessions(limit=1, before_ms=rows[0].last_active_ms)
        assert [r.session for r in older] == ["b"]


async def test_delete_removes_every_key(store: ContextStore, raw_redis: Redis) -> None:
    """Delete removes the session's keys and its index entry.

    Only expiring keys stay: the tombstone, and the idempotency records (no
    content) that answer a retried append or delete.
    """
    result = await store.append("s", USER, pinned=True)
    await store.pin("s", result.entry_id)
    assert await session_keys_in_redis(raw_redis, store, "s")
    assert await store.delete("s")
    keys = store.keys("s")
    left = await session_keys_in_redis(raw_redis, store, "s")
    assert sorted(left) == sorted([keys.gone.encode(), keys.idem.encode()])
    assert 0 < await raw_redis.pttl(keys.gone) <= store.settings.tombstone_seconds * 1000
    assert 0 < await raw_redis.pttl(keys.idem) <= 2 * store.settings.idempotency_seconds * 1000
    assert USER["content"].encode() not in await raw_redis.dump(keys.idem)
    assert [r.session for r in await store.list_sessions()] == []
    assert not await store.delete("s")


async def test_session_ttl_is_set_and_refreshed(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A configured TTL is put on the session's keys, and moved by a write when due."""
    ttl = settings.model_copy(update={"session_ttl_seconds": 100})
    async with ContextStore.from_settings(ttl, tenant=tenant) as store:
        await store.append("s", USER)
        keys = store.keys("s")
        assert 100_000 < await raw_redis.pttl(keys.log) <= ttl_span(100_000)
        assert 100_000 < await raw_redis.pttl(keys.meta) <= ttl_span(100_000)
        expiry = await raw_redis.pexpiretime(keys.log)
        await store.append("s", USER)  # not due: nothing moves
        assert await raw_redis.pexpiretime(keys.log) == expiry
        await raw_redis.pexpire(keys.meta, 99_000)  # as if a second had passed
        await store.append("s", USER)
        assert 100_000 < await raw_redis.pttl(keys.log) <= ttl_span(100_000)
        assert await raw_redis.pexpiretime(keys.log) > expiry
        await store.set_ttl("s", 5000)
        await store.append("s", USER)
        assert 100_000 < await raw_redis.pttl(keys.log) <= ttl_span(5_000_000)
        assert (await store.info("s")).ttl_seconds == 5000
        await store.set_ttl("s", None)
        assert await raw_redis.pttl(keys.log) == -1
        with pytest.raises(SessionNotFoundError):
            await store.set_ttl("missing", 10)


async def test_tenants_do_not_see_each_other(settings: Settings) -> None:
    """The same session id under two tenants are two sessions."""
    async with (
        ContextStore.from_settings(settings, tenant="tenant-a-x1") as a,
        ContextStore.from_settings(settings, tenant="tenant-b-x1") as b,
    ):
        try:
            await a.append("shared", {"role": "user", "content": "a's secret"})
            assert await b.get_messages("shared") == []
            assert [r.session for r in await b.list_sessions()] == []
            await b.clear("shared")
            assert len(await a.get_messages("shared")) == 1
        finally:
            await a.delete("shared")
            await b.delete("shared")


async def test_an_error_never_quotes_the_command_it_refused(raw_redis: Redis, tenant: str) -> None:
    """redis-py quotes a failed pipeline command, arguments and all; ctxstore's errors do not."""
    from redis import exceptions as rex

    from ctxstore._redis.errors import translate

    key = f"{tenant}:string"
    await raw_redis.set(key, "x", ex=60)
    pipe = raw_redis.pipeline(transaction=False)
    pipe.hset(key, "field", "a secret message body")
    with pytest.raises(rex.ResponseError) as caught:
        await pipe.execute()
    assert "a secret message body" in str(caught.value)  # what redis-py says
    error = translate(caught.value, tenant=tenant, key=key)
    assert "a secret message body" not in str(error)
    assert "WRONGTYPE" in str(error)
    await raw_redis.delete(key)


async def test_a_burst_past_the_connection_limit_waits_for_a_connection(
    settings: Settings, tenant: str
) -> None:
    """More calls at once than max_connections: each waits its turn, none fails, none over."""
    if settings.redis_cluster:
        pytest.skip("redis-py's cluster client has no pool that waits: past the limit it fails")
    small = settings.model_copy(update={"max_connections": 4})
    async with ContextStore.from_settings(small, tenant=tenant) as store:
        results = await asyncio.gather(
            *(store.append(f"s{i % 5}", {"role": "user", "content": f"m{i}"}) for i in range(200)),
            *(store.view(f"s{i % 5}", token_budget=1_000) for i in range(50)),
            return_exceptions=True,
        )
        assert not [r for r in results if isinstance(r, BaseException)]
        assert sum([(await store.info(f"s{i}")).count for i in range(5)]) == 200
        pool = store._connection.client.connection_pool  # the client under test
        opened = len(pool._available_connections) + len(pool._in_use_connections)
        assert 1 <= opened <= 4
