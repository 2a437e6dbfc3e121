"""Messages: the shapes agents store, checked before anything is written.

A message goes in as a dict and comes back out equal: the store keeps the
dict the caller gave (as JSON), unknown keys and all, after checking it
against the model below. The model accepts the shapes agents use:

- OpenAI Chat: ``tool_calls`` on an assistant message, and ``role: tool``
  messages carrying ``tool_call_id``;
- Amplifier (what its orchestrators write, after amplifier-core's message
  models): the same roles, a tool call written ``{"id", "tool",
  "arguments"}`` (its arguments a dict), and content blocks as those models
  dump them: ``tool_call`` blocks repeating the message's calls (one call,
  however many times its id is written), ``tool_result`` blocks naming
  their call by ``tool_call_id``, ``thinking`` blocks holding ``text``;
- Anthropic Messages: content blocks (``text``, ``image``, ``tool_use``,
  ``tool_result``, ``thinking``, ``redacted_thinking``); block types it does
  not know (``document``, ``reasoning``, server tools...) are kept as they are;
- OpenAI Responses items (what the OpenAI Agents SDK stores): ``message``
  items with content parts, ``function_call`` / ``function_call_output``
  paired by ``call_id``, ``reasoning`` and the other item types (see
  :mod:`ctxstore._layout.formats`); an item has a ``type`` and no ``role``, and the
  fields that pair it are checked. Item types it does not know are kept as
  they are.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    model_validator,
)
from pydantic import ValidationError as PydanticValidationError
from pydantic_core import from_json

from ctxstore._layout.formats import (
    APPROVAL_REQUEST,
    APPROVAL_RESPONSE,
    CALL_ITEMS,
    REASONING,
    RESULT_ITEMS,
    call_ids,
    item_type,
    result_ids,
)
from ctxstore.errors import InvalidMessageError, MessageTooLargeError

__all__ = [
    "Checked",
    "ImageBlock",
    "Message",
    "RedactedThinkingBlock",
    "TextBlock",
    "ThinkingBlock",
    "ToolCall",
    "ToolCallBlock",
    "ToolResultBlock",
    "ToolUseBlock",
    "check_message",
]

Role = Literal["system", "developer", "user", "assistant", "tool"]
NonEmpty = Annotated[str, Field(min_length=1)]

_OPEN = ConfigDict(extra="allow", strict=True)


class TextBlock(BaseModel):
    """A text content block."""

    model_config = _OPEN
    type: Literal["text"]
    text: str


class ImageBlock(BaseModel):
    """An image content block (its source is kept, never tokenized)."""

    model_config = _OPEN
    type: Literal["image"]
    source: dict[str, Any]


class ToolUseBlock(BaseModel):
    """An assistant's call of a tool (Anthropic style)."""

    model_config = _OPEN
    type: Literal["tool_use"]
    id: NonEmpty
    name: NonEmpty
    input: dict[str, Any]


class ToolCallBlock(BaseModel):
    """An assistant's call of a tool as an Amplifier content block (``type: tool_call``).

    Amplifier's orchestrators write the calls of a message twice: in its
    ``tool_calls`` and as these blocks. A block and a ``tool_calls`` entry
    with the same id are one call.
    """

    model_config = _OPEN
    type: Literal["tool_call"]
    id: NonEmpty
    name: str


class ToolResultBlock(BaseModel):
    """The result of a tool call, inside a user or tool message.

    Anthropic names the call it answers ``tool_use_id`` (its text in
    ``content``), Amplifier ``tool_call_id`` (its value in ``output``).
    """

    model_config = _OPEN
    type: Literal["tool_result"]
    tool_use_id: NonEmpty | None = None
    tool_call_id: NonEmpty | None = None
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None

    @model_validator(mode="after")
    def _names_its_call(self) -> ToolResultBlock:
        if self.tool_use_id is None and self.tool_call_id is None:
            raise ValueError(
                "a tool_result block needs the id of the call it answers: "
                "tool_use_id (Anthropic) or tool_call_id (Amplifier)"
            )
        if None not in (self.tool_use_id, self.tool_call_id) and (
            self.tool_use_id != self.tool_call_id
        ):
            raise ValueError("a tool_result block answers one call, not two different ids")
        return self

    @property
    def answers(self) -> str:
        """The id of the call it answers."""
        found = self.tool_use_id or self.tool_call_id
        assert found is not None, "validated: one of the two is there"
        return found


class ThinkingBlock(BaseModel):
    """A thinking block (its signature is kept, never tokenized).

    Anthropic writes its text as ``thinking``; Amplifier's content models
    write it as ``text``.
    """

    model_config = _OPEN
    type: Literal["thinking"]
    thinking: str | None = None
    text: str | None = None
    signature: str | None = None

    @model_validator(mode="after")
    def _holds_text(self) -> ThinkingBlock:
        if self.thinking is None and self.text is None:
            raise ValueError(
                "a thinking block needs its text: thinking (Anthropic) or text (Amplifier)"
            )
        return self


class RedactedThinkingBlock(BaseModel):
    """A redacted thinking block."""

    model_config = _OPEN
    type: Literal["redacted_thinking"]
    data: str


class OtherBlock(BaseModel):
    """A block type this model does not know; kept as it is."""

    model_config = _OPEN
    type: NonEmpty


_KNOWN_BLOCKS = {
    "text",
    "image",
    "tool_use",
    "tool_call",
    "tool_result",
    "thinking",
    "redacted_thinking",
}


def _block_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if isinstance(kind, str) and kind in _KNOWN_BLOCKS else "other"


ContentBlock = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ImageBlock, Tag("image")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolCallBlock, Tag("tool_call")]
    | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[RedactedThinkingBlock, Tag("redacted_thinking")]
    | Annotated[OtherBlock, Tag("other")],
    Discriminator(_block_tag),
]


class FunctionCall(BaseModel):
    """The function an OpenAI-style tool call names."""

    model_config = _OPEN
    name: NonEmpty
    arguments: str


class ToolCall(BaseModel):
    """An assistant's call of a tool, in ``tool_calls``.

    OpenAI writes ``{"id", "type": "function", "function": {"name",
    "arguments"}}`` (the arguments a JSON string); Amplifier writes ``{"id",
    "tool", "arguments"}`` (the arguments a dict). A call with a
    ``function`` is OpenAI's, whatever else it holds.
    """

    model_config = _OPEN
    id: NonEmpty
    type: Literal["function"] = "function"
    function: FunctionCall | None = None
    tool: Any = None
    arguments: Any = None

    @model_validator(mode="after")
    def _one_form(self) -> ToolCall:
        if self.function is not None:
            return self
        if self.tool is None:
            raise ValueError(
                "a tool call needs a function (OpenAI: its name and arguments) "
                "or a tool and its arguments (Amplifier)"
            )
        if not isinstance(self.tool, str) or not self.tool:
            raise ValueError("an Amplifier tool call's tool is its name (a non-empty string)")
        if not isinstance(self.arguments, dict):
            raise ValueError("an Amplifier tool call needs its arguments (a dict)")
        return self


class Message(BaseModel):
    """One message of a conversation.

    Attributes:
        role: system, developer, user, assistant or tool.
        content: Text, a list of content blocks, or ``None`` on an assistant
            message that only calls tools.
        name: An optional participant name.
        tool_calls: Tool calls, OpenAI's or Amplifier's (assistant only).
        tool_call_id: The call a ``tool`` message answers (required there).
        metadata: Free metadata, kept as given.
    """

    model_config = _OPEN
    role: Role
    content: str | list[ContentBlock] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: NonEmpty | None = None
    metadata: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_shape(self) -> Message:
        blocks = self.content if isinstance(self.content, list) else []
        uses = [b for b in blocks if isinstance(b, ToolUseBlock)]
        listed = [b for b in blocks if isinstance(b, ToolCallBlock)]
        results = [b for b in blocks if isinstance(b, ToolResultBlock)]
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError(f"tool_calls are only allowed on assistant messages, not {self.role}")
        for kind, found in (("tool_use", uses), ("tool_call", listed)):
            if found and self.role != "assistant":
                raise ValueError(
                    f"{kind} blocks are only allowed in assistant messages, not {self.role}"
                )
        if results and self.role not in ("user", "tool"):
            raise ValueError(f"tool_result blocks belong in user or tool messages, not {self.role}")
        if self.role == "tool" and self.tool_call_id is None and not results:
            raise ValueError("a tool message needs a tool_call_id")
        if self.tool_call_id is not None and self.role != "tool":
            raise ValueError(f"tool_call_id is only allowed on tool messages, not {self.role}")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content may be empty only on an assistant message that calls tools")
        call_ids = [c.id for c in self.tool_calls or ()] + [u.id for u in uses]
        # A tool_call block repeats a call of tool_calls (Amplifier writes both), or is one.
        blocked = [b.id for b in listed]
        if (
            len(call_ids) != len(set(call_ids))
            or len(blocked) != len(set(blocked))
            or not {u.id for u in uses}.isdisjoint(blocked)
        ):
            raise ValueError("a message calls the same tool call id twice")
        call_ids += blocked
        answered = [r.answers for r in results] + [self.tool_call_id or ""]
        if any(_CONTROL.search(i) for i in call_ids + answered):
            raise ValueError("tool call ids may not hold control characters")
        return self


_MESSAGE = TypeAdapter(Message)
_TOO_DEEP = "a message is nested too deeply (JSON more than about 200 levels deep)"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class Checked:
    """A message that passed validation, ready for the append script.

    Attributes:
        raw: The caller's dict, as given.
        data: Its JSON form (UTF-8), the bytes that are stored.
        role: Its role (``None`` for an OpenAI Responses item that has none).
        call_ids: Tool call ids it makes.
        result_ids: Tool call ids it answers.
    """

    raw: dict[str, Any]
    data: bytes
    role: str | None
    call_ids: tuple[str, ...]
    result_ids: tuple[str, ...]


def check_message(message: object, *, max_bytes: int, index: int | None = None) -> Checked:
    """Validate one message and serialize it.

    Args:
        message: The candidate, a dict.
        max_bytes: The size cap of its JSON form.
        index: Its position in a batch, for the error message.

    Raises:
        InvalidMessageError: It is not a dict, not JSON-serializable, or does
            not fit the message model.
        MessageTooLargeError: Its JSON form is over ``max_bytes``.
    """
    if not isinstance(message, dict):
        raise InvalidMessageError(
            f"a message must be a dict, not {type(message).__name__}", index=index
        )
    try:
        data = json.dumps(
            message, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        ).encode()
    except RecursionError as exc:
        raise InvalidMessageError(_TOO_DEEP, index=index) from exc
    except (TypeError, ValueError) as exc:
        raise InvalidMessageError(
            f"a message must be JSON-serializable: {exc}", index=index
        ) from exc
    if len(data) > max_bytes:
        raise MessageTooLargeError(len(data), max_bytes, index=index)
    # JSON would turn tuples into lists and non-string keys into strings: refuse
    # what would not come back out equal.
    try:
        decoded = from_json(data)
    except ValueError as exc:  # pydantic-core's own depth limit, shallower than Python's
        raise InvalidMessageError(_TOO_DEEP, index=index) from exc
    if decoded != message:
        raise InvalidMessageError(
            "a message may hold only JSON values (dicts with string keys, lists, "
            "strings, numbers, booleans and null): it would not come back out equal",
            index=index,
        )
    if "role" not in message:
        problem = _item_problem(message)
        if problem:
            raise InvalidMessageError(problem, index=index)
        role = None
    elif _plain_text(message):
        # Most messages: a role that takes text and the text. The model would accept it;
        # it calls no tool and answers none (5 us of the append's own time saved).
        return Checked(message, data, message["role"], (), ())
    else:
        try:
            role = _MESSAGE.validate_python(message).role
        except PydanticValidationError as exc:
            raise InvalidMessageError(_describe(exc), index=index) from None
        except RecursionError as exc:
            raise InvalidMessageError(_TOO_DEEP, index=index) from exc
    # Validated, the ids are where view planning looks for them in a stored message.
    return Checked(message, data, role, tuple(call_ids(message)), tuple(result_ids(message)))


_TEXT_ROLES = frozenset({"system", "developer", "user", "assistant"})


def _plain_text(message: dict[str, Any]) -> bool:
    """Whether a message is only a role that takes text and its text: nothing to check further."""
    role = message.get("role")
    return (
        len(message) == 2
        and type(message.get("content")) is str
        and type(role) is str
        and role in _TEXT_ROLES
    )


def _item_problem(item: dict[str, Any]) -> str | None:
    """What is wrong with an OpenAI Responses item (a message with no role), or None."""
    kind = item_type(item)
    if not kind:
        return "a message needs a role, or (an OpenAI Responses item) a type"
    if kind == "message":
        return "a message item needs a role"

    def named(field: str) -> str | None:
        value = item.get(field)
        if not isinstance(value, str) or not value:
            return f"a {kind} item needs a {field} (a non-empty string)"
        if _CONTROL.search(value):
            return f"a {kind} item's {field} may not hold control characters"
        return None

    if kind in CALL_ITEMS:
        checks = ["call_id"] if item.get("execution") != "server" else []
        if kind in ("function_call", "custom_tool_call"):
            checks.append("name")
        problem = next(filter(None, map(named, checks)), None)
        if problem:
            return problem
        if kind == "function_call" and not isinstance(item.get("arguments"), str):
            return "a function_call item needs its arguments (a JSON string)"
        return None
    if kind in RESULT_ITEMS:
        if kind == "local_shell_call_output" and "call_id" not in item:
            problem = named("id")
        elif item.get("execution") != "server":
            problem = named("call_id")
        else:
            problem = None
        if problem:
            return problem
        return (
            None
            if "output" in item or kind == "tool_search_output"
            else f"a {kind} item needs an output"
        )
    if kind == APPROVAL_REQUEST:
        return named("id")
    if kind == APPROVAL_RESPONSE:
        problem = named("approval_request_id")
        if problem is None and not isinstance(item.get("approve"), bool):
            return "an mcp_approval_response item needs approve (true or false)"
        return problem
    if kind == REASONING and not isinstance(item.get("summary", []), list):
        return "a reasoning item's summary is a list"
    return None


def _describe(exc: PydanticValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False)[:3]:
        # Leave out pydantic's names of union members ("list[tagged-union[...]]").
        where = ".".join(str(part) for part in error["loc"] if "[" not in str(part))
        said = error["msg"].removeprefix("Value error, ")
        parts.append(f"{where or 'message'}: {said}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
