"""Summarizers: turn old turns into a summary, off the request path.

A :class:`Summarizer` takes the previous summary (or ``None``) and the
messages after it, and returns the new summary. One that can also write it
at two levels (``summarize_levels``: a compact facts ledger, then a longer
narrative) lets views send the largest level that fits. Two ship here:

- :class:`AnthropicSummarizer`, on Anthropic's Messages API (async client,
  the fixed system prompt sent with prompt caching), asked for the ledger,
  then the narrative. Rate limits, overload, server errors and timeouts
  raise :class:`~ctxstore.errors.SummarizerUnavailableError`, which the
  worker retries through arq with jittered backoff (the client's own retries
  are off); anything else raises :class:`~ctxstore.errors.SummarizerError`.
  ``anthropic`` is imported when one is built, never by ``import ctxstore``.
- :class:`~ctxstore._local.summarizer.LocalSummarizer`, deterministic and extractive,
  for machines with no API key.

:func:`summarizer_from_settings` picks one. ``ctxstore.testing`` has a fake.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ctxstore._layout.formats import REASONING, call_ids, item_type, result_ids
from ctxstore._local.summarizer import LocalSummarizer
from ctxstore.errors import SummarizerError, SummarizerUnavailableError
from ctxstore.models import Summary
from ctxstore.settings import Settings

if TYPE_CHECKING:
    import anthropic

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
turns that came after it. Write the new summary, which replaces both, in two \
parts.

First, inside <ledger></ledger>, a compact facts ledger: one line per fact, \
grouped under short headings (Task, Constraints, Decisions, Preferences, \
Identifiers, Numbers, Names, Dates, Paths, Errors, Tools), each line \
"subject: value". Keep everything the agent needs to carry on without the \
original turns:
- the user's goals, requests, constraints and preferences, and whether each was met;
- decisions taken and their reasons;
- names, numbers with their subject, identifiers, versions, dates, URLs and \
file paths, exactly as written;
- errors from tools that failed (verbatim when short), and what each tool \
returned that later turns rely on.
When a later turn changes a fact, replace its line and keep the old value \
beside the new one as "(was <old>)": never leave an old value without the \
new one. Merge restatements into one line. Keep the ledger short: when it \
must lose lines, lose those least referred to, not the oldest.

Then, inside <narrative></narrative>, a chronological account in plain, \
dense bullet points: what was asked, what was done with which tools, what \
was found and decided, open questions and planned next steps.

Drop pleasantries, repetition and raw tool output no later turn relies on. \
Do not address the user; do not add anything that is not in the input."""


class Summarizer(Protocol):
    """Writes a conversation's running summary.

    A summarizer may also have ``summarize_levels(previous: Summary | None,
    messages, *, max_tokens, ledger_tokens) -> Summary``, writing a facts
    ledger and a narrative; the store uses it when it is there.

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
        kind = item_type(message)
        if kind is not None:  # an OpenAI Responses item
            line = _item_line(message, kind)
            if line:
                lines.append(line)
            continue
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


def _item_line(item: dict[str, Any], kind: str) -> str | None:
    """An OpenAI Responses item as a transcript line (None: nothing to summarize in it)."""
    calls, results = call_ids(item), result_ids(item)
    if calls:
        arguments = item.get("arguments", item.get("input", item.get("action", "")))
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        return f"[assistant] [calls {item.get('name', kind)}({arguments}) as {calls[0]}]"
    if results:
        output = item.get("output", "")
        body = "\n".join(_texts(output)) if isinstance(output, list) else output
        if not isinstance(body, str):
            body = json.dumps(body, ensure_ascii=False)
        return f"[tool result for {results[0]}] {body}"
    if kind == REASONING:
        return None  # the agent's private reasoning is not part of the record
    return f"[{kind}]"


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
        if kind in ("text", "input_text", "output_text"):
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
    """Summaries from Anthropic's Messages API, at two levels.

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
        import anthropic  # only the workers that summarize with it pay for the import

        self._anthropic = anthropic
        self._client = client or anthropic.AsyncAnthropic(
            api_key=api_key, max_retries=0, timeout=timeout
        )
        self._timeout = timeout
        self.name = model

    async def summarize_levels(
        self,
        previous: Summary | None,
        messages: Sequence[dict[str, Any]],
        *,
        max_tokens: int,
        ledger_tokens: int | None = None,
    ) -> Summary:
        """Ask the model for the new ledger and narrative.

        Raises:
            SummarizerUnavailableError: 429, 529, 5xx, a timeout or no connection.
            SummarizerError: Any other failure, or an answer with no ledger.
        """
        limit = ledger_tokens or max(64, max_tokens // 3)
        parts = [
            f"Write the ledger in at most {limit} tokens, and both parts together in at "
            f"most {max_tokens}."
        ]
        if previous is not None:
            parts.append(f"<previous_ledger>\n{previous.ledger}\n</previous_ledger>")
            if previous.narrative:
                parts.append(f"<previous_narrative>\n{previous.narrative}\n</previous_narrative>")
        parts.append(f"<conversation>\n{render_transcript(messages)}\n</conversation>")
        text = await self._ask("\n\n".join(parts), max_tokens)
        ledger, narrative = _section(text, "ledger"), _section(text, "narrative")
        if ledger is None:
            ledger, narrative = text, ""  # no tags: the whole answer is the summary
        return Summary(ledger, narrative or "")

    async def summarize(
        self, previous: str | None, messages: Sequence[dict[str, Any]], *, max_tokens: int
    ) -> str:
        """The one-level protocol: the previous text and the turns in, one text out.

        Raises:
            SummarizerUnavailableError: 429, 529, 5xx, a timeout or no connection.
            SummarizerError: Any other failure, or an answer with no text.
        """
        prompt = (
            f"<previous_summary>\n{previous}\n</previous_summary>\n\n" if previous else ""
        ) + f"<conversation>\n{render_transcript(messages)}\n</conversation>"
        text = await self._ask(prompt, max_tokens)
        ledger, narrative = _section(text, "ledger"), _section(text, "narrative")
        if ledger is None:
            return text
        return Summary(ledger, narrative or "").text

    async def _ask(self, prompt: str, max_tokens: int) -> str:
        anthropic = self._anthropic
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


def _section(text: str, tag: str) -> str | None:
    """The text inside ``<tag>...</tag>``, stripped; ``None`` without the tag."""
    found = re.search(rf"<{tag}>\s*(.*?)\s*</{tag}>", text, re.DOTALL)
    return found.group(1) if found else None


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def summarizer_from_settings(settings: Settings) -> Summarizer:
    """Anthropic's when an API key is set, else the local one."""
    if settings.anthropic_api_key is not None:
        return AnthropicSummarizer(
            api_key=settings.anthropic_api_key.get_secret_value(),
            model=settings.summary_model,
            timeout=settings.summary_timeout,
        )
    return LocalSummarizer()
