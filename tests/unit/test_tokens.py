"""Token counting: once per message, cl100k offline, opaque payloads skipped."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from support.helpers import an_call, an_result

from ctxstore import ConfigurationError, ContextStore, Settings, TiktokenCounter, count_message
from ctxstore.testing import WordCounter
from ctxstore.tokens import (
    IMAGE_TOKENS,
    MESSAGE_OVERHEAD,
    PART_OVERHEAD,
    checked,
    safety_factor,
)


def test_tiktoken_counts_cl100k_offline() -> None:
    """The bundled cl100k encoding counts without the network."""
    counter = TiktokenCounter()
    assert counter.count("hello world") == 2
    assert counter.count("") == 0


def test_message_count_includes_text_tools_and_overhead() -> None:
    """Text, tool names and arguments are counted, plus framing."""
    counter = WordCounter()
    message = {
        "role": "assistant",
        "content": "two words",
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "grep", "arguments": "a b"}}
        ],
    }
    # words: role 1, content 2, call id 1, name 1, arguments 2
    assert count_message(counter, message) == MESSAGE_OVERHEAD + PART_OVERHEAD + 7


def test_images_and_signatures_are_not_tokenized() -> None:
    """Base64 images are estimated and thinking signatures skipped."""
    counter = WordCounter()
    huge = "A " * 100_000
    message = {
        "role": "user",
        "content": [
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": huge},
            },
            {"type": "thinking", "thinking": "one", "signature": huge},
        ],
    }
    assert count_message(counter, message) < IMAGE_TOKENS + 50


def test_safety_factor_by_family() -> None:
    """A model name picks the first family it contains; otherwise 1.0."""
    factors = {"claude": 1.4, "gemini": 1.2}
    assert safety_factor(factors, "claude-opus-4") == 1.4
    assert safety_factor(factors, "models/GEMINI-2.5") == 1.2
    assert safety_factor(factors, "gpt-4o") == 1.0
    assert safety_factor(factors, None) == 1.0


def test_images_inside_a_tool_result_are_estimated_like_top_level_ones() -> None:
    """An image in a tool_result's content list costs the per-image estimate, not ~0."""
    counter = WordCounter()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}
    text = {"type": "text", "text": "two words"}

    def result(*blocks: dict[str, object]) -> dict[str, object]:
        return {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "c", "content": list(blocks)}],
        }

    without = count_message(counter, result(text))
    assert count_message(counter, result(text, image)) == without + IMAGE_TOKENS
    assert count_message(counter, result(image, text, image)) == without + 2 * IMAGE_TOKENS
    top = {"role": "user", "content": [image]}
    assert count_message(counter, result(image)) >= count_message(counter, top) - PART_OVERHEAD


# -- a caller's counter ----------------------------------------------------------------
# Counts are stored as integers. The append script once turned any count into a
# Lua number; since it stores the count as sent, a counter answering 7.0 left
# t=b"7.0" in the stream and the session unreadable (found by an attack).


class FloatCounter:
    """Counts words, as a float: a whole number of the wrong type."""

    def count(self, text: str) -> float:
        return float(len(text.split()))


async def test_a_whole_float_token_count_is_stored_as_an_integer(
    settings: Settings, tenant: str
) -> None:
    """Entries appended with a counter answering ``7.0`` read back, view, tail and fork."""
    counter = FloatCounter()
    async with ContextStore.from_settings(settings, tenant=tenant, counter=counter) as store:
        messages = [
            {"role": "system", "content": "be careful"},  # its keep copy carries the count too
            {"role": "user", "content": "hello there"},
            an_call("c1"),  # an entry with call ids: the table path of the script
            an_result("c1", text="done"),
        ]
        for message in messages:
            await store.append("s", message)
        assert await store.get_messages("s") == messages
        tail = await store.tail("s", 10)
        assert all(type(m.tokens) is int for m in tail)
        info = await store.info("s")
        assert info.tokens == sum(m.tokens for m in tail)
        view = await store.view("s", token_budget=2_000)
        assert view.messages == messages
        forked = await store.fork("s", "s-fork")
        assert forked.count == len(messages)


class Answers:
    """A counter that answers one fixed value, whatever the text."""

    def __init__(self, value: object) -> None:
        self.value = value

    def count(self, text: str) -> object:
        return self.value


def test_a_whole_number_of_another_type_is_taken_as_an_int() -> None:
    assert checked(Answers(7.0)).count("x") == 7  # type: ignore[arg-type]
    assert type(checked(Answers(7.0)).count("x")) is int  # type: ignore[arg-type]
    assert checked(Answers(0)).count("x") == 0  # type: ignore[arg-type]
    tiktoken_counter = TiktokenCounter()
    assert checked(tiktoken_counter) is tiktoken_counter  # trusted: no extra call


@pytest.mark.parametrize("value", [7.5, -1, -2.0, "7", True, None, float("nan"), float("inf")])
async def test_a_count_that_is_not_a_whole_number_is_refused_before_anything_is_written(
    settings: Settings, tenant: str, raw_redis: Redis, value: object
) -> None:
    counter = Answers(value)
    async with ContextStore.from_settings(
        settings,
        tenant=tenant,
        counter=counter,  # type: ignore[arg-type]
    ) as store:
        with pytest.raises(ConfigurationError, match="whole number"):
            await store.append("s", {"role": "user", "content": "hello"})
        assert await raw_redis.exists(*store.keys("s").all()) == 0
