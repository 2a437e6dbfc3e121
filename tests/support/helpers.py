"""Messages and conversations for tests: realistic shapes, built deterministically.

One place for the builders every test file uses: single messages in OpenAI
Chat style (``oa_*``) and Anthropic style (``an_*``), a few constants, whole
conversations, and :func:`paired`, which checks a view's tool pairs by id;
and :func:`key_states`, what a set of keys holds, to show a refused write wrote nothing;
and :func:`loop_until`, which runs the event loop a turn at a time until a condition holds.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ctxstore import ContextStore, RequestView, Settings
from ctxstore._layout.formats import call_ids, result_ids
from ctxstore._redis.functions import load_functions

if TYPE_CHECKING:
    from redis.asyncio import Redis


async def load_library(url: str) -> None:
    """Load this version's Functions library on ``url``, as `ctxstore functions load` does."""
    async with ContextStore.from_url(url, "ops") as loader:
        await load_functions(loader._connection)


def private_settings(url: str, prefix: str, **changes: Any) -> Settings:
    """Settings on a private Redis, by EVALSHA (it holds no library), under ``prefix``."""
    return Settings(
        redis_url=url,
        key_prefix=prefix,
        queue_name=f"{prefix}:summaries",
        script_mode="eval",
        **changes,
    )


USER = {"role": "user", "content": "hello"}
SYSTEM = {"role": "system", "content": "You are a careful agent."}


def system(text: str = "be careful") -> dict[str, Any]:
    """A system message."""
    return {"role": "system", "content": text}


def user(text: str = "hi") -> dict[str, Any]:
    """A user message."""
    return {"role": "user", "content": text}


def assistant(text: str = "ok") -> dict[str, Any]:
    """An assistant message."""
    return {"role": "assistant", "content": text}


def oa_call(*ids: str, text: str | None = None) -> dict[str, Any]:
    """An OpenAI-style assistant message calling tools ``ids`` in parallel."""
    calls = [
        {"id": c, "type": "function", "function": {"name": "read", "arguments": "{}"}} for c in ids
    ]
    return {"role": "assistant", "content": text, "tool_calls": calls}


def oa_result(cid: str, text: str = "result") -> dict[str, Any]:
    """An OpenAI-style tool message answering ``cid``."""
    return {"role": "tool", "tool_call_id": cid, "content": text}


def an_call(*ids: str, text: str | None = None) -> dict[str, Any]:
    """An Anthropic-style assistant message with ``tool_use`` blocks ``ids``."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    blocks += [{"type": "tool_use", "id": c, "name": "read", "input": {}} for c in ids]
    return {"role": "assistant", "content": blocks}


def an_result(*ids: str, text: str | None = None) -> dict[str, Any]:
    """An Anthropic-style user message with ``tool_result`` blocks for ``ids``."""
    blocks: list[dict[str, Any]] = [
        {"type": "tool_result", "tool_use_id": c, "content": "result"} for c in ids
    ]
    if text:
        blocks.append({"type": "text", "text": text})
    return {"role": "user", "content": blocks}


def conversation(turns: int, *, tool_every: int = 3, parallel: int = 2) -> list[dict[str, Any]]:
    """A tool-using conversation: a system prompt, then user/assistant turns.

    Every ``tool_every``-th turn goes through ``parallel`` tool calls.
    """
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful agent."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"step {turn}: inspect the repository"})
        if turn % tool_every == 0:
            calls = [
                {
                    "id": f"call_{turn}_{i}",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": f'{{"path": "f{turn}_{i}.py"}}'},
                }
                for i in range(parallel)
            ]
            messages.append({"role": "assistant", "content": None, "tool_calls": calls})
            messages.extend(
                {"role": "tool", "tool_call_id": c["id"], "content": f"contents of {c['id']} " * 20}
                for c in calls
            )
        messages.append({"role": "assistant", "content": f"done with step {turn}"})
    return messages


def turn(i: int) -> dict[str, Any]:
    """Turn ``i`` of a plain conversation (38 cl100k tokens, no tool calls)."""
    role = "user" if i % 2 == 0 else "assistant"
    return {
        "role": role,
        "content": f"turn {i}: " + "the quick brown fox jumps over the lazy dog " * 3,
    }


async def append_until_due(store: ContextStore, session: str, start: int = 0) -> int:
    """Append turns from ``start`` until one raises the summary flag; return the next turn."""
    for i in range(start, start + 100):
        if (await store.append(session, turn(i))).summary_due:
            return i + 1
    raise AssertionError("no append raised the summary flag")


def paired(messages: list[dict[str, Any]]) -> int:
    """Check a view's tool pairs by id; return how many pairs it holds.

    Every result answers a call made by an earlier message, in the block of
    results right after that message (or after a run of Responses call
    items, which make parallel calls one item each); every call is answered
    exactly once.

    Raises:
        AssertionError: A result with no call before it, a result separated
            from its call, a call answered twice or never.
    """
    open_calls: set[str] = set()  # calls of the last calling message, not yet answered
    answered: set[str] = set()
    made: set[str] = set()
    chaining = False  # the last message was a Responses call item
    for message in messages:
        results = result_ids(message)
        if results:
            for rid in results:
                assert rid in open_calls, f"result {rid} does not follow its call"
                open_calls.discard(rid)
                answered.add(rid)
            chaining = False
            continue
        item = "role" not in message
        if item and message.get("type") == "reasoning":  # sent with the item after it
            assert chaining or not open_calls, f"calls {sorted(open_calls)} are not answered"
            chaining = True
            continue
        calls = call_ids(message)
        if not (chaining and item and calls):
            assert not open_calls, f"calls {sorted(open_calls)} are not answered right after"
            open_calls = set()
        made.update(calls)
        open_calls |= set(calls)
        chaining = item and bool(calls)
    assert not open_calls, f"calls {sorted(open_calls)} are never answered"
    assert made == answered
    return len(answered)


async def key_states(raw: Redis, keys: list[str]) -> dict[str, tuple[Any, str]]:
    """Each key's value and whether it expires ("missing", "persistent" or "expiring").

    A hash's value is its fields, sorted: its DUMP lists them in the order of its
    table, which a read may change (a lookup moves an incremental rehash on), and
    a session's meta is in the hashtable encoding. Any other key's is its DUMP.
    """
    pipe = raw.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
        pipe.pttl(key)
    replies = await pipe.execute()
    kinds = [(k if isinstance(k, str) else k.decode()) for k in replies[::2]]
    pipe = raw.pipeline(transaction=False)
    for key, kind in zip(keys, kinds, strict=True):
        if kind == "hash":
            pipe.hgetall(key)
        else:
            pipe.dump(key)
    values = await pipe.execute()
    states = {-2: "missing", -1: "persistent"}
    return {
        key: (
            sorted(value.items()) if kind == "hash" else value,
            states.get(ttl, "expiring"),
        )
        for key, kind, value, ttl in zip(keys, kinds, values, replies[1::2], strict=True)
    }


def ttl_span(ttl_ms: int) -> int:
    """The most a session's keys last after a write, for a TTL of ``ttl_ms``.

    An append moves their expiry only when it is due, to the TTL and a tenth
    more, at most a minute (append.lua's ``stretch``).
    """
    return ttl_ms + min(ttl_ms // 10, 60_000)


async def loop_until(condition: Callable[[], Any]) -> None:
    """Let the event loop run, a turn at a time, until ``condition()`` holds.

    For tests that choose the interleaving of tasks: no time passes, only turns.
    """
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


def msg(tag: str, role: str = "user") -> dict[str, Any]:
    """A message of ``role`` tagged ``tag`` (a sentence long, so that it has tokens)."""
    return {"role": role, "content": f"{tag}: the quick brown fox jumps over the lazy dog"}


def dumped(view: RequestView) -> list[str]:
    """What a view sends, one canonical JSON line a message (to compare two views byte for byte)."""
    return [json.dumps(m, sort_keys=True) for m in view.messages]


def numbered(i: int) -> dict[str, Any]:
    """The ``i``-th of a run of user messages: ``message {i}``."""
    return {"role": "user", "content": f"message {i}"}
