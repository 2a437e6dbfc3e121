"""Hostile input on every write path: only ctxstore errors, and a refusal changes nothing.

Each example works on a session of its own (sometimes seeded with two
messages first), snapshots the session's keys in Redis (DUMP and expiry of
each), makes one call with arbitrary arguments, and then checks: an
exception is a ``CtxstoreError`` and the snapshot is unchanged; a success
wrote what it said (what get_messages returns is what was appended); and a
call whose every argument came from the valid side of its strategy is not
refused (a stale expected_seq excepted: that is a ConflictError).

The bugs this fuzzing found are pinned by the regression tests at the end,
which feed those inputs directly (each strategy that keeps away from one
names its test): nesting deeper than the recursion limit, a block type that
is not hashable, idempotency_keys that have no length, a view budget no
float holds, a TTL Redis cannot hold, integers over the int-to-str limit as
arguments (they crashed the interpreter inside hiredis), and tuples or
non-string keys in free-form fields (now refused: they would not come back
out equal).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from decimal import Decimal
from typing import Any

import hypothesis
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from redis.asyncio import Redis
from support.config import examples
from support.helpers import key_states

from ctxstore import (
    AppendResult,
    ConflictError,
    ContextStore,
    CtxstoreError,
    HistoryPage,
    InvalidIdError,
    InvalidInputError,
    RequestView,
    SessionNotFoundError,
    Settings,
    WriteResult,
)
from ctxstore._layout.formats import entry_order
from ctxstore.budget import MAX_BUDGET

FUZZ = hypothesis.settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

MAX_MESSAGE_BYTES = 16_384
SEED = [
    {"role": "system", "content": "seeded rules"},
    {"role": "user", "content": "seeded question"},
]
SEED_KEYS = ["seed-0", "seed-1"]

# The documented id rule, restated here rather than asked of the store.
_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")

# -- strategies ------------------------------------------------------------------------


def mostly(
    usual: st.SearchStrategy[Any], odd: st.SearchStrategy[Any], one_in: int = 4
) -> st.SearchStrategy[Any]:
    """``odd`` once in ``one_in`` draws, else ``usual``: most calls get far enough to write."""
    return st.integers(1, one_in).flatmap(lambda i: odd if i == one_in else usual)


ODD_TEXT = st.sampled_from(
    ["", " ", "\x00", "\x1e", "\x1f", "\x7f", "{a}", "a:b", "*?[", "..", "\ud800", "日本語", "🚀"]
)


def lorem(size: int) -> str:
    """Text of ``size`` characters that tokenizes fast (words, not one long run)."""
    return ("lorem ipsum dolor sit amet " * (size // 27 + 1))[:size]


VALID_BIG_TEXT = st.sampled_from([1_500, 6_000]).map(lorem)  # previews past 300 tokens
BIG_TEXT = VALID_BIG_TEXT | st.sampled_from([MAX_MESSAGE_BYTES + 1, 60_000]).map(lorem)
TEXT = mostly(st.text(max_size=30), ODD_TEXT | BIG_TEXT)
ODD_INTS = st.sampled_from([-(2**63), -1, 0, 1, 2, 3, 2**31, 2**53 + 1, 2**63, 2**64, 10**30])
INTS = st.integers() | ODD_INTS
FLOATS = st.floats() | st.sampled_from([math.nan, math.inf, -0.0, 1e308, 5e-324])
JSON_SCALARS = st.none() | st.booleans() | INTS | st.floats(allow_nan=False) | TEXT


class Opaque:
    """An object JSON does not know."""

    def __repr__(self) -> str:
        return "Opaque()"


NOT_JSON = (
    st.binary(max_size=6)
    | st.sets(st.integers(), max_size=2)
    | st.frozensets(st.text(max_size=2), max_size=2)
    | st.just(math.nan)
    | st.just(-math.inf)
    | st.complex_numbers(max_magnitude=4, allow_nan=False, allow_infinity=False)
    | st.builds(Opaque)
    | st.just(Decimal("1.5"))
)
# More digits than int-to-str allows: only ever inside messages, where json.dumps meets it
# first (see test_an_integer_too_long_for_str_is_refused_not_a_crash).
LONG_INT = st.just(5_000).map(lambda digits: 10**digits)
# JSON can carry these only by changing them: tuples become lists, keys become strings.
COERCED = st.tuples(JSON_SCALARS) | st.dictionaries(
    st.integers(-3, 3)
    | st.booleans()
    | st.none()
    | st.floats(allow_nan=False, allow_infinity=False),
    JSON_SCALARS,
    min_size=1,
    max_size=2,
)


def wild(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Anything built of ``leaves`` (shallow: see test_deeply_nested_message_is_refused)."""
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(st.text(max_size=6), inner, max_size=3)
            | st.tuples(inner, inner)
        ),
        max_leaves=8,
    )


WILD = wild(JSON_SCALARS | NOT_JSON | COERCED | LONG_INT)  # in messages
ARG_WILD = wild(JSON_SCALARS | NOT_JSON | COERCED)  # as keyword arguments
# idempotency_keys: sized values only (see test_idempotency_keys_of_the_wrong_type_are_refused).
SIZED_WILD = ARG_WILD.filter(lambda value: hasattr(value, "__len__"))

# Valid messages, by construction: JSON-native values, ids without control characters.
SAFE_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=60)
SAFE_ID = st.text(st.characters(exclude_categories=("Cs", "Cc")), min_size=1, max_size=12)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | SAFE_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(SAFE_TEXT, inner, max_size=3),
    max_leaves=6,
)
JSON_OBJECT = st.dictionaries(SAFE_TEXT, JSON_VALUES, max_size=3)
EXTRAS = st.fixed_dictionaries({}, optional={"name": SAFE_TEXT, "metadata": JSON_OBJECT})


@st.composite
def valid_message(draw: st.DrawFn) -> dict[str, Any]:
    """One message of any shape the message model accepts."""
    kind = draw(st.sampled_from(["text", "system", "blocks", "tool_calls", "tool", "results"]))
    message: dict[str, Any]
    if kind == "text":
        message = {"role": draw(st.sampled_from(["user", "assistant"])), "content": draw(SAFE_TEXT)}
    elif kind == "system":
        message = {
            "role": draw(st.sampled_from(["system", "developer"])),
            "content": draw(SAFE_TEXT),
        }
    elif kind == "blocks":
        role = draw(st.sampled_from(["user", "assistant"]))
        blocks: list[dict[str, Any]] = [{"type": "text", "text": draw(SAFE_TEXT)}]
        if draw(st.booleans()):
            blocks.append({"type": "image", "source": draw(JSON_OBJECT)})
        if draw(st.booleans()):
            blocks.append({"type": "document", "title": draw(SAFE_TEXT), "x": draw(JSON_VALUES)})
        if role == "assistant":
            blocks.insert(0, {"type": "thinking", "thinking": draw(SAFE_TEXT), "signature": "s"})
            ids = draw(st.lists(SAFE_ID, unique=True, max_size=2))
            blocks += [
                {"type": "tool_use", "id": i, "name": draw(SAFE_ID), "input": draw(JSON_OBJECT)}
                for i in ids
            ]
        message = {"role": role, "content": draw(st.permutations(blocks))}
    elif kind == "tool_calls":
        ids = draw(st.lists(SAFE_ID, unique=True, min_size=1, max_size=3))
        calls = [
            {
                "id": i,
                "type": "function",
                "function": {"name": draw(SAFE_ID), "arguments": draw(SAFE_TEXT)},
            }
            for i in ids
        ]
        message = {"role": "assistant", "content": draw(st.none() | SAFE_TEXT), "tool_calls": calls}
    elif kind == "tool":
        text_blocks = st.lists(st.builds(lambda t: {"type": "text", "text": t}, SAFE_TEXT))
        content = draw(SAFE_TEXT | VALID_BIG_TEXT | text_blocks)
        message = {"role": "tool", "tool_call_id": draw(SAFE_ID), "content": content}
    else:
        results = [
            {"type": "tool_result", "tool_use_id": i, "content": draw(SAFE_TEXT), "is_error": False}
            for i in draw(st.lists(SAFE_ID, min_size=1, max_size=2))
        ]
        message = {"role": draw(st.sampled_from(["user", "tool"])), "content": results}
        if message["role"] == "tool" and draw(st.booleans()):
            message["tool_call_id"] = draw(SAFE_ID)
    message.update(draw(EXTRAS))
    if draw(st.booleans()):
        message["x-extra"] = draw(JSON_VALUES)
    return message


_FIELDS = ["role", "content", "name", "tool_calls", "tool_call_id", "metadata", "x-extra"]
_BLOCK_FIELDS = ["type", "text", "id", "name", "input", "tool_use_id", "content", "source"]


@st.composite
def mutated_message(draw: st.DrawFn) -> dict[str, Any]:
    """A valid message with one to three fields (of it, or of its blocks) replaced or removed."""
    message = draw(valid_message())
    for _ in range(draw(st.integers(1, 3))):
        target = message
        content = message.get("content")
        if isinstance(content, list) and content and draw(st.booleans()):
            blocks = list(content)
            index = draw(st.integers(0, len(blocks) - 1))
            if not isinstance(blocks[index], dict):
                continue
            blocks[index] = target = dict(blocks[index])
            message["content"] = blocks
            field = draw(st.sampled_from(_BLOCK_FIELDS))
        else:
            field = draw(st.sampled_from(_FIELDS))
        if draw(st.booleans()):
            target.pop(field, None)
        elif target is not message and field == "type":
            # Hashable only (see test_a_block_type_that_is_not_hashable_is_refused).
            target[field] = draw(JSON_SCALARS | st.sampled_from(["tool_use", "tool_result"]))
        else:
            target[field] = draw(
                WILD | TEXT | st.sampled_from(["user", "tool", "text", "tool_use"])
            )
    return message


VALID_MESSAGES = st.lists(valid_message(), min_size=1, max_size=5)

# Drawn with a flag: True when the value came from the valid side of its strategy (the
# call must then not refuse it), False when it may be anything (valid by chance or not).
Tagged = tuple[Any, bool]
TAGGED_MESSAGE: st.SearchStrategy[Tagged] = st.integers(0, 3).flatmap(
    lambda i: (WILD, mutated_message(), mutated_message(), valid_message())[i].map(
        lambda message: (message, i == 3)
    )
)
TAGGED_MESSAGES: st.SearchStrategy[Tagged] = mostly(
    st.lists(TAGGED_MESSAGE, max_size=4).map(
        lambda drawn: ([m for m, _ in drawn], all(valid for _, valid in drawn))
    )
    # At most four: four of the largest valid messages stay under the session quota.
    | st.lists(valid_message(), min_size=1, max_size=4).map(lambda messages: (messages, True)),
    st.tuples(TAGGED_MESSAGE).map(lambda drawn: ((drawn[0][0],), drawn[0][1]))
    | WILD.map(lambda wild: (wild, False)),
)

# Mostly a fresh valid session (a valid id drawn is swapped for a fresh one), else hostile.
SESSIONS = mostly(st.just("fresh"), st.none() | st.text(max_size=12) | ODD_TEXT | ARG_WILD)
IDEMPOTENCY_KEY = mostly(st.none() | st.sampled_from(SEED_KEYS), TEXT | ARG_WILD, one_in=8)
EXPECTED_SEQ = mostly(st.none() | st.integers(0, 3), INTS | FLOATS | ARG_WILD, one_in=8)
FLAGS = mostly(st.booleans(), ARG_WILD, one_in=8)
ENTRY_IDS = mostly(
    st.sampled_from(["seed-0", "seed-1"]),
    st.sampled_from(["0-0", "1-1", "18446744073709551615-18446744073709551615"])
    | st.sampled_from(["18446744073709551616-0", "1-", "-1", "1-2-3", "٣-١"])
    | TEXT
    | ARG_WILD,
)
# set_ttl: the store takes at most a century; wild values up to 10**15 s (see
# test_a_ttl_redis_cannot_hold_changes_nothing), and the cap's edges.
TTL_CAP = 100 * 365 * 86_400
TTLS = mostly(
    st.none() | st.integers(60, 10**6),
    st.integers(max_value=10**15)
    | st.sampled_from([TTL_CAP, TTL_CAP + 1])
    | ODD_INTS.filter(lambda n: n <= 10**15)
    | ARG_WILD,
)
# view: at most 2**1000 (see test_a_view_budget_too_large_for_a_float_is_refused).
BUDGETS = mostly(
    st.none() | st.integers(1, 200_000),
    st.integers(min_value=-(2**1000), max_value=2**1000)
    | ODD_INTS
    | st.just(2**1000)
    | FLOATS
    | ARG_WILD,
)
LIMITS = mostly(st.integers(1, 4), INTS | FLOATS | ARG_WILD)


@st.composite
def idempotency_keys(draw: st.DrawFn, messages: Any) -> Any:
    """None, one key per message, or anything (sized)."""
    count = len(messages) if isinstance(messages, list | tuple) else 1
    return draw(
        mostly(
            st.none() | st.lists(IDEMPOTENCY_KEY, min_size=count, max_size=count),
            st.lists(IDEMPOTENCY_KEY, max_size=4) | SIZED_WILD,
        )
    )


# -- helpers ---------------------------------------------------------------------------


def coerced(value: Any) -> Any:
    """``value`` as JSON brings it back: tuples as lists, dict keys as strings."""
    if isinstance(value, list | tuple):
        return [coerced(v) for v in value]
    if isinstance(value, dict):
        return {_json_key(k): coerced(v) for k, v in value.items()}
    return value


def _json_key(key: Any) -> str:
    return key if isinstance(key, str) else json.dumps(key)


def is_valid_id(value: Any) -> bool:
    """The documented id rule: ASCII letters, digits, ``_.-``, not leading ``.-``, no ``..``."""
    return isinstance(value, str) and bool(_ID.fullmatch(value)) and ".." not in value


Snapshot = tuple[dict[str, tuple[Any, str]], dict[bytes, bytes]]


async def snapshot(raw: Redis, store: ContextStore, session: str) -> Snapshot:
    """Every key of the session (:func:`key_states`), and the meta hash."""
    keys = store.keys(session)
    return await key_states(raw, keys.all()), await raw.hgetall(keys.meta)


def is_seq(value: Any) -> bool:
    """An expected_seq the store takes (it may still be stale): None or 0 to 2**63-1."""
    return value is None or (type(value) is int and 0 <= value < 2**63)


def is_seed_keys(keys: Any, count: int) -> bool:
    """idempotency_keys from the valid side: None, or ``count`` distinct seed keys."""
    return keys is None or (
        isinstance(keys, list | tuple)
        and len(keys) == count
        and all(isinstance(k, str) and k in SEED_KEYS for k in keys)
        and len(set(keys)) == count
    )


def refused(result: Any, method: str, *, valid: bool, stale: bool = False) -> bool:
    """Whether ``result`` is a :class:`Refused`, once checked that the call may refuse.

    Args:
        result: What :meth:`Session.call` answered.
        method: The store method called.
        valid: Every argument came from the valid side of its strategy: the
            call must not be refused...
        stale: ...unless its expected_seq is stale and it had something to
            write: then it must be refused, with a ConflictError.
    """
    hypothesis.event(f"{method} arguments", "valid" if valid else "any")
    if valid and stale:
        assert isinstance(result, Refused), f"{method} with a stale expected_seq: {result!r}"
        assert isinstance(result.error, ConflictError), f"{method}: {result.error!r}"
    elif valid:
        assert not isinstance(result, Refused), f"valid {method} refused: {result.error!r}"
    return isinstance(result, Refused)


class Refused:
    """What a call that raised a ctxstore error (and changed nothing) answers."""

    def __init__(self, error: CtxstoreError) -> None:
        self.error = error


class Session:
    """One example's session: its id, what it was seeded with, and checked calls on it."""

    def __init__(self, store: ContextStore, raw: Redis, drawn: Any) -> None:
        self.store = store
        self.raw = raw
        # A drawn id that happens to be valid is swapped for a fresh one: each example
        # works on a session of its own.
        self.id = f"f{uuid.uuid4().hex}" if is_valid_id(drawn) else drawn
        self.valid = is_valid_id(self.id)
        self.seeded: list[AppendResult] = []

    @property
    def history(self) -> list[dict[str, Any]]:
        return SEED[: len(self.seeded)]

    async def seed(self, seeded: bool) -> None:
        if seeded and self.valid:
            self.seeded = await self.store.append_many(self.id, SEED, idempotency_keys=SEED_KEYS)

    async def snapshot(self) -> Snapshot:
        return await snapshot(self.raw, self.store, self.id)

    async def call(self, method: str, *args: Any, rewrite: bool = False, **kwargs: Any) -> Any:
        """Call ``store.method`` on the session; a ctxstore error must have changed nothing.

        Any other exception fails the test. An invalid id must be an
        InvalidIdError. ``rewrite``: the call takes the session's lease, and
        every acquisition grows the fencing number in meta (by design) and
        its release is recorded there, so those fields may change.

        Returns:
            The call's result, or a :class:`Refused`.
        """
        if not self.valid:
            with pytest.raises(InvalidIdError) as caught:
                await getattr(self.store, method)(self.id, *args, **kwargs)
            return Refused(caught.value)
        before = await self.snapshot()
        try:
            result = await getattr(self.store, method)(self.id, *args, **kwargs)
        except CtxstoreError as exc:
            hypothesis.event(f"{method} refused", type(exc).__name__)
            after = await self.snapshot()
            if not rewrite:
                assert after == before
                return Refused(exc)
            meta = self.store.keys(self.id).meta
            (dumps_before, meta_before), (dumps_after, meta_after) = before, after
            fence_before = int(meta_before.pop(b"fence", 0))
            fence_after = int(meta_after.pop(b"fence", 0))
            assert fence_after >= fence_before
            meta_before.pop(b"released", None)  # the last lease given back (lease_release.lua)
            meta_after.pop(b"released", None)
            assert meta_after == meta_before
            assert {k: v for k, v in dumps_after.items() if k != meta} == {
                k: v for k, v in dumps_before.items() if k != meta
            }
            if meta_before:
                assert dumps_after[meta][1] == dumps_before[meta][1]
            return Refused(exc)
        hypothesis.event(f"{method} done")
        return result

    async def assert_unwritten(self) -> None:
        """The session holds what it was seeded with."""
        assert await self.store.get_messages(self.id) == self.history


@pytest.fixture
async def fuzz_store(settings: Settings, tenant: str) -> AsyncIterator[ContextStore]:
    """A store with a small message cap, a session quota, early previews and no summaries."""
    fuzz_settings = settings.model_copy(
        update={
            "max_message_bytes": MAX_MESSAGE_BYTES,
            "session_bytes": 3 * MAX_MESSAGE_BYTES,
            "offload_threshold_tokens": 300,
            "offload_preview_tokens": 60,
            "summary_trigger_tokens": 0,
        }
    )
    async with ContextStore.from_settings(fuzz_settings, tenant=tenant) as store:
        yield store


# -- appends ---------------------------------------------------------------------------


@FUZZ
@given(
    session=SESSIONS,
    seeded=st.booleans(),
    tagged_message=TAGGED_MESSAGE,
    key=IDEMPOTENCY_KEY,
    expected_seq=EXPECTED_SEQ,
    pinned=FLAGS,
)
async def test_append_takes_anything(
    fuzz_store: ContextStore,
    raw_redis: Redis,
    session: Any,
    seeded: bool,
    tagged_message: Tagged,
    key: Any,
    expected_seq: Any,
    pinned: Any,
) -> None:
    """append: a ctxstore error and nothing written, or the message stored as given.

    Valid arguments are never refused, except with a ConflictError when
    expected_seq is stale and the key is not one already appended.
    """
    message, valid_message = tagged_message
    s = Session(fuzz_store, raw_redis, session)
    await s.seed(seeded)
    result = await s.call(
        "append", message, idempotency_key=key, expected_seq=expected_seq, pinned=pinned
    )
    valid = (
        s.valid
        and valid_message
        and (key is None or key in SEED_KEYS)
        and is_seq(expected_seq)
        and type(pinned) is bool
    )
    fresh = key not in SEED_KEYS[: len(s.seeded)]
    stale = fresh and expected_seq not in (None, len(s.seeded))
    if refused(result, "append", valid=valid, stale=stale):
        return
    assert isinstance(result, AppendResult)
    if result.duplicate:
        assert key in SEED_KEYS[: len(s.seeded)]
        original = s.seeded[SEED_KEYS.index(key)]
        assert (result.entry_id, result.seq) == (original.entry_id, original.seq)
        assert await fuzz_store.get_messages(s.id) == s.history
    else:
        assert result.seq == len(s.seeded) + 1
        assert await fuzz_store.get_messages(s.id) == [*s.history, coerced(message)]


@FUZZ
@given(
    session=SESSIONS,
    seeded=st.booleans(),
    messages_and_keys=TAGGED_MESSAGES.flatmap(
        lambda tagged: st.tuples(st.just(tagged), idempotency_keys(tagged[0]))
    ),
    expected_seq=EXPECTED_SEQ,
    pinned=FLAGS,
)
async def test_append_many_takes_anything(
    fuzz_store: ContextStore,
    raw_redis: Redis,
    session: Any,
    seeded: bool,
    messages_and_keys: tuple[Tagged, Any],
    expected_seq: Any,
    pinned: Any,
) -> None:
    """append_many: a ctxstore error and nothing written, or every new message stored in order.

    Valid arguments are never refused, except with a ConflictError when
    expected_seq is stale and one of the messages is new.
    """
    (messages, valid_messages), keys = messages_and_keys
    s = Session(fuzz_store, raw_redis, session)
    await s.seed(seeded)
    results = await s.call(
        "append_many", messages, idempotency_keys=keys, expected_seq=expected_seq, pinned=pinned
    )
    valid = (
        s.valid
        and valid_messages
        and is_seed_keys(keys, len(messages))
        and is_seq(expected_seq)
        and type(pinned) is bool
    )
    stale = False
    if valid:  # a stale expected_seq refuses a batch that has a message not appended yet
        appended = SEED_KEYS[: len(s.seeded)]
        fresh = [k not in appended for k in keys] if keys is not None else [True] * len(messages)
        stale = any(fresh) and expected_seq not in (None, len(s.seeded))
    if refused(results, "append_many", valid=valid, stale=stale):
        return
    assert isinstance(results, list) and len(results) == len(messages)
    fresh = [coerced(m) for m, r in zip(messages, results, strict=True) if not r.duplicate]
    for r in results:
        assert isinstance(r, AppendResult)
        if r.duplicate:
            assert r.entry_id in {seeded.entry_id for seeded in s.seeded}
    assert await fuzz_store.get_messages(s.id) == [*s.history, *fresh]


# -- rewrites --------------------------------------------------------------------------


@FUZZ
@given(session=SESSIONS, seeded=st.booleans(), tagged=TAGGED_MESSAGES, expected_seq=EXPECTED_SEQ)
async def test_replace_takes_anything(
    fuzz_store: ContextStore,
    raw_redis: Redis,
    session: Any,
    seeded: bool,
    tagged: Tagged,
    expected_seq: Any,
) -> None:
    """replace: a ctxstore error and nothing written, or exactly the new history stored.

    Valid arguments are never refused, except with a ConflictError when
    expected_seq is stale.
    """
    messages, valid_messages = tagged
    s = Session(fuzz_store, raw_redis, session)
    await s.seed(seeded)
    result = await s.call("replace", messages, expected_seq=expected_seq, rewrite=True)
    valid = s.valid and valid_messages and is_seq(expected_seq)
    stale = expected_seq not in (None, len(s.seeded))
    if refused(result, "replace", valid=valid, stale=stale):
        return
    assert isinstance(result, WriteResult)
    assert (result.count, result.superseded) == (len(messages), len(s.seeded))
    assert await fuzz_store.get_messages(s.id) == [coerced(m) for m in messages]


# -- the other session calls -----------------------------------------------------------


@FUZZ
@given(
    session=SESSIONS,
    seeded=st.booleans(),
    call=st.one_of(
        st.tuples(st.just("pin"), ENTRY_IDS, FLAGS),
        st.tuples(st.just("set_ttl"), TTLS),
        st.tuples(st.just("delete")),
        st.tuples(st.just("view"), BUDGETS),
        st.tuples(st.just("clear"), EXPECTED_SEQ),
        st.tuples(st.just("read"), st.none() | ENTRY_IDS, LIMITS),
    ),
)
async def test_session_calls_take_anything(
    fuzz_store: ContextStore, raw_redis: Redis, session: Any, seeded: bool, call: tuple[Any, ...]
) -> None:
    """pin, set_ttl, delete, view, clear, read: a ctxstore error and nothing written, or as said."""
    s = Session(fuzz_store, raw_redis, session)
    await s.seed(seeded)
    ids = {f"seed-{i}": r.entry_id for i, r in enumerate(s.seeded)}

    def entry(drawn: Any) -> Any:
        """A drawn "seed-N" names the seeded entry N; anything else is itself."""
        return ids.get(drawn, drawn) if isinstance(drawn, str) else drawn

    method, *args = call
    if method == "pin":
        entry_id, flag = entry(args[0]), args[1]
        found = await s.call("pin", entry_id, flag)
        if not isinstance(found, Refused):
            assert type(flag) is bool  # pinned takes a bool, never a truthy value
            assert found == (entry_id in ids.values())
            await s.assert_unwritten()
            if entry_id == ids.get("seed-1"):
                assert (entry_id in (await fuzz_store.info(s.id)).pinned) == bool(flag)
        elif entry_id in ids.values() and type(flag) is bool:
            pytest.fail(f"pin of a stored entry was refused: {found.error!r}")
    elif method == "set_ttl":
        seconds = args[0]
        done = await s.call("set_ttl", seconds)
        valid = seconds is None or (type(seconds) is int and 0 < seconds <= TTL_CAP)
        if isinstance(done, Refused):
            assert not (s.seeded and valid), f"valid set_ttl refused: {done.error!r}"
            if s.valid and valid:
                assert isinstance(done.error, SessionNotFoundError)
            return
        assert s.seeded and valid
        for key in (fuzz_store.keys(s.id).log, fuzz_store.keys(s.id).meta):
            ttl = await raw_redis.pttl(key)
            if seconds is None:
                assert ttl == -1
            else:  # a TTL of a few seconds may run out on a slow machine: not a failure
                assert ttl <= seconds * 1000 and (ttl > 0 or seconds < 60)
        if seconds is None or seconds >= 60:
            await s.assert_unwritten()
    elif method == "delete":
        deleted = await s.call("delete")
        if not isinstance(deleted, Refused):
            assert deleted == bool(s.seeded)
            dumps, _ = await s.snapshot()
            # Nothing is left but the tombstone, which expires (it keeps seq and epoch
            # going), and the idempotency records (the delete's own reply among them).
            tomb = dumps.pop(fuzz_store.keys(s.id).gone)[1]
            assert dumps.pop(fuzz_store.keys(s.id).idem)[1] == "expiring"
            assert {state for _, state in dumps.values()} == {"missing"}
            assert tomb == ("expiring" if s.seeded else "missing")
        else:
            assert not s.valid, f"delete refused: {deleted.error!r}"
    elif method == "view":
        budget = args[0]
        before = await s.snapshot() if s.valid else None
        view = await s.call("view", token_budget=budget)
        valid = budget is None or (type(budget) is int and 0 < budget <= MAX_BUDGET)
        if isinstance(view, Refused):
            assert not (s.valid and valid), f"valid view refused: {view.error!r}"
            return
        assert isinstance(view, RequestView) and valid
        assert all(isinstance(m, dict) for m in view.messages)
        assert view.stats.history_messages == len(s.seeded)
        # A view writes nothing but its anchor (where the view starts, kept so that
        # every pod sends the same bytes): moved when the view would overflow.
        after = await s.snapshot()
        assert before is not None
        anchor = fuzz_store.keys(s.id).anchor
        assert {k: v for k, v in after[0].items() if k != anchor} == {
            k: v for k, v in before[0].items() if k != anchor
        }
        assert after[1] == before[1]
    elif method == "clear":
        expected_seq = args[0]
        result = await s.call("clear", expected_seq=expected_seq, rewrite=True)
        valid = s.valid and is_seq(expected_seq)
        stale = expected_seq not in (None, len(s.seeded))
        if not refused(result, "clear", valid=valid, stale=stale):
            assert isinstance(result, WriteResult) and result.superseded == len(s.seeded)
            assert await fuzz_store.get_messages(s.id) == []
    else:
        after, limit = entry(args[0]), args[1]
        page = await s.call("read", after=after, limit=limit)
        valid = (
            s.valid
            and (after is None or after in ids.values() or after in ("0-0", "1-1"))
            and type(limit) is int
            and 0 < limit <= 10_000
        )
        if refused(page, "read", valid=valid):
            return
        assert isinstance(page, HistoryPage)
        assert type(limit) is int and 0 < limit <= 10_000
        history = [(r.entry_id, m) for r, m in zip(s.seeded, s.history, strict=True)]
        if after is not None:
            history = [(i, m) for i, m in history if entry_order(i) > entry_order(after)]
        assert [(m.entry_id, m.message) for m in page.messages] == history[:limit]
        assert page.next_after == (page.messages[-1].entry_id if len(history) >= limit else None)
        await s.assert_unwritten()


# -- valid input round-trips -----------------------------------------------------------


@FUZZ
@given(first=VALID_MESSAGES, second=VALID_MESSAGES, single=valid_message())
async def test_valid_messages_round_trip_exactly(
    fuzz_store: ContextStore,
    first: list[dict[str, Any]],
    second: list[dict[str, Any]],
    single: dict[str, Any],
) -> None:
    """Valid messages are accepted by append_many, append and replace, and come back equal."""
    session = f"v{uuid.uuid4().hex}"
    await fuzz_store.append_many(session, first)
    await fuzz_store.append(session, single, pinned=True)
    assert await fuzz_store.get_messages(session) == [*first, single]
    page = await fuzz_store.read(session, limit=2)
    assert [m.message for m in page.messages] == [*first, single][:2]
    await fuzz_store.replace(session, second)
    assert await fuzz_store.get_messages(session) == second
    view = await fuzz_store.view(session, token_budget=100_000)
    assert view.stats.history_messages == len(second)


# -- bugs the strategies above keep out of their way -----------------------------------


async def test_deeply_nested_message_is_refused(fuzz_store: ContextStore) -> None:
    """A message nested 5,000 levels deep is an InvalidMessageError, not a RecursionError."""
    nested: list[Any] = []
    for _ in range(5_000):
        nested = [nested]
    with pytest.raises(CtxstoreError):
        await fuzz_store.append("s", {"role": "user", "content": "x", "metadata": {"n": nested}})


@pytest.mark.parametrize("kind", [[], {}, ["text"]], ids=["empty-list", "dict", "list"])
async def test_a_block_type_that_is_not_hashable_is_refused(
    fuzz_store: ContextStore, kind: Any
) -> None:
    """A content block with "type": [] is an InvalidMessageError, not a TypeError."""
    with pytest.raises(CtxstoreError):
        await fuzz_store.append("s", {"role": "user", "content": [{"type": kind, "text": ""}]})


@pytest.mark.parametrize(
    "budget",
    [pytest.param(10**400, id="10**400"), pytest.param(-(10**5_000), id="-10**5000")],
)
async def test_a_view_budget_too_large_for_a_float_is_refused(
    fuzz_store: ContextStore, budget: int
) -> None:
    """view(token_budget=<an integer no float holds>) is refused as bad input, not a crash."""
    await fuzz_store.append("s", {"role": "user", "content": "hi"})
    with pytest.raises(InvalidInputError, match="token_budget"):
        await fuzz_store.view("s", token_budget=budget)


async def test_a_ttl_redis_cannot_hold_changes_nothing(
    fuzz_store: ContextStore, raw_redis: Redis
) -> None:
    """set_ttl(2**62) is refused as bad input and leaves the session's keys as they were."""
    await fuzz_store.append("s", {"role": "user", "content": "hi"})
    before = await snapshot(raw_redis, fuzz_store, "s")
    with pytest.raises(InvalidInputError):
        await fuzz_store.set_ttl("s", 2**62)
    assert await snapshot(raw_redis, fuzz_store, "s") == before


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({"x-extra": (1, 2)}, id="tuple"),
        pytest.param({"metadata": {"a": {1: "one"}}}, id="int-key"),
        pytest.param({"x-extra": {None: 0, True: 1}}, id="none-and-bool-keys"),
    ],
)
async def test_a_message_json_would_change_is_refused_or_kept(
    fuzz_store: ContextStore, extra: dict[str, Any]
) -> None:
    """A message JSON cannot carry as it is is refused, or else comes back equal."""
    message = {"role": "user", "content": "x", **extra}
    try:
        await fuzz_store.append("s", message)
    except CtxstoreError:
        return
    assert await fuzz_store.get_messages("s") == [message]


@pytest.mark.parametrize("keys", [False, 0, 1.5, object()], ids=["bool", "int", "float", "obj"])
async def test_idempotency_keys_of_the_wrong_type_are_refused(
    fuzz_store: ContextStore, raw_redis: Redis, keys: Any
) -> None:
    """append_many(idempotency_keys=<not a list>) is an InvalidInputError and writes nothing."""
    with pytest.raises(InvalidInputError):
        await fuzz_store.append_many("s", [{"role": "user", "content": "x"}], idempotency_keys=keys)
    assert await fuzz_store.get_messages("s") == []


# Exits 0 only when the call is refused with an InvalidInputError and the session is
# unchanged; 3 when the call was accepted; 1 on any other exception.
_CALL_WITH_A_LONG_INT = """
import asyncio, sys
from ctxstore import ContextStore, InvalidInputError, Settings

async def main() -> None:
    url, prefix, tenant, call = sys.argv[1:]
    settings = Settings(redis_url=url, key_prefix=prefix, retry_attempts=0)
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        await store.append("s", {"role": "user", "content": "x"})
        try:
            if call == "append":
                await store.append("s", {"role": "user", "content": "y"}, expected_seq=10**5000)
            else:
                await store.set_ttl("s", 10**5000)
        except InvalidInputError as exc:
            print("refused:", type(exc).__name__)
        else:
            print("accepted")
            sys.exit(3)
        assert await store.get_messages("s") == [{"role": "user", "content": "x"}]
        assert (await store.info("s")).ttl_seconds is None

asyncio.run(main())
"""


@pytest.mark.parametrize("call", ["append", "set_ttl"])
def test_an_integer_too_long_for_str_is_refused_not_a_crash(
    settings: Settings, tenant: str, call: str
) -> None:
    """A 5,000-digit expected_seq or TTL is an InvalidInputError; the process survives.

    In a subprocess: the crash this pins killed the interpreter.
    """
    assert settings.redis_url is not None
    argv = [settings.redis_url, settings.key_prefix, tenant, call]
    done = subprocess.run(
        [sys.executable, "-c", _CALL_WITH_A_LONG_INT, *argv],
        capture_output=True,
        timeout=60,
        check=False,
    )
    report = (done.returncode, done.stdout.decode(), done.stderr.decode()[-2000:])
    assert done.returncode != 3, f"the call was not refused: {report}"
    assert done.returncode == 0, report
    assert done.stdout.decode().splitlines() == ["refused: InvalidInputError"], report


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda s: s.list_sessions(before_ms=math.nan), id="list-before-nan"),
        pytest.param(lambda s: s.list_sessions(before_ms="x"), id="list-before-str"),
        pytest.param(lambda s: s.lease("s", ttl_s=math.nan), id="lease-ttl-nan"),
        pytest.param(lambda s: s.lease("s", ttl_s=math.inf), id="lease-ttl-inf"),
        pytest.param(lambda s: s.lease("s", wait_s="1"), id="lease-wait-str"),
    ],
)
async def test_other_calls_refuse_bad_arguments_with_ctxstore_errors(
    fuzz_store: ContextStore, call: Callable[[ContextStore], Awaitable[Any]]
) -> None:
    """list_sessions and lease refuse NaN, infinity and strings with a ctxstore error."""
    with pytest.raises(CtxstoreError):
        await call(fuzz_store)


def test_the_id_rule_here_is_the_documented_one() -> None:
    """The test's restatement of the id rule agrees with the examples the docs give."""
    assert is_valid_id("a") and is_valid_id("A_b.c-9") and is_valid_id("_" * 128)
    assert not any(
        is_valid_id(v) for v in ["", ".a", "-a", "a..b", "a:b", "{a}", "a b", "é", "a" * 129, 3]
    )


@FUZZ
@given(candidate=st.text(max_size=12) | ODD_TEXT | st.from_regex(_ID, fullmatch=True) | ARG_WILD)
async def test_the_store_accepts_exactly_the_documented_ids(
    fuzz_store: ContextStore, candidate: Any
) -> None:
    """keys() accepts a session id exactly when the documented rule does, else InvalidIdError."""
    if is_valid_id(candidate):
        fuzz_store.keys(candidate)
    else:
        with pytest.raises(InvalidIdError):
            fuzz_store.keys(candidate)


HOSTILE_IDS = ["a}b", "{t}", "a:b", "", "é", "../x", "a b", "x" * 129, None, 7, b"s"]


@pytest.mark.parametrize("session", HOSTILE_IDS)
async def test_every_call_refuses_a_hostile_session_id(
    fuzz_store: ContextStore, session: Any
) -> None:
    """Every write path raises InvalidIdError for a hostile id, and the tenant lists nothing."""
    message = {"role": "user", "content": "x"}
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: fuzz_store.append(session, message),
        lambda: fuzz_store.append_many(session, [message]),
        lambda: fuzz_store.replace(session, [message]),
        lambda: fuzz_store.pin(session, "1-1"),
        lambda: fuzz_store.set_ttl(session, 60),
        lambda: fuzz_store.delete(session),
        lambda: fuzz_store.view(session, token_budget=1_000),
        lambda: fuzz_store.clear(session, expected_seq=0),
        lambda: fuzz_store.read(session, after=None, limit=10),
    ]
    for call in calls:
        with pytest.raises(InvalidIdError):
            await call()
    assert await fuzz_store.list_sessions() == []
