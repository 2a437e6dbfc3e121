"""Summarizers: turn old turns into a summary, off the request path.

A :class:`Summarizer` takes the previous summary (or ``None``) and the
messages after it, and returns the new summary. One that can also write it
at two levels (``summarize_levels``: a compact facts ledger, then a longer
narrative) lets views send the largest level that fits. Three ship here:

- :class:`AnthropicSummarizer`, on Anthropic's Messages API (async client,
  the fixed system prompt sent with prompt caching), asked for the ledger,
  then the narrative.
- :class:`OpenAISummarizer`, on the Chat Completions API of OpenAI or of a
  server that speaks it (vLLM, Ollama, LiteLLM), asked the same.
- :class:`~ctxstore._local.summarizer.LocalSummarizer`, deterministic and extractive,
  for machines with no API key.

For the two on a model's API, rate limits, overload, server errors and
timeouts raise :class:`~ctxstore.errors.SummarizerUnavailableError`, which
the worker retries through arq with jittered backoff (the clients' own
retries are off); anything else raises
:class:`~ctxstore.errors.SummarizerError`. Each translates its library's
errors in one place, its ``_ask``. ``anthropic`` and ``openai`` are imported
when one is built, never by ``import ctxstore``.

:func:`summarizer_from_settings` picks one. ``ctxstore.testing`` has a fake.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ctxstore._layout.formats import REASONING, call_ids, item_type, result_id, result_ids
from ctxstore._local.summarizer import LocalSummarizer
from ctxstore.errors import ConfigurationError, SummarizerError, SummarizerUnavailableError
from ctxstore.models import Summary
from ctxstore.settings import Settings

if TYPE_CHECKING:
    import anthropic
    import openai

__all__ = [
    "SYSTEM_PROMPT",
    "AnthropicSummarizer",
    "LocalSummarizer",
    "OpenAISummarizer",
    "Summarizer",
    "render_transcript",
    "summarizer_choice",
    "summarizer_from_settings",
]

_ANTHROPIC_MODEL = "claude-haiku-4-5"
"""Anthropic's summarizer's model when none is named."""
_OPENAI_BASE_URL = "https://api.openai.com/v1"
"""OpenAI's own API, where no other server is named."""

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
        calls = [c for c in message.get("tool_calls") or () if isinstance(c, dict)]
        parts = _texts(message.get("content"), listed={c.get("id") for c in calls})
        for call in calls:
            name, arguments = _call_parts(call)
            parts.append(f"[calls {name}({arguments}) as {call.get('id', '?')}]")
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


def _call_parts(call: dict[str, Any]) -> tuple[str, str]:
    """A ``tool_calls`` entry's tool name and arguments, OpenAI's form or Amplifier's."""
    function = call.get("function")
    if isinstance(function, dict):
        return str(function.get("name", "?")), str(function.get("arguments", ""))
    arguments = call.get("arguments", "")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return str(call.get("tool", "?")), arguments


def _texts(content: Any, listed: frozenset[Any] | set[Any] = frozenset()) -> list[str]:
    """The lines of a message's content; ``listed``: call ids its ``tool_calls`` render."""
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
        elif kind == "tool_use" or (kind == "tool_call" and block.get("id") not in listed):
            given = block.get("input", block.get("arguments", {}))
            out.append(
                f"[calls {block.get('name', '?')}"
                f"({json.dumps(given, ensure_ascii=False)}) as {block.get('id')}]"
            )
        elif kind == "tool_call":
            continue  # Amplifier's copy of a call its tool_calls render
        elif kind == "tool_result":
            error = " (error)" if block.get("is_error") else ""
            held = block.get("content", block.get("output"))  # Anthropic's, Amplifier's
            if held is None or isinstance(held, list | str):
                body = "\n".join(_texts(held))
            else:
                body = json.dumps(held, ensure_ascii=False)
            out.append(f"[result of {result_id(block)}{error}] {body}")
        elif kind == "thinking":
            continue  # the agent's private reasoning is not part of the record
        elif kind == "image":
            out.append("[image]")
        else:
            out.append(f"[{kind}]")
    return out


class _ModelSummarizer:
    """What the summarizers on a model's API share: the prompts, and reading the answer.

    The fixed system prompt goes first, then the budgets and the previous
    summary, then the new turns: the part that changes least leads, so a
    provider's prompt cache holds it from one call to the next. A subclass
    makes the one call (``_ask``) and translates its library's errors there.
    """

    name: str

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
            SummarizerUnavailableError: Rate limited, overloaded, a 5xx, a
                timeout or no connection.
            SummarizerError: Any other failure, or an answer with no text.
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
            SummarizerUnavailableError: Rate limited, overloaded, a 5xx, a
                timeout or no connection.
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
        """The model's answer to ``prompt`` under the system prompt, stripped, never empty."""
        raise NotImplementedError


class AnthropicSummarizer(_ModelSummarizer):
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
        model: str = _ANTHROPIC_MODEL,
        timeout: float = 60.0,
    ) -> None:
        import anthropic  # only the workers that summarize with it pay for the import

        self._anthropic = anthropic
        self._client = client or anthropic.AsyncAnthropic(
            api_key=api_key, max_retries=0, timeout=timeout
        )
        self._timeout = timeout
        self.name = model

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
                retry_after=_retry_after(exc.response.headers),
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


class OpenAISummarizer(_ModelSummarizer):
    """Summaries from an OpenAI-compatible Chat Completions API, at two levels.

    OpenAI's own API, or a server that speaks it at ``base_url``: vLLM,
    Ollama, LiteLLM. OpenAI caches a prompt's prefix by itself; the system
    prompt, the budgets and the previous summary lead, and
    ``prompt_cache_key`` sends the summaries' requests to the same cache.
    408, 429, 5xx, timeouts and lost connections raise
    :class:`~ctxstore.errors.SummarizerUnavailableError` (with the server's
    ``retry-after``); anything else, :class:`~ctxstore.errors.SummarizerError`.

    Args:
        client: An ``openai.AsyncOpenAI`` client; built from the arguments
            below when not given (with its own retries off: arq retries).
        model: The model, as the server names it.
        api_key: The API key; ``None`` for a server that needs none (the
            environment is not read here: ``Settings`` reads ``OPENAI_API_KEY``).
        base_url: The server's API root (``http://localhost:8000/v1`` for
            vLLM, ``http://localhost:11434/v1`` for Ollama); ``None``: OpenAI's.
        timeout: Seconds one call may take.
        prompt_cache_key: Sent as ``prompt_cache_key``. ``None``:
            ``ctxstore-summary`` to OpenAI's API, nothing to other servers
            (some refuse a field they do not know).
        token_limit: The field that carries ``max_tokens``. ``None``:
            ``max_completion_tokens`` to OpenAI's API (its reasoning models
            refuse the other), ``max_tokens`` to other servers (all read it).

    Raises:
        ConfigurationError: No client, no API key and no ``base_url``:
            OpenAI's API would refuse every call.
    """

    def __init__(
        self,
        client: openai.AsyncOpenAI | None = None,
        *,
        model: str,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 60.0,
        prompt_cache_key: str | None = None,
        token_limit: Literal["max_tokens", "max_completion_tokens"] | None = None,
    ) -> None:
        import openai  # only the workers that summarize with it pay for the import

        if client is None and not api_key and base_url is None:
            raise ConfigurationError(
                "OpenAI's API needs an API key (OPENAI_API_KEY); "
                "a server that needs none is named by its base URL"
            )
        self._openai = openai
        self._client = client or openai.AsyncOpenAI(
            # The SDK refuses to start without a key; a server that needs none ignores it.
            api_key=api_key or _NO_API_KEY,
            base_url=base_url or _OPENAI_BASE_URL,
            max_retries=0,
            timeout=timeout,
        )
        self._timeout = timeout
        self.name = model
        url = self._client.base_url
        official = url.host == "api.openai.com" or url.host.endswith(".api.openai.com")
        where = f"{url.host}:{url.port}" if url.port else url.host
        self._server = "OpenAI" if official else f"the server at {where}"
        self._cache_key = prompt_cache_key or (_PROMPT_CACHE_KEY if official else None)
        self._token_limit = token_limit or ("max_completion_tokens" if official else "max_tokens")

    async def _ask(self, prompt: str, max_tokens: int) -> str:
        openai = self._openai
        try:
            response = await self._client.chat.completions.create(
                model=self.name,
                messages=[
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": prompt},
                ],
                max_tokens=max_tokens if self._token_limit == "max_tokens" else openai.omit,
                max_completion_tokens=(
                    max_tokens if self._token_limit == "max_completion_tokens" else openai.omit
                ),
                prompt_cache_key=self._cache_key or openai.omit,
                timeout=self._timeout,
            )
        except openai.APIStatusError as exc:
            if exc.status_code in (408, 429) or exc.status_code >= 500:
                raise SummarizerUnavailableError(
                    f"{self._server} answered {exc.status_code}: {exc.message}",
                    retry_after=_retry_after(exc.response.headers),
                ) from exc
            raise SummarizerError(f"{self._server} refused the summary request: {exc}") from exc
        except openai.APIConnectionError as exc:  # includes timeouts
            raise SummarizerUnavailableError(f"{self._server} unreachable: {exc}") from exc
        except openai.OpenAIError as exc:
            raise SummarizerError(f"{self._server} refused the summary request: {exc}") from exc
        except ValueError as exc:  # a 200 whose body is not the JSON it should be
            raise SummarizerError(f"{self._server}'s answer could not be read: {exc}") from exc
        # Read with care: a 200 that is not a chat completion is built as given (or is a str).
        choices = getattr(response, "choices", None)
        first = choices[0] if isinstance(choices, list) and choices else None
        message = getattr(first, "message", None)
        content = getattr(message, "content", None)
        text = _THINKING.sub("", content).strip() if isinstance(content, str) else ""
        if not text:
            refusal = getattr(message, "refusal", None)
            why = f" (it refused: {refusal})" if isinstance(refusal, str) and refusal else ""
            raise SummarizerError(f"{self._server}'s answer held no summary text{why}")
        return text


_NO_API_KEY = "no-key"
"""The key sent to a server that needs none."""
_PROMPT_CACHE_KEY = "ctxstore-summary"
"""Every summary request shares the system prompt: one cache key routes them together."""
_THINKING = re.compile(r"\A\s*<think>.*?</think>", re.DOTALL)
"""A reasoning model's thoughts, which some servers leave at the head of the answer."""


def _section(text: str, tag: str) -> str | None:
    """The text inside ``<tag>...</tag>``, stripped; ``None`` without the tag."""
    found = re.search(rf"<{tag}>\s*(.*?)\s*</{tag}>", text, re.DOTALL)
    return found.group(1) if found else None


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """The wait a response asks for, in seconds: ``retry-after-ms``, else ``retry-after``."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        try:
            if value is not None:
                return max(0.0, float(value) / scale)
        except ValueError:
            continue
    return None


def summarizer_choice(settings: Settings) -> str:
    """The summarizer ``settings.summarizer`` names, ``auto`` resolved.

    ``auto`` (the default) is ``anthropic`` when an Anthropic API key is set,
    else ``local``; any other value is returned as it is.
    """
    if settings.summarizer == "auto":
        return "anthropic" if settings.anthropic_api_key is not None else "local"
    return settings.summarizer


def summarizer_from_settings(settings: Settings) -> Summarizer:
    """The summarizer ``settings.summarizer`` names.

    ``auto`` (the default): Anthropic's when an Anthropic API key is set,
    else the local one.

    Raises:
        ConfigurationError: The summarizer is unknown, or lacks what it needs
            (Anthropic's a key; OpenAI's a model, and a key or a base URL).
    """
    choice = summarizer_choice(settings)
    if choice == "anthropic":
        if settings.anthropic_api_key is None:
            raise ConfigurationError("CTXSTORE_SUMMARIZER=anthropic needs ANTHROPIC_API_KEY")
        return AnthropicSummarizer(
            api_key=settings.anthropic_api_key.get_secret_value(),
            model=settings.summary_model or _ANTHROPIC_MODEL,
            timeout=settings.summary_timeout,
        )
    if choice == "openai":
        if settings.summary_model is None:
            raise ConfigurationError(
                "CTXSTORE_SUMMARIZER=openai needs CTXSTORE_SUMMARY_MODEL, as the server names it"
            )
        key = settings.openai_api_key
        return OpenAISummarizer(
            model=settings.summary_model,
            api_key=key.get_secret_value() if key is not None else None,
            base_url=settings.openai_base_url,
            timeout=settings.summary_timeout,
        )
    if choice == "local":
        return LocalSummarizer()
    raise ConfigurationError(
        f"CTXSTORE_SUMMARIZER: no summarizer {choice!r} (auto, anthropic, openai or local)"
    )
