"""Tools an agent calls to reach what a compacted view left out.

A view drops, summarizes and offloads detail by design; the history keeps it
all. :class:`RecallTools` hands a model four tools over one session, with
definitions in the three tool schemas (OpenAI Chat, OpenAI Responses,
Anthropic) and one executor:

- ``search_history(query, limit)``: the best-matching entries of the whole
  history (:meth:`ContextStore.search`), with their ids and a snippet;
- ``read_entry(entry_id, offset)``: an entry's full text (what an offload
  preview or a summary line stands for), a page at a time;
- ``pin_message(entry_id)`` / ``unpin_message(entry_id)``: keep a message in
  every view, or stop.

Arguments come from a model and are untrusted: a malformed or foreign id, a
huge query, arguments that are not JSON, an unknown tool: each gets a tool
result that says what was wrong (``is_error`` where the format has it),
never an exception in the agent loop, and never another session's data (an
executor is bound to one tenant's store and one session).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ctxstore._layout.formats import item_type
from ctxstore._layout.validate import check_entry_id
from ctxstore._parts.search import MAX_QUERY_CHARS, message_text
from ctxstore.errors import CtxstoreError, InvalidInputError, QuotaExceededError

if TYPE_CHECKING:
    from ctxstore.store import ContextStore

__all__ = ["TOOL_NAMES", "RecallTools", "ToolOutcome"]

log = logging.getLogger(__name__)

READ_CHARS = 8_000
"""Characters of an entry one ``read_entry`` call returns."""
MAX_ARGUMENT_BYTES = 16_384
"""Tool arguments larger than this are refused unread."""

_ENTRY_ID = {
    "type": "string",
    "description": "The entry id, as search_history or a note in the conversation gives it "
    "(for example 1732400000000-3).",
    "maxLength": 41,
}
_SPECS: dict[str, tuple[str, dict[str, Any], tuple[str, ...]]] = {
    "search_history": (
        "Search this conversation's whole history, including the turns that are no longer "
        "shown in full (summarized or cut). Returns the best matches, each with its entry id, "
        "role and a snippet; call read_entry with an id for the full text.",
        {
            "query": {
                "type": "string",
                "description": "Words to look for: names, numbers, paths, errors, topics.",
                "maxLength": MAX_QUERY_CHARS,
            },
            "limit": {
                "type": "integer",
                "description": "The most results (1 to 20; 5 by default).",
                "minimum": 1,
                "maximum": 20,
            },
        },
        ("query",),
    ),
    "read_entry": (
        "Read one entry of this conversation's history in full: a tool result that is shown "
        "only as a preview, or a turn that a summary condensed. Long entries come a page at "
        "a time; pass the offset the previous page names to read on.",
        {
            "entry_id": _ENTRY_ID,
            "offset": {
                "type": "integer",
                "description": "The character to start at (0 by default).",
                "minimum": 0,
            },
        },
        ("entry_id",),
    ),
    "pin_message": (
        "Pin an entry of this conversation so that it is always kept in full in your context, "
        "however long the conversation grows. Use it for what you must not lose.",
        {"entry_id": _ENTRY_ID},
        ("entry_id",),
    ),
    "unpin_message": (
        "Unpin an entry pinned with pin_message: it is then kept only while it fits.",
        {"entry_id": _ENTRY_ID},
        ("entry_id",),
    ),
}
TOOL_NAMES = tuple(_SPECS)
"""The tools' names, as a model calls them."""


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What a tool call returned.

    Attributes:
        text: The tool result the model reads.
        is_error: The call was refused (bad arguments, no such entry, a store error).
    """

    text: str
    is_error: bool = False


class _Refused(Exception):
    """A tool call that cannot run, and the reason the model is told."""


class RecallTools:
    """The recall tools over one session, and their executor.

    Args:
        store: The tenant's store.
        session: The session the tools read and pin; nothing else is reachable.
        names: The tools to offer (all four by default); e.g. leave out the
            pin tools for an agent that must not change what views keep.

    Raises:
        InvalidIdError: ``session`` is not a valid id.
        InvalidInputError: A name is not one of ``TOOL_NAMES``.
    """

    def __init__(
        self, store: ContextStore, session: str, *, names: tuple[str, ...] = TOOL_NAMES
    ) -> None:
        store.keys(session)  # a bad id is refused now, not at the first call
        unknown = [n for n in names if n not in _SPECS]
        if unknown or not names:
            raise InvalidInputError(f"unknown recall tools {unknown}; known: {list(TOOL_NAMES)}")
        self.store = store
        self.session = session
        self.names = tuple(dict.fromkeys(names))

    # -- definitions -----------------------------------------------------------

    def schema(self, name: str) -> dict[str, Any]:
        """A tool's parameters as JSON Schema."""
        _, properties, required = _SPECS[name]
        return {
            "type": "object",
            "properties": properties,
            "required": list(required),
            "additionalProperties": False,
        }

    def description(self, name: str) -> str:
        """A tool's description, as the model reads it."""
        return _SPECS[name][0]

    def openai_chat(self) -> list[dict[str, Any]]:
        """The tools for OpenAI Chat Completions' ``tools``."""
        return [
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": self.description(name),
                    "parameters": self.schema(name),
                },
            }
            for name in self.names
        ]

    def openai_responses(self) -> list[dict[str, Any]]:
        """The tools for the OpenAI Responses API's ``tools``."""
        return [
            {
                "type": "function",
                "name": name,
                "description": self.description(name),
                "parameters": self.schema(name),
                "strict": False,
            }
            for name in self.names
        ]

    def anthropic(self) -> list[dict[str, Any]]:
        """The tools for Anthropic Messages' ``tools``."""
        return [
            {"name": name, "description": self.description(name), "input_schema": self.schema(name)}
            for name in self.names
        ]

    # -- execution -------------------------------------------------------------

    def handles(self, name: object) -> bool:
        """True if ``name`` is one of the tools offered here."""
        return isinstance(name, str) and name in self.names

    async def execute(self, name: object, arguments: object) -> ToolOutcome:
        """Run one tool call; never raises for anything the model sent.

        Args:
            name: The tool's name.
            arguments: Its arguments: a JSON string (OpenAI) or a dict (Anthropic).
        """
        try:
            if not self.handles(name):
                raise _Refused(f"unknown tool {str(name)[:64]!r}; tools: {', '.join(self.names)}")
            assert isinstance(name, str)
            args = _arguments(arguments, name)
            if name == "search_history":
                return ToolOutcome(await self._search(args))
            if name == "read_entry":
                return ToolOutcome(await self._read(args))
            return ToolOutcome(await self._pin(args, name == "pin_message"))
        except _Refused as exc:
            return ToolOutcome(f"error: {exc}", is_error=True)
        except InvalidInputError as exc:
            return ToolOutcome(f"error: {exc.reason}", is_error=True)
        except QuotaExceededError as exc:
            return ToolOutcome(f"error: refused by the session's quota: {exc.reason}", True)
        except CtxstoreError as exc:
            log.warning("recall tool %s failed: %s", name, exc)
            return ToolOutcome(
                f"error: the history could not be reached ({type(exc).__name__}); try again later",
                is_error=True,
            )

    async def run(self, call: object) -> dict[str, Any] | None:
        """Run a model's tool call in any of the three formats; its result in the same format.

        - an OpenAI Chat tool call (``{"id", "function": {"name", "arguments"}}``)
          or an Amplifier one (``{"id", "tool", "arguments"}``) gives a
          ``role: tool`` message;
        - an OpenAI Responses ``function_call`` item gives a
          ``function_call_output`` item;
        - an Anthropic ``tool_use`` block gives a ``tool_result`` block.

        Returns ``None`` for a call to a tool that is not one of these (the
        agent's own tools), so a loop can try its other executors.
        """
        if not isinstance(call, dict):
            return None
        if call.get("type") == "tool_use":
            if not self.handles(call.get("name")):
                return None
            outcome = await self.execute(call.get("name"), call.get("input"))
            block = {"type": "tool_result", "tool_use_id": call.get("id"), "content": outcome.text}
            return {**block, "is_error": True} if outcome.is_error else block
        if item_type(call) == "function_call":
            if not self.handles(call.get("name")):
                return None
            outcome = await self.execute(call.get("name"), call.get("arguments"))
            return {
                "type": "function_call_output",
                "call_id": call.get("call_id"),
                "output": outcome.text,
            }
        function = call.get("function")
        if isinstance(function, dict):
            name, arguments = function.get("name"), function.get("arguments")
        else:
            name, arguments = call.get("tool"), call.get("arguments")
        if self.handles(name):
            outcome = await self.execute(name, arguments)
            return {"role": "tool", "tool_call_id": call.get("id"), "content": outcome.text}
        return None

    async def _search(self, args: dict[str, Any]) -> str:
        query = _field(args, "query", str)
        if not query.strip():
            raise _Refused("the query is empty")
        limit = _field(args, "limit", int, 5)
        if not 1 <= limit <= 20:
            raise _Refused(f"limit must be 1 to 20, not {limit}")
        hits = await self.store.search(self.session, query, limit=limit)
        if not hits:
            return f"No entry of this conversation matches {query[:200]!r}."
        found = f"{len(hits)} {'match' if len(hits) == 1 else 'matches'}"
        lines = [f"{found}, best first (read_entry gives an entry in full):"]
        lines += [f"- entry {h.entry_id} ({h.role}): {h.snippet}" for h in hits]
        return "\n".join(lines)

    async def _read(self, args: dict[str, Any]) -> str:
        entry_id = _entry_id(args)
        offset = _field(args, "offset", int, 0)
        if offset < 0:
            raise _Refused(f"offset must be 0 or more, not {offset}")
        stored = await self.store.get_entry(self.session, entry_id)
        if stored is None:
            raise _Refused(f"no entry {entry_id} in this conversation's history")
        role = stored.message.get("role") or item_type(stored.message) or "?"
        body = message_text(stored.message)
        if offset and offset >= len(body):
            raise _Refused(f"entry {entry_id} has {len(body)} characters; offset {offset} is past")
        page = body[offset : offset + READ_CHARS]
        end = offset + len(page)
        head = f"entry {entry_id} ({role})"
        if offset or end < len(body):
            head += f", characters {offset} to {end} of {len(body)}"
        tail = (
            f"\n[{len(body) - end} more characters: read_entry offset={end}]"
            if end < len(body)
            else ""
        )
        return f"{head}:\n{page}{tail}"

    async def _pin(self, args: dict[str, Any], pinned: bool) -> str:
        entry_id = _entry_id(args)
        if not await self.store.pin(self.session, entry_id, pinned):
            raise _Refused(f"no entry {entry_id} in this conversation's history")
        return f"entry {entry_id} is {'pinned' if pinned else 'no longer pinned'}"


def _arguments(arguments: object, name: str) -> dict[str, Any]:
    """A call's arguments as a dict: parsed from JSON (OpenAI) or as given (Anthropic)."""
    if arguments is None or arguments == "":
        arguments = {}
    if isinstance(arguments, str | bytes):
        if len(arguments) > MAX_ARGUMENT_BYTES:
            raise _Refused(f"the arguments are over {MAX_ARGUMENT_BYTES} bytes")
        try:
            arguments = json.loads(arguments)
        except ValueError as exc:
            raise _Refused(f"the arguments of {name} are not JSON: {exc}") from None
        except RecursionError:
            raise _Refused(f"the arguments of {name} are not JSON (nested too deeply)") from None
    if not isinstance(arguments, dict):
        raise _Refused(f"the arguments of {name} must be a JSON object")
    unknown = set(arguments) - set(_SPECS[name][1])
    if unknown:
        raise _Refused(f"{name} takes no argument {sorted(map(str, unknown))[0][:64]!r}")
    return arguments


def _field(args: dict[str, Any], name: str, kind: type, default: Any = None) -> Any:
    value = args.get(name, default)
    if value is None:
        raise _Refused(f"the argument {name!r} is missing")
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _Refused(f"the argument {name!r} must be a {'string' if kind is str else 'number'}")
    return value


def _entry_id(args: dict[str, Any]) -> str:
    value = _field(args, "entry_id", str)
    try:
        return check_entry_id(value.strip())
    except InvalidInputError:
        raise _Refused(
            f"{value[:64]!r} is not an entry id (ids look like 1732400000000-3)"
        ) from None
