"""Summarizers: Anthropic's over a scripted HTTP transport, the transcript, the local one.

The Anthropic tests run the real SDK against ``httpx2.MockTransport``: every
request is recorded and checked after the call (an assertion raised inside
the transport would come back as a connection error, i.e. as "unavailable").
The last tests measure, on real Redis, how many facts planted early in a long
agent conversation survive into a view that has dropped those turns.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anthropic
import httpx2
import pytest
from pydantic import SecretStr
from support.apis import Reply, ScriptedAPI, raising
from support.apis.messages import SUMMARY_TEXT, api_error, message_json, ok
from support.helpers import conversation

from ctxstore import (
    ContextStore,
    LocalSummarizer,
    RequestView,
    Settings,
    SummarizerError,
    SummarizerUnavailableError,
    TiktokenCounter,
)
from ctxstore._layout.codec import RECALL_HINT
from ctxstore.summarizers import (
    SYSTEM_PROMPT,
    AnthropicSummarizer,
    render_transcript,
    summarizer_from_settings,
)

MODEL = "claude-haiku-4-5"

# -- a scripted Messages API -------------------------------------------------------


class FakeMessagesAPI(ScriptedAPI):
    """Plays back one scripted reply per request and records every request."""

    def __init__(self) -> None:
        super().__init__(
            lambda: api_error(500, "api_error", "the test scripted no reply for this request")
        )

    def client(self) -> anthropic.AsyncAnthropic:
        """An SDK client on this transport, its own retries off (as arq retries)."""
        return anthropic.AsyncAnthropic(api_key="test", http_client=self.http, max_retries=0)

    def summarizer(self, **kwargs: Any) -> AnthropicSummarizer:
        """An AnthropicSummarizer on this transport."""
        return AnthropicSummarizer(self.client(), model=MODEL, **kwargs)


@pytest.fixture
async def api() -> AsyncIterator[FakeMessagesAPI]:
    """A scripted Messages API, closed after the test."""
    fake = FakeMessagesAPI()
    yield fake
    await fake.http.aclose()


def prompt_of(request: httpx2.Request) -> str:
    """The user prompt of a recorded request, checked to be the only message."""
    body = json.loads(request.content)
    assert len(body["messages"]) == 1
    (message,) = body["messages"]
    assert message["role"] == "user"
    content = message["content"]
    if isinstance(content, list):
        assert all(block["type"] == "text" for block in content)
        return "".join(block["text"] for block in content)
    assert isinstance(content, str)
    return content


def check_request(
    request: httpx2.Request,
    *,
    max_tokens: int,
    transcript: str,
    previous: str | None = None,
    model: str = MODEL,
    timeout: float | None = None,
    ledger_tokens: int | None = None,
) -> None:
    """Assert one request is the summary call ctxstore means to make.

    With ``ledger_tokens``, the two-level call (``summarize_levels``): the
    budgets first, then the previous ledger, then the conversation.
    """
    assert request.method == "POST"
    assert request.url.path == "/v1/messages"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["x-stainless-retry-count"] == "0"
    body = json.loads(request.content)
    assert body["model"] == model
    assert body["max_tokens"] == max_tokens
    assert body["system"] == [
        {"type": "text", "text": SYSTEM_PROMPT, "cache_control": {"type": "ephemeral"}}
    ]
    assert not body.get("stream")
    prompt = prompt_of(request)
    conversation_part = f"<conversation>\n{transcript}\n</conversation>"
    assert prompt.endswith(conversation_part)
    if ledger_tokens is not None:
        budgets = (
            f"Write the ledger in at most {ledger_tokens} tokens, and both parts together "
            f"in at most {max_tokens}.\n\n"
        )
        assert prompt.startswith(budgets)
        rest = prompt.removeprefix(budgets)
        if previous is None:
            assert rest == conversation_part
        else:
            assert rest.startswith(f"<previous_ledger>\n{previous}\n</previous_ledger>\n\n")
    elif previous is None:
        assert "<previous_summary>" not in prompt
        assert prompt == conversation_part
    else:
        assert prompt.startswith(f"<previous_summary>\n{previous}\n</previous_summary>\n\n")
    if timeout is not None:
        assert request.extensions["timeout"]["read"] == timeout


# A short agent exchange in Anthropic's shape: thinking, a tool call, a result.
AGENT_TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "Read /etc/ctx/app.yaml and tell me the port."},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "PRIVATE-REASONING-42", "signature": "c2ln"},
            {"type": "text", "text": "Reading the config."},
            {
                "type": "tool_use",
                "id": "toolu_01A",
                "name": "read_file",
                "input": {"path": "/etc/ctx/app.yaml"},
            },
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "server:\n  port: 8443"}
        ],
    },
    {"role": "assistant", "content": "The port is 8443."},
]


# -- AnthropicSummarizer: the request and the answer ---------------------------------


async def test_anthropic_sends_the_cached_system_prompt_and_returns_the_text(
    api: FakeMessagesAPI,
) -> None:
    """One POST /v1/messages with model, max_tokens, the cached system prompt and the transcript."""
    api.script.append(ok())
    summary = await api.summarizer(timeout=12.5).summarize(None, AGENT_TURNS, max_tokens=777)
    assert summary == SUMMARY_TEXT
    assert len(api.requests) == 1
    check_request(
        api.requests[0], max_tokens=777, transcript=render_transcript(AGENT_TURNS), timeout=12.5
    )
    prompt = prompt_of(api.requests[0])
    assert "[calls read_file" in prompt and "toolu_01A" in prompt
    assert "[result of toolu_01A] server:" in prompt and "port: 8443" in prompt
    assert "PRIVATE-REASONING-42" not in prompt


async def test_anthropic_folds_the_previous_summary_into_the_prompt(
    api: FakeMessagesAPI,
) -> None:
    """A previous summary goes first, in <previous_summary> tags, before the <conversation>."""
    api.script.append(ok("the new summary"))
    previous = "- Decisions: we decided to use PostgreSQL 16"
    summary = await api.summarizer().summarize(previous, AGENT_TURNS[2:], max_tokens=500)
    assert summary == "the new summary"
    assert len(api.requests) == 1
    check_request(
        api.requests[0],
        max_tokens=500,
        transcript=render_transcript(AGENT_TURNS[2:]),
        previous=previous,
    )


async def test_anthropic_joins_text_blocks_and_ignores_the_others(api: FakeMessagesAPI) -> None:
    """Several text blocks are joined by newlines; thinking blocks in the answer are left out."""
    api.script.append(
        httpx2.Response(
            200,
            json=message_json(
                [
                    {"type": "thinking", "thinking": "hmm", "signature": "c2ln"},
                    {"type": "text", "text": "  first part"},
                    {"type": "text", "text": "second part  "},
                ]
            ),
        )
    )
    summary = await api.summarizer().summarize(None, AGENT_TURNS, max_tokens=100)
    assert summary == "first part\nsecond part"


async def test_default_client_makes_one_request_and_has_retries_off(
    api: FakeMessagesAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client the summarizer builds from settings sends the model and timeout, never retries."""
    built: list[dict[str, Any]] = []
    real = anthropic.AsyncAnthropic

    def spy(**kwargs: Any) -> anthropic.AsyncAnthropic:
        built.append(kwargs)
        return real(**kwargs, http_client=api.http)

    monkeypatch.setattr(anthropic, "AsyncAnthropic", spy)
    settings = Settings(
        anthropic_api_key=SecretStr("sk-test"), summary_model="claude-x", summary_timeout=9.0
    )
    summarizer = summarizer_from_settings(settings)
    assert isinstance(summarizer, AnthropicSummarizer) and summarizer.name == "claude-x"
    assert built == [{"api_key": "sk-test", "max_retries": 0, "timeout": 9.0}]
    api.script += [api_error(429, "rate_limit_error", "slow down"), ok()]
    with pytest.raises(SummarizerUnavailableError):
        await summarizer.summarize(None, AGENT_TURNS, max_tokens=300)
    assert len(api.requests) == 1  # the SDK did not retry behind arq's back
    check_request(
        api.requests[0],
        max_tokens=300,
        transcript=render_transcript(AGENT_TURNS),
        model="claude-x",
        timeout=9.0,
    )


def test_local_summarizer_without_an_api_key() -> None:
    """With no API key in the settings, the local summarizer is picked."""
    assert isinstance(summarizer_from_settings(Settings(anthropic_api_key=None)), LocalSummarizer)


# -- AnthropicSummarizer: failures played back -------------------------------------

UNAVAILABLE: dict[str, Reply] = {
    "429": api_error(429, "rate_limit_error", "Number of request tokens has exceeded your limit"),
    "529": api_error(529, "overloaded_error", "Overloaded"),
    "500": api_error(500, "api_error", "Internal server error"),
    "502 html": httpx2.Response(
        502, content=b"<html>Bad Gateway</html>", headers={"content-type": "text/html"}
    ),
    "503": api_error(503, "api_error", "Service unavailable"),
    "504": api_error(504, "timeout_error", "Request timed out"),
    "read timeout": raising(lambda r: httpx2.ReadTimeout("read timed out", request=r)),
    "connect timeout": raising(lambda r: httpx2.ConnectTimeout("connect timed out", request=r)),
    "pool timeout": raising(lambda r: httpx2.PoolTimeout("no connection free", request=r)),
    "connection refused": raising(lambda r: httpx2.ConnectError("refused", request=r)),
}


@pytest.mark.parametrize("case", list(UNAVAILABLE))
async def test_transient_failures_are_unavailable(api: FakeMessagesAPI, case: str) -> None:
    """Rate limits, overload, 5xx, timeouts and refused connections: retry later, one request."""
    api.script += [UNAVAILABLE[case], ok()]  # a hidden retry would get the 200
    with pytest.raises(SummarizerUnavailableError) as caught:
        await api.summarizer().summarize(None, AGENT_TURNS, max_tokens=200)
    assert len(api.requests) == 1
    check_request(api.requests[0], max_tokens=200, transcript=render_transcript(AGENT_TURNS))
    assert isinstance(caught.value.__cause__, anthropic.APIError)  # chained with from
    assert caught.value.retry_after is None


async def test_rate_limit_carries_retry_after(api: FakeMessagesAPI) -> None:
    """A 429 with ``retry-after: 7`` raises Unavailable with ``retry_after == 7``."""
    api.script += [
        api_error(429, "rate_limit_error", "rate limited", {"retry-after": "7"}),
        ok(),
    ]
    with pytest.raises(SummarizerUnavailableError) as caught:
        await api.summarizer().summarize("prev", AGENT_TURNS, max_tokens=200)
    assert caught.value.retry_after == 7
    assert "429" in str(caught.value)
    assert len(api.requests) == 1
    check_request(
        api.requests[0], max_tokens=200, transcript=render_transcript(AGENT_TURNS), previous="prev"
    )


async def test_overloaded_carries_retry_after_and_ignores_a_bad_one(api: FakeMessagesAPI) -> None:
    """A 529's retry-after is passed on; one that is not a number is dropped, not raised."""
    api.script += [
        api_error(529, "overloaded_error", "Overloaded", {"retry-after": "2.5"}),
        api_error(529, "overloaded_error", "Overloaded", {"retry-after": "soon"}),
    ]
    summarizer = api.summarizer()
    with pytest.raises(SummarizerUnavailableError) as first:
        await summarizer.summarize(None, AGENT_TURNS, max_tokens=200)
    with pytest.raises(SummarizerUnavailableError) as second:
        await summarizer.summarize(None, AGENT_TURNS, max_tokens=200)
    assert (first.value.retry_after, second.value.retry_after) == (2.5, None)
    assert len(api.requests) == 2


PERMANENT: dict[str, Reply] = {
    "400 invalid_request_error": api_error(
        400, "invalid_request_error", "max_tokens: must be less than or equal to 64000"
    ),
    "401": api_error(401, "authentication_error", "invalid x-api-key"),
    "404 model": api_error(404, "not_found_error", "model: claude-nope"),
    "413": api_error(413, "request_too_large", "Request exceeds the maximum size"),
    "200 content []": httpx2.Response(200, json=message_json([])),
    "200 only a tool_use block": httpx2.Response(
        200,
        json=message_json(
            [{"type": "tool_use", "id": "toolu_9", "name": "bash", "input": {}}], "tool_use"
        ),
    ),
    "200 only whitespace text": httpx2.Response(
        200, json=message_json([{"type": "text", "text": " \n "}])
    ),
}


@pytest.mark.parametrize("case", list(PERMANENT))
async def test_permanent_failures_are_errors_not_unavailable(
    api: FakeMessagesAPI, case: str
) -> None:
    """Bad requests, auth failures and answers with no text: SummarizerError, not a retry."""
    api.script += [PERMANENT[case], ok()]
    with pytest.raises(SummarizerError) as caught:
        await api.summarizer().summarize(None, AGENT_TURNS, max_tokens=200)
    assert not isinstance(caught.value, SummarizerUnavailableError)
    assert len(api.requests) == 1
    check_request(api.requests[0], max_tokens=200, transcript=render_transcript(AGENT_TURNS))


@pytest.mark.parametrize(
    "body", [b"{not json", b"", b"<html>maintenance</html>"], ids=["truncated", "empty", "html"]
)
async def test_a_body_that_is_not_json_is_a_summarizer_error(
    api: FakeMessagesAPI, body: bytes
) -> None:
    """A 200 that cannot be decoded raises SummarizerError (not Unavailable), one request."""
    api.script.append(
        httpx2.Response(200, content=body, headers={"content-type": "application/json"})
    )
    with pytest.raises(SummarizerError) as caught:
        await api.summarizer().summarize(None, AGENT_TURNS, max_tokens=200)
    assert not isinstance(caught.value, SummarizerUnavailableError)
    assert len(api.requests) == 1


async def test_a_408_request_timeout_is_unavailable(api: FakeMessagesAPI) -> None:
    """A 408 from the server is a timeout like any other: retry later."""
    api.script.append(api_error(408, "timeout_error", "Request timed out"))
    with pytest.raises(SummarizerUnavailableError):
        await api.summarizer().summarize(None, AGENT_TURNS, max_tokens=200)


# -- render_transcript ------------------------------------------------------------


def test_render_openai_style_messages() -> None:
    """OpenAI messages: role labels, tool calls with their ids, results labelled by call id."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful agent."},
        {"role": "user", "name": "priya", "content": "What port does the app use?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "/etc/ctx/app.yaml"}'},
                },
                {
                    "id": "call_def",
                    "type": "function",
                    "function": {"name": "grep", "arguments": '{"pattern": "port"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_abc", "content": "port: 8443"},
        {"role": "tool", "tool_call_id": "call_def", "content": "app.yaml:2: port: 8443"},
        {"role": "assistant", "content": "It uses port 8443."},
    ]
    assert render_transcript(messages) == (
        "[system] You are a careful agent.\n\n"
        "[user (priya)] What port does the app use?\n\n"
        "[assistant] Let me check.\n"
        '[calls read_file({"path": "/etc/ctx/app.yaml"}) as call_abc]\n'
        '[calls grep({"pattern": "port"}) as call_def]\n\n'
        "[tool result for call_abc] port: 8443\n\n"
        "[tool result for call_def] app.yaml:2: port: 8443\n\n"
        "[assistant] It uses port 8443."
    )


def test_render_anthropic_style_messages() -> None:
    """Anthropic blocks: tool_use and tool_result with ids, errors marked, thinking out, images."""
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Why does this fail?"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "SECRET CHAIN OF THOUGHT", "signature": "c2ln"},
                {"type": "redacted_thinking", "data": "RU5DUllQVEVE"},
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "read_file",
                    "input": {"path": "src/parser/lexer.py"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01",
                    "is_error": True,
                    "content": [{"type": "text", "text": "Error: file not found"}],
                }
            ],
        },
    ]
    rendered = render_transcript(messages)
    assert rendered == (
        "[user] Why does this fail?\n[image]\n\n"
        "[assistant] [redacted_thinking]\n"
        '[calls read_file({"path": "src/parser/lexer.py"}) as toolu_01]\n\n'
        "[user] [result of toolu_01 (error)] Error: file not found"
    )
    assert "SECRET" not in rendered and "RU5DUllQVEVE" not in rendered and "iVBOR" not in rendered


def test_render_keeps_non_ascii_arguments_readable() -> None:
    """Tool inputs are rendered as JSON without escaping non-ASCII text."""
    message = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "t1", "name": "note", "input": {"who": "Zoë"}}],
    }
    assert render_transcript([message]) == '[assistant] [calls note({"who": "Zoë"}) as t1]'


# -- LocalSummarizer ----------------------------------------------------------------


def tool_exchange(
    call_id: str, tool: str, arguments: dict[str, Any], output: str
) -> list[dict[str, Any]]:
    """An OpenAI-style call and its result."""
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": tool, "arguments": json.dumps(arguments)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": output},
    ]


def busy_conversation() -> list[dict[str, Any]]:
    """Decisions, errors and facts among many requests and tool calls."""
    messages = conversation(40, tool_every=2)[1:]
    messages[3:3] = [
        {"role": "user", "content": "We decided to use PostgreSQL 16 for the store."},
        {"role": "assistant", "content": "Noted: we'll never touch the billing module."},
        *tool_exchange("call_x1", "run_python", {"code": "import yaml"}, "Error: no yaml"),
        {"role": "user", "content": "The reviewer is Priya Raman; the budget is 4,250 EUR."},
    ]
    return messages


async def test_local_summary_is_deterministic() -> None:
    """The same input gives the same summary, from one instance or two."""
    messages = busy_conversation()
    first = await LocalSummarizer().summarize("- Facts: port 8443", messages, max_tokens=400)
    again = LocalSummarizer()
    assert await again.summarize("- Facts: port 8443", messages, max_tokens=400) == first
    assert await again.summarize("- Facts: port 8443", messages, max_tokens=400) == first


@pytest.mark.parametrize("max_tokens", [64, 150, 300])
async def test_local_summary_fits_max_tokens_keeping_decisions_first(max_tokens: int) -> None:
    """Within max_tokens, the decision survives where the tool outcomes do not."""
    counter = TiktokenCounter()
    messages = busy_conversation()
    full = await LocalSummarizer(counter).summarize(None, messages, max_tokens=100_000)
    short = await LocalSummarizer(counter).summarize(None, messages, max_tokens=max_tokens)
    assert counter.count(short) <= max_tokens < counter.count(full)
    assert "PostgreSQL 16" in short
    if max_tokens >= 150:
        assert "billing" in short


async def test_local_summary_keeps_decisions_and_errors_over_requests_and_tools() -> None:
    """With room for little, the decisions, the constraint and the tool error stay."""
    summary = await LocalSummarizer().summarize(None, busy_conversation(), max_tokens=200)
    for fact in ("PostgreSQL 16", "billing", "no yaml", "Priya Raman", "4,250 EUR"):
        assert fact in summary, fact


async def test_local_summary_folds_the_previous_one() -> None:
    """The facts of the previous summary survive into the next, another summarizer's too."""
    messages = busy_conversation()
    summarizer = LocalSummarizer()
    first = await summarizer.summarize(None, messages[:40], max_tokens=2_000)
    second = await summarizer.summarize(first, messages[40:], max_tokens=2_000)
    for fact in ("PostgreSQL 16", "billing", "Priya Raman", "4,250 EUR"):
        assert fact in first and fact in second, fact
    foreign = "## Goal\nShip the parser by Friday.\n- Owner: Priya Raman"
    third = await summarizer.summarize(foreign, messages[40:], max_tokens=2_000)
    assert "parser" in third and "Friday" in third and "Priya Raman" in third
    assert third.count("Friday") == 1


async def test_local_summary_records_tool_failures() -> None:
    """An 'Error:' result and an is_error result are both recorded as failures."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Open the lexer."},
        *tool_exchange(
            "call_1", "read_file", {"path": "src/parser/lexer.py"}, "Error: file not found"
        ),
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_2", "name": "bash", "input": {"cmd": "make"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "is_error": True,
                    "content": "make: *** No rule to make target 'all'",
                }
            ],
        },
        *tool_exchange("call_3", "read_file", {"path": "README.md"}, "# ctx\nAll good here"),
    ]
    summary = await LocalSummarizer().summarize(None, messages, max_tokens=500)
    assert "file not found" in summary
    assert "No rule to make target 'all'" in summary
    assert "failed" in summary


@pytest.mark.parametrize(
    ("sentence", "fact"),
    [
        ("The service listens on port 8443.", "8443"),
        ("Pin the client library to version 3.2.1 from the changelog", "3.2.1"),
    ],
    ids=["number-before-full-stop", "dotted-version"],
)
async def test_local_summary_keeps_a_sentence_stating_a_number(sentence: str, fact: str) -> None:
    """A sentence whose fact is a number (at the end, or a version) is kept."""
    summary = await LocalSummarizer().summarize(
        None, [{"role": "assistant", "content": sentence}], max_tokens=500
    )
    assert fact in summary


async def test_local_summary_keeps_the_exception_line_of_a_traceback() -> None:
    """A failing tool's Python traceback is recorded by its exception, not its header."""
    traceback = (
        "Traceback (most recent call last):\n"
        '  File "<string>", line 1, in <module>\n'
        "ModuleNotFoundError: No module named 'yaml'"
    )
    messages = tool_exchange("call_1", "run_python", {"code": "import yaml"}, traceback)
    summary = await LocalSummarizer().summarize(None, messages, max_tokens=500)
    assert "ModuleNotFoundError: No module named 'yaml'" in summary
    assert "most recent call last" not in summary


async def test_local_summary_keeps_a_name_that_starts_a_sentence() -> None:
    """A two-word name is a fact wherever it stands in the sentence."""
    message = {"role": "user", "content": "Thanks. Priya Raman owns the deploy."}
    summary = await LocalSummarizer().summarize(None, [message], max_tokens=500)
    assert "Priya Raman" in summary


async def test_local_summary_records_a_path_without_the_full_stop() -> None:
    """A path that ends a sentence is recorded as the path, not with the full stop."""
    message = {"role": "user", "content": "The tokenizer lives in src/parser/lexer.py. Open it."}
    summary = await LocalSummarizer().summarize_levels(None, [message], max_tokens=500)
    paths = [line for line in summary.ledger.splitlines() if "src/parser/lexer.py" in line]
    assert any(line.endswith(": src/parser/lexer.py") for line in paths)


# -- through the store: AnthropicSummarizer on real Redis --------------------------


async def do_nothing(tenant: str, session: str, generation: int) -> None:
    """An on_summary_due that queues nothing: the tests summarize themselves."""


@pytest.fixture
async def small_store(settings: Settings, tenant: str) -> AsyncIterator[ContextStore]:
    """A store whose summaries are due after 3,000 tokens and keep 1,000 raw."""
    small = settings.model_copy(
        update={"summary_trigger_tokens": 3_000, "summary_keep_tokens": 1_000}
    )
    async with ContextStore.from_settings(small, tenant=tenant, on_summary_due=do_nothing) as s:
        yield s


async def test_store_summarizes_through_the_messages_api(
    small_store: ContextStore, api: FakeMessagesAPI
) -> None:
    """The store sends the covered turns, then folds its own summary into the next request."""
    history = conversation(30)
    await small_store.append_many("s", history)
    api.script += [ok("FIRST SUMMARY"), ok("SECOND SUMMARY")]
    first = await small_store.summarize("s", api.summarizer())
    assert first.status == "committed" and first.chunks == 1
    prompt = prompt_of(api.requests[0])
    assert "<previous_ledger>" not in prompt
    assert "[user] step 0: inspect the repository" in prompt
    assert "You are a careful agent." not in prompt  # system messages are sent by views anyway
    settings = small_store.settings
    check_request(
        api.requests[0],
        max_tokens=settings.summary_max_tokens,
        ledger_tokens=settings.summary_ledger_tokens,
        transcript=prompt[prompt.index("<conversation>\n") + 15 :].removesuffix(
            "\n</conversation>"
        ),
    )
    await small_store.append_many(
        "s", [{"role": "user", "content": f"more {i} " * 60} for i in range(20)]
    )
    second = await small_store.summarize("s", api.summarizer())
    assert second.status == "committed"
    assert len(api.requests) == 2
    assert "<previous_ledger>\nFIRST SUMMARY\n</previous_ledger>\n\n<conversation>\n" in (
        prompt_of(api.requests[1])
    )
    view = await small_store.view("s", token_budget=2_000)
    assert view.stats.summary_used
    content = "<summary>\nSECOND SUMMARY\n</summary>\n" + RECALL_HINT
    assert {"role": "user", "content": content} in view.messages


async def test_store_records_a_summarizer_refusal(
    small_store: ContextStore, api: FakeMessagesAPI
) -> None:
    """A 400 fails the job with SummarizerError and the session records the error."""
    await small_store.append_many("s", conversation(30))
    api.script.append(api_error(400, "invalid_request_error", "prompt is too long"))
    with pytest.raises(SummarizerError):
        await small_store.summarize("s", api.summarizer())
    info = await small_store.info("s")
    assert info.summary_failures == 1 and info.summary_covers is None
    assert info.summary_error is not None and "prompt is too long" in info.summary_error


# -- the retention check: LocalSummarizer, end to end on real Redis -----------------

# What the early turns plant, as the substring that must survive.
PLANTED = {
    "person": "Priya Raman",
    "budget": "4,250 EUR",
    "port": "8443",
    "version": "3.2.1",
    "decision: database": "PostgreSQL 16",
    "decision: hands off": "billing module",
    "config path": "/etc/ctx/app.yaml",
    "source path": "src/parser/lexer.py",
    "tool error": "ModuleNotFoundError: No module named 'yaml'",
    "tool: read_config": "read_config",
    "tool: run_python": "run_python",
    "tool: pip_install": "pip_install",
    "tool outcome: installed": "pyyaml==6.0.1",
    "tool: run_tests": "run_tests",
    "tool outcome: tests": "42 passed",
}


def early_turns() -> list[dict[str, Any]]:
    """The first turns of the session, which plant every fact in PLANTED."""
    return [
        {
            "role": "user",
            "content": (
                "Hi! I'm migrating the ctx service with Priya Raman from platform. "
                "We have a budget of 4,250 EUR for the hosted database this quarter."
            ),
        },
        {
            "role": "assistant",
            "content": "Understood. Let me read the current config first.",
            "tool_calls": [
                {
                    "id": "call_cfg",
                    "type": "function",
                    "function": {
                        "name": "read_config",
                        "arguments": '{"path": "/etc/ctx/app.yaml"}',
                    },
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_cfg",
            "content": "server:\n  port: 8443\n  tls: true\ndatabase:\n  engine: mysql\n",
        },
        {
            "role": "assistant",
            "content": (
                "The config at /etc/ctx/app.yaml serves on port 8443 with TLS and still "
                "points at MySQL."
            ),
        },
        {
            "role": "user",
            "content": (
                "Good. We decided to use PostgreSQL 16 instead of MySQL. "
                "And don't touch the billing module, finance owns it."
            ),
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Check yaml first.", "signature": "c2ln"},
                {
                    "type": "tool_use",
                    "id": "toolu_py",
                    "name": "run_python",
                    "input": {"code": "import yaml"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_py",
                    "is_error": True,
                    "content": (
                        "Traceback (most recent call last):\n"
                        '  File "<string>", line 1, in <module>\n'
                        "ModuleNotFoundError: No module named 'yaml'"
                    ),
                }
            ],
        },
        {
            "role": "assistant",
            "content": "PyYAML is missing, so I'll install it.",
            "tool_calls": [
                {
                    "id": "call_pip",
                    "type": "function",
                    "function": {"name": "pip_install", "arguments": '{"spec": "pyyaml==6.0.1"}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_pip",
            "content": "Successfully installed PyYAML-6.0.1",
        },
        {
            "role": "user",
            "content": (
                "The tokenizer lives in src/parser/lexer.py. "
                "Pin ctx-client to version 3.2.1 as the changelog asks, then run the parser tests."
            ),
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_tests",
                    "type": "function",
                    "function": {"name": "run_tests", "arguments": '{"path": "tests/parser"}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_tests",
            "content": "collected 42 items\n42 passed in 3.10s",
        },
        {"role": "assistant", "content": "The parser tests pass."},
    ]


def late_turns(start: int, count: int) -> list[dict[str, Any]]:
    """Later back-and-forth that mentions none of the planted facts."""
    messages: list[dict[str, Any]] = []
    for i in range(start, start + count):
        messages.append({"role": "user", "content": f"Next, look at module m{i} and report."})
        messages.append({"role": "assistant", "content": f"Module m{i} looks fine; nothing to do."})
    return messages


async def planted_session(store: ContextStore, session: str) -> str:
    """Append ~150 messages, planting facts early; summarize twice (the second folds)."""
    filler = conversation(36)
    system, filler = filler[0], filler[1:]
    await store.append_many(session, [system, *early_turns(), *filler[:60]])
    first = await store.summarize(session, LocalSummarizer())
    assert first.status == "committed"
    await store.append_many(session, [*filler[60:], *late_turns(0, 12)])
    second = await store.summarize(session, LocalSummarizer())
    assert second.status == "committed"
    info = await store.info(session)
    assert 140 <= info.count <= 170
    assert info.summary_runs == 2 and info.summary_model == "local-ledger"
    return str(system["content"])


async def early_view(store: ContextStore, session: str) -> RequestView:
    """A view whose budget holds the summary and only the newest turns."""
    info = await store.info(session)
    view = await store.view(session, token_budget=info.summary_tokens + 900)
    assert view.stats.summary_used and view.stats.dropped > 100
    return view


async def test_view_sends_the_summary_in_tags_instead_of_the_early_turns(
    small_store: ContextStore,
) -> None:
    """After the early turns are summarized, the view holds the <summary> user message, not them."""
    system = await planted_session(small_store, "s")
    view = await early_view(small_store, "s")
    summaries = [m for m in view.messages if "<summary>" in str(m["content"])]
    assert len(summaries) == 1
    summary = summaries[0]
    assert summary["role"] == "user"
    assert summary["content"].startswith("<summary>\nLedger (current values")
    assert summary["content"].endswith("\n</summary>\n" + RECALL_HINT)
    assert "Check yaml first." not in summary["content"]  # thinking is not summarized
    assert view.messages[0] == {"role": "system", "content": system}
    raw = [m for m in view.messages if m is not summary]
    for message in early_turns():
        assert message not in raw
    kept_raw, _ = retention(raw)
    assert kept_raw == []  # so whatever the retention check counts came through the summary
    assert raw[-1] == late_turns(0, 12)[-1]


async def test_summary_role_follows_the_settings(settings: Settings, tenant: str) -> None:
    """With summary_role='system', the same summary is sent as a system message."""
    as_system = settings.model_copy(
        update={
            "summary_trigger_tokens": 3_000,
            "summary_keep_tokens": 1_000,
            "summary_role": "system",
        }
    )
    async with ContextStore.from_settings(
        as_system, tenant=tenant, on_summary_due=do_nothing
    ) as store:
        await planted_session(store, "s")
        view = await early_view(store, "s")
    roles = [m["role"] for m in view.messages if str(m["content"]).startswith("<summary>")]
    assert roles == ["system"]


def retention(messages: Sequence[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The names of the planted facts found anywhere in ``messages``, and of those lost."""
    text = "\n".join(json.dumps(m, ensure_ascii=False) for m in messages)
    kept = [name for name, fact in PLANTED.items() if fact in text]
    return kept, [name for name in PLANTED if name not in kept]


async def test_local_summary_retains_the_early_facts(small_store: ContextStore) -> None:
    """At least 90% of the facts planted in the early turns are still in the view."""
    await planted_session(small_store, "s")
    view = await early_view(small_store, "s")
    kept, lost = retention(view.messages)
    print(f"retention: {len(kept)}/{len(PLANTED)} ({len(kept) / len(PLANTED):.2f}); lost: {lost}")
    assert len(kept) / len(PLANTED) >= 0.9, lost
