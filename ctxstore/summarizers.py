"""Summarizers: turn old turns into a summary, off the request path.

A :class:`Summarizer` takes the previous summary (or ``None``) and the
messages after it, and returns the new summary. Two ship here:

- :class:`AnthropicSummarizer`, on Anthropic's Messages API (async client,
  the fixed system prompt sent with prompt caching). Rate limits, overload,
  server errors and timeouts raise
  :class:`~ctxstore.errors.SummarizerUnavailableError`, which the worker
  retries through arq with jittered backoff (the client's own retries are
  off); anything else raises :class:`~ctxstore.errors.SummarizerError`.
- :class:`LocalSummarizer`, deterministic and extractive, for machines with
  no API key: it keeps what an agent needs to carry on (requests, decisions,
  names, numbers, file paths, errors, tool calls and their outcomes).

:func:`summarizer_from_settings` picks one. ``ctxstore.testing`` has a fake.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import anthropic

from ctxstore.errors import SummarizerError, SummarizerUnavailableError
from ctxstore.policies import result_ids
from ctxstore.settings import Settings
from ctxstore.tokens import TiktokenCounter, TokenCounter

__all__ = [
    "SYSTEM_PROMPT",
    "AnthropicSummarizer",
    "LocalSummarizer",
    "Summarizer",
    "render_transcript",
    "summarizer_from_settings",
]

SYSTEM_PROMPT = """\
You maintain the running summary of a conversation between a user and an AI \
agent that uses tools. You receive the previous summary (if any) and the \
turns that came after it. Write the new summary, which replaces both.

Keep everything the agent needs to carry on without the original turns:
- the user's goals, requests and constraints, and whether each was met;
- decisions taken and their reasons;
- names, numbers, identifiers, versions, dates, URLs and file paths, exactly;
- tools called, with their important arguments, and what they returned or \
how they failed (error messages verbatim when short);
- open questions and the next steps that were planned.

Drop pleasantries, repetition and raw tool output that no later turn relies \
on. Write plain, dense bullet points grouped under short headings. Do not \
address the user; do not add anything that is not in the input."""


@runtime_checkable
class Summarizer(Protocol):
    """Writes a conversation's running summary.

    Attributes:
        name: What is recorded as the summary's model.
    """

    name: str

    async def summarize(
        self, previous: str | None, messages: Sequence[dict[str, Any]], *, max_tokens: int
    ) -> str:
        """Return the summary of ``previous`` followed by ``messages``.

        Raises:
            SummarizerUnavailableError: Try again later.
            SummarizerError: It failed for good.
        """
        ...


def render_transcript(messages: Sequence[dict[str, Any]]) -> str:
    """The messages as a plain transcript, tool calls and results included."""
    lines = []
    for message in messages:
        role = str(message.get("role", "?"))
        label = role if not message.get("name") else f"{role} ({message['name']})"
        if role == "tool":
            label = f"tool result for {message.get('tool_call_id', '?')}"
        parts = _texts(message.get("content"))
        for call in message.get("tool_calls") or ():
            function = call.get("function", {}) if isinstance(call, dict) else {}
            parts.append(
                f"[calls {function.get('name', '?')}({function.get('arguments', '')}) "
                f"as {call.get('id', '?')}]"
            )
        lines.append(f"[{label}] " + "\n".join(p for p in parts if p))
    return "\n\n".join(lines)


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    out = []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            out.append(str(block.get("text", "")))
        elif kind == "tool_use":
            out.append(
                f"[calls {block.get('name', '?')}"
                f"({json.dumps(block.get('input', {}), ensure_ascii=False)}) as {block.get('id')}]"
            )
        elif kind == "tool_result":
            error = " (error)" if block.get("is_error") else ""
            body = "\n".join(_texts(block.get("content")))
            out.append(f"[result of {block.get('tool_use_id')}{error}] {body}")
        elif kind == "thinking":
            continue  # the agent's private reasoning is not part of the record
        elif kind == "image":
            out.append("[image]")
        else:
            out.append(f"[{kind}]")
    return out


class AnthropicSummarizer:
    """Summaries from Anthropic's Messages API.

    Args:
        client: An ``anthropic.AsyncAnthropic`` client; built from ``api_key``
            when not given (with its own retries off: arq retries).
        api_key: The API key, when no client is given.
        model: The model.
        timeout: Seconds one call may take.
    """

    def __init__(
        self,
        client: anthropic.AsyncAnthropic | None = None,
        *,
        api_key: str | None = None,
        model: str = "claude-haiku-4-5",
        timeout: float = 60.0,
    ) -> None:
        self._client = client or anthropic.AsyncAnthropic(
            api_key=api_key, max_retries=0, timeout=timeout
        )
        self._timeout = timeout
        self.name = model

    async def summarize(
        self, previous: str | None, messages: Sequence[dict[str, Any]], *, max_tokens: int
    ) -> str:
        """Ask the model for the new summary.

        Raises:
            SummarizerUnavailableError: 429, 529, 5xx, a timeout or no connection.
            SummarizerError: Any other failure, or an answer with no text.
        """
        prompt = (
            f"<previous_summary>\n{previous}\n</previous_summary>\n\n" if previous else ""
        ) + f"<conversation>\n{render_transcript(messages)}\n</conversation>"
        try:
            response = await self._client.messages.create(
                model=self.name,
                max_tokens=max_tokens,
                system=[
                    {
                        "type": "text",
                        "text": SYSTEM_PROMPT,
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
                messages=[{"role": "user", "content": prompt}],
                timeout=self._timeout,
            )
        except (
            anthropic.RateLimitError,
            anthropic.InternalServerError,
            anthropic.RequestTimeoutError,  # 408: a proxy's timeout; the SDK retries it too
        ) as exc:
            raise SummarizerUnavailableError(
                f"Anthropic answered {exc.status_code}: {exc.message}",
                retry_after=_retry_after(exc.response.headers.get("retry-after")),
            ) from exc
        except anthropic.APIConnectionError as exc:  # includes timeouts
            raise SummarizerUnavailableError(f"Anthropic unreachable: {exc}") from exc
        except anthropic.AnthropicError as exc:
            raise SummarizerError(f"Anthropic refused the summary request: {exc}") from exc
        except ValueError as exc:  # a 200 whose body is not the JSON it should be
            raise SummarizerError(f"Anthropic's answer could not be read: {exc}") from exc
        texts = [
            block.text
            for block in getattr(response, "content", None) or ()
            if getattr(block, "type", None) == "text"
            and isinstance(getattr(block, "text", None), str)
        ]
        text = "\n".join(texts).strip()
        if not text:
            raise SummarizerError("Anthropic's answer held no summary text")
        return text


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


_PATH = re.compile(
    r"(?<![\w@])(?:~|\.{1,2})?/?(?:[\w.-]+/)+[\w.-]+|\b[\w-]+\.(?:py|js|ts|go|rs|java|rb|md|txt|json|ya?ml|toml|cfg|ini|sql|sh|csv|html|css|lock|log)\b"
)
# Numbers, with thousands separators, decimals and dotted versions (3.2.1);
# a full stop after one ends the sentence, not the number.
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)*%?(?!\w)")
_NAME = re.compile(r"\b[A-Z][a-z]+(?:\s[A-Z][a-z]+)+\b")
_DECISION = re.compile(
    r"\b(decid\w*|agree\w*|chose|choose|will use|we'll|plan(?:ned)? to|going with|must|"
    r"should|don't|do not|never|always|prefer\w*|fixed|resolved|switch\w* to)\b",
    re.IGNORECASE,
)
# ModuleNotFoundError, KeyError... count as much as a bare "error".
_ERROR = re.compile(
    r"(?:\b\w*(?:error|exception)|\b(?:failed|failure|traceback|not found|denied|timeout"
    r"|timed out|refused))\b",
    re.IGNORECASE,
)
_RAISED = re.compile(r"\b\w*(?:Error|Exception)\b:")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


class LocalSummarizer:
    """A deterministic, extractive summarizer that needs no network.

    The summary is a list of lines under five headings. It keeps, by
    priority: decisions, errors, facts (names, numbers with their context,
    file paths), the first and latest requests, and per tool the calls made
    and how they ended. Lines carried from the previous summary are merged
    in. When the summary would be over ``max_tokens``, the lowest priority
    lines go first, oldest first.

    Args:
        counter: Counts the summary's tokens; cl100k by default.
    """

    name = "local-extractive"

    HEADINGS = ("Decisions", "Errors", "Facts", "Requests", "Tools")
    """Sections, in priority order (the last is dropped first)."""

    def __init__(self, counter: TokenCounter | None = None) -> None:
        self._counter = counter or TiktokenCounter()

    async def summarize(
        self, previous: str | None, messages: Sequence[dict[str, Any]], *, max_tokens: int
    ) -> str:
        """Extract the new summary (never fails: it runs locally)."""
        sections = _parse_sections(previous)
        calls: dict[str, tuple[str, str]] = {}  # call id -> (tool, short arguments)
        tools: dict[str, list[str]] = {}
        requests: list[str] = []
        for message in messages:
            role = message.get("role")
            body = "\n".join(_texts(message.get("content")))
            is_result = bool(result_ids(message))
            if role == "user" and not is_result:
                first = _first_sentence(body)
                if first:
                    requests.append(first)
            if role in ("user", "assistant") and not is_result:
                for sentence in _sentences(body):
                    if _DECISION.search(sentence):
                        sections["Decisions"].append(f"{role}: {_clip(sentence, 240)}")
                sections["Facts"].extend(_facts(body))
            for call_id, tool, arguments in _calls(message):
                calls[call_id] = (tool, arguments)
            for call_id, output, failed in _results(message):
                tool, arguments = calls.get(call_id, ("a tool", call_id))
                error = _error_line(output)
                if failed or error:
                    sections["Errors"].append(f"{tool}({arguments}): {_clip(error or output, 200)}")
                    tools.setdefault(tool, []).append(f"{arguments} -> failed")
                else:
                    tools.setdefault(tool, []).append(
                        f"{arguments} -> {_clip(_first_line(output), 60)}"
                    )
        # The first requests state the task; the latest say where it stands.
        sections["Requests"].extend(requests[:3] + requests[3:][-5:])
        for tool, uses in tools.items():
            shown = ", ".join(_unique(uses)[-6:])
            sections["Tools"].append(f"{tool}: {len(uses)} calls ({shown})")
        return self._fit(sections, max_tokens)

    def _fit(self, sections: dict[str, list[str]], max_tokens: int) -> str:
        """Render the sections, dropping low-priority old lines until it fits."""
        header = "Summary of the earlier conversation:"
        rows = [
            (priority, index, f"- {heading}: {line}")
            for priority, heading in enumerate(self.HEADINGS)
            for index, line in enumerate(_unique(sections[heading]))
        ]
        costs = {text: self._counter.count(text) + 1 for _, _, text in rows}
        total = self._counter.count(header) + sum(costs.values())

        # Drop the lowest priority section first; within one, the first three
        # lines (what the task was) go last, and of the rest the oldest first.
        def drop_order(row: tuple[int, int, str]) -> tuple[int, int, int]:
            priority, index, _ = row
            return (-priority, index < 3, index if index >= 3 else -index)

        for priority, index, text in sorted(rows, key=drop_order):
            if total <= max_tokens:
                break
            rows.remove((priority, index, text))
            total -= costs[text]
        return "\n".join([header, *(text for _, _, text in rows)])


def _parse_sections(previous: str | None) -> dict[str, list[str]]:
    """The previous summary's lines, by section (unknown lines are kept as facts)."""
    sections: dict[str, list[str]] = {h: [] for h in LocalSummarizer.HEADINGS}
    for line in (previous or "").splitlines():
        line = line.strip()
        if not line.startswith("- "):
            if line and not line.startswith("Summary of the earlier"):
                sections["Facts"].append(_clip(line, 400))
            continue
        heading, sep, rest = line[2:].partition(": ")
        if sep and heading in sections:
            sections[heading].append(rest)
        else:
            sections["Facts"].append(line[2:])
    return sections


def _calls(message: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(call id, tool name, short arguments) of each call a message makes."""
    found = []
    for call in message.get("tool_calls") or ():
        function = call.get("function", {})
        found.append(
            (str(call.get("id")), str(function.get("name", "?")), _args(function.get("arguments")))
        )
    content = message.get("content")
    for block in content if isinstance(content, list) else ():
        if isinstance(block, dict) and block.get("type") == "tool_use":
            found.append(
                (str(block.get("id")), str(block.get("name", "?")), _args(block.get("input")))
            )
    return found


def _args(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return _clip(arguments, 60)
    if isinstance(arguments, dict):
        return _clip(", ".join(str(v) for v in arguments.values()), 60)
    return _clip(str(arguments), 60)


def _results(message: dict[str, Any]) -> list[tuple[str, str, bool]]:
    if message.get("role") == "tool":
        return [
            (str(message.get("tool_call_id")), "\n".join(_texts(message.get("content"))), False)
        ]
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [
        (str(b.get("tool_use_id")), "\n".join(_texts(b.get("content"))), bool(b.get("is_error")))
        for b in content
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text) if s and s.strip()]


def _first_sentence(text: str) -> str:
    sentences = _sentences(text)
    return _clip(sentences[0], 200) if sentences else ""


def _error_line(output: str) -> str | None:
    """The line that says what failed: a raised exception's, else the first error word's."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    raised = [line for line in lines if _RAISED.search(line)]
    if raised:
        return raised[-1]  # a traceback ends with the exception
    return next((s for s in _sentences(output) if _ERROR.search(s)), None)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "(empty)"


def _facts(text: str) -> list[str]:
    """File paths, multi-word names, and each sentence that states a number."""
    found = [m.group(0).rstrip(".") for m in _PATH.finditer(text)]
    found += [m.group(0) for m in _NAME.finditer(text)]
    for sentence in _sentences(text):
        bare = _PATH.sub("", sentence)  # a digit inside a path is not a number worth a line
        if _NUMBER.search(bare):
            found.append(_clip(sentence, 160))
    return found


def _clip(text: str, limit: int) -> str:
    """``text`` on one line, cut at a word boundary to at most ``limit`` characters."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1].rsplit(" ", 1)[0] or text[: limit - 1]
    return cut + "…"


def _unique(items: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def summarizer_from_settings(settings: Settings) -> Summarizer:
    """Anthropic's when an API key is set, else the local one."""
    if settings.anthropic_api_key is not None:
        return AnthropicSummarizer(
            api_key=settings.anthropic_api_key.get_secret_value(),
            model=settings.summary_model,
            timeout=settings.summary_timeout,
        )
    return LocalSummarizer()
