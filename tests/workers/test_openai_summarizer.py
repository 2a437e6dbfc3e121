"""OpenAISummarizer over a scripted HTTP transport, its settings, and a worker that runs it.

The summarizer runs the real ``openai`` SDK against ``httpx2.MockTransport``:
every request is recorded and checked after the call (an assertion raised
inside the transport would come back as a connection error, i.e. as
"unavailable"). The worker test runs a burst worker on real Redis, its
summarizer built from the settings alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import openai
import pytest
from pydantic import SecretStr
from support.apis import Reply, ScriptedAPI, raising
from support.apis.chat import api_error, completion_json, ok
from support.helpers import SYSTEM, append_until_due
from support.servers import run_burst

import workers.jobs
from ctxstore import (
    AnthropicSummarizer,
    ConfigurationError,
    ContextStore,
    LocalSummarizer,
    OpenAISummarizer,
    Settings,
    SummarizerError,
    SummarizerUnavailableError,
)
from ctxstore.models import Summary
from ctxstore.summarizers import SYSTEM_PROMPT, render_transcript, summarizer_from_settings
from workers.logs import LOGGERS

MODEL = "gpt-5-mini"
OPENAI = "https://api.openai.com/v1"
VLLM = "http://vllm.test:8000/v1"
LEDGER = "Task: migrate the ctx service to PostgreSQL 16 (Priya Raman)\nNumbers: port: 8443"
NARRATIVE = "- read /etc/ctx/app.yaml: port 8443"
"""The two levels of SUMMARY_TEXT."""

# -- a scripted Chat Completions API ------------------------------------------------


class FakeChatAPI(ScriptedAPI):
    """Plays back one scripted reply per request and records every request."""

    def __init__(self) -> None:
        super().__init__(
            lambda: api_error(500, "the test scripted no reply for this request", "server_error")
        )

    def summarizer(self, base_url: str = OPENAI, **kwargs: Any) -> OpenAISummarizer:
        """An OpenAISummarizer on this transport, the client's own retries off (as arq retries)."""
        client = openai.AsyncOpenAI(
            api_key="sk-test", base_url=base_url, http_client=self.http, max_retries=0
        )
        return OpenAISummarizer(client, model=MODEL, **kwargs)

    def spy(self, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
        """Make every client the summarizer builds talk to this transport; record its arguments."""
        built: list[dict[str, Any]] = []
        real = openai.AsyncOpenAI

        def spy(**kwargs: Any) -> openai.AsyncOpenAI:
            built.append(kwargs)
            return real(**kwargs, http_client=self.http)

        monkeypatch.setattr(openai, "AsyncOpenAI", spy)
        return built


@pytest.fixture
async def api() -> AsyncIterator[FakeChatAPI]:
    """A scripted Chat Completions API, closed after the test."""
    fake = FakeChatAPI()
    yield fake
    await fake.http.aclose()


def check_request(
    request: httpx2.Request,
    *,
    prompt: str,
    max_tokens: int,
    url: str = OPENAI,
    limit: str = "max_completion_tokens",
    cache_key: str | None = "ctxstore-summary",
    model: str = MODEL,
    timeout: float | None = None,
) -> None:
    """Assert one request is the summary call ctxstore means to make, and nothing more."""
    assert request.method == "POST"
    assert str(request.url) == f"{url}/chat/completions"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["x-stainless-retry-count"] == "0"
    body = json.loads(request.content)
    expected = {
        "model": model,
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": prompt},
        ],
        limit: max_tokens,
    }
    if cache_key is not None:
        expected["prompt_cache_key"] = cache_key
    assert body == expected  # no stream, no sampling knobs, no field a server may refuse
    if timeout is not None:
        assert request.extensions["timeout"]["read"] == timeout


def conversation_part(messages: list[dict[str, Any]]) -> str:
    """The prompt's last part: the turns, as a transcript."""
    return f"<conversation>\n{render_transcript(messages)}\n</conversation>"


# A short agent exchange in OpenAI's shape: a tool call and its result.
AGENT_TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "Read /etc/ctx/app.yaml and tell me the port."},
    {
        "role": "assistant",
        "content": "Reading the config.",
        "tool_calls": [
            {
                "id": "call_01A",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "/etc/ctx/app.yaml"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_01A", "content": "server:\n  port: 8443"},
    {"role": "assistant", "content": "The port is 8443."},
]


# -- the request and the answer ----------------------------------------------------


async def test_openai_gets_the_system_prompt_first_and_a_cache_key(api: FakeChatAPI) -> None:
    """One POST /v1/chat/completions: system prompt, then the turns; max_completion_tokens."""
    api.script.append(ok())
    summary = await api.summarizer(timeout=12.5).summarize(None, AGENT_TURNS, max_tokens=777)
    assert summary == Summary(LEDGER, NARRATIVE).text
    assert len(api.requests) == 1
    check_request(
        api.requests[0], prompt=conversation_part(AGENT_TURNS), max_tokens=777, timeout=12.5
    )
    assert api.requests[0].headers["authorization"] == "Bearer sk-test"


async def test_a_compatible_server_gets_max_tokens_and_no_cache_key(api: FakeChatAPI) -> None:
    """At a base URL (vLLM, Ollama, LiteLLM): its /v1/chat/completions, max_tokens, no extras."""
    api.script.append(ok())
    summary = await api.summarizer(VLLM).summarize_levels(None, AGENT_TURNS, max_tokens=900)
    assert summary == Summary(LEDGER, NARRATIVE)
    (request,) = api.requests
    assert request.url.path == "/v1/chat/completions"
    check_request(
        request,
        url=VLLM,
        limit="max_tokens",
        cache_key=None,
        max_tokens=900,
        prompt=(
            "Write the ledger in at most 300 tokens, and both parts together in at most 900."
            f"\n\n{conversation_part(AGENT_TURNS)}"
        ),
    )


async def test_the_token_field_and_cache_key_can_be_named(api: FakeChatAPI) -> None:
    """A server that reads max_completion_tokens and caches by key is sent both when asked."""
    api.script.append(ok())
    summarizer = api.summarizer(
        VLLM, token_limit="max_completion_tokens", prompt_cache_key="summaries-acme"
    )
    await summarizer.summarize(None, AGENT_TURNS, max_tokens=400)
    check_request(
        api.requests[0],
        url=VLLM,
        cache_key="summaries-acme",
        max_tokens=400,
        prompt=conversation_part(AGENT_TURNS),
    )


async def test_levels_lead_with_the_budgets_and_the_previous_summary(api: FakeChatAPI) -> None:
    """The budgets, the previous ledger and narrative, then the turns; the answer's two parts."""
    api.script.append(ok())
    previous = Summary("Decisions: use PostgreSQL 16", "- picked the database")
    summary = await api.summarizer().summarize_levels(
        previous, AGENT_TURNS, max_tokens=2_000, ledger_tokens=500
    )
    assert summary == Summary(LEDGER, NARRATIVE)
    check_request(
        api.requests[0],
        max_tokens=2_000,
        prompt=(
            "Write the ledger in at most 500 tokens, and both parts together in at most 2000.\n\n"
            "<previous_ledger>\nDecisions: use PostgreSQL 16\n</previous_ledger>\n\n"
            "<previous_narrative>\n- picked the database\n</previous_narrative>\n\n"
            + conversation_part(AGENT_TURNS)
        ),
    )


async def test_the_previous_one_level_summary_leads_the_prompt(api: FakeChatAPI) -> None:
    """The one-level call puts the previous text in <previous_summary> tags, then the turns."""
    api.script.append(ok("the new summary"))
    summary = await api.summarizer().summarize("the old summary", AGENT_TURNS, max_tokens=500)
    assert summary == "the new summary"
    check_request(
        api.requests[0],
        max_tokens=500,
        prompt="<previous_summary>\nthe old summary\n</previous_summary>\n\n"
        + conversation_part(AGENT_TURNS),
    )


async def test_an_answer_without_tags_is_all_ledger(api: FakeChatAPI) -> None:
    """An answer with no <ledger> tag is kept whole, as the ledger, with no narrative."""
    api.script.append(ok("  - port: 8443\n- database: PostgreSQL 16  "))
    summary = await api.summarizer().summarize_levels(None, AGENT_TURNS, max_tokens=300)
    assert summary == Summary("- port: 8443\n- database: PostgreSQL 16", "")


async def test_a_reasoning_models_thoughts_are_left_out(api: FakeChatAPI) -> None:
    """A <think> block at the head of the answer (vLLM, Ollama) is not part of the summary."""
    api.script.append(ok("<think>\nPRIVATE-REASONING-42\n</think>\n\nport: 8443"))
    summary = await api.summarizer(VLLM).summarize(None, AGENT_TURNS, max_tokens=300)
    assert summary == "port: 8443"


# -- failures played back ----------------------------------------------------------

UNAVAILABLE: dict[str, Reply] = {
    "429": api_error(429, "Rate limit reached for gpt-5-mini", "requests"),
    "408": api_error(408, "Request timed out", "timeout"),
    "500": api_error(500, "The server had an error", "server_error"),
    "502 html": httpx2.Response(
        502, content=b"<html>Bad Gateway</html>", headers={"content-type": "text/html"}
    ),
    "503": api_error(503, "The engine is currently overloaded", "server_error"),
    "504": api_error(504, "Gateway timeout", "server_error"),
    "read timeout": raising(lambda r: httpx2.ReadTimeout("read timed out", request=r)),
    "connect timeout": raising(lambda r: httpx2.ConnectTimeout("connect timed out", request=r)),
    "pool timeout": raising(lambda r: httpx2.PoolTimeout("no connection free", request=r)),
    "connection refused": raising(lambda r: httpx2.ConnectError("refused", request=r)),
}


@pytest.mark.parametrize("case", list(UNAVAILABLE))
async def test_transient_failures_are_unavailable(api: FakeChatAPI, case: str) -> None:
    """Rate limits, 408, 5xx, timeouts and refused connections: retry later, after one request."""
    api.script += [UNAVAILABLE[case], ok()]  # a hidden retry would get the 200
    with pytest.raises(SummarizerUnavailableError) as caught:
        await api.summarizer(VLLM).summarize(None, AGENT_TURNS, max_tokens=200)
    assert len(api.requests) == 1
    check_request(
        api.requests[0],
        url=VLLM,
        limit="max_tokens",
        cache_key=None,
        max_tokens=200,
        prompt=conversation_part(AGENT_TURNS),
    )
    assert isinstance(caught.value.__cause__, openai.APIError)  # chained with from
    assert caught.value.retry_after is None
    assert "vllm.test:8000" in str(caught.value)


@pytest.mark.parametrize(
    ("status", "headers", "wait"),
    [
        (429, {"retry-after": "7"}, 7.0),
        (429, {"retry-after-ms": "1500"}, 1.5),
        (503, {"retry-after-ms": "soon", "retry-after": "3"}, 3.0),
        (429, {"retry-after": "soon"}, None),
    ],
    ids=["seconds", "milliseconds", "bad-ms-then-seconds", "not-a-number"],
)
async def test_a_rate_limit_carries_the_servers_retry_after(
    api: FakeChatAPI, status: int, headers: dict[str, str], wait: float | None
) -> None:
    """retry-after-ms, else retry-after, is the retry_after; a value not a number is dropped."""
    api.script += [api_error(status, "slow down", "requests", headers), ok()]
    with pytest.raises(SummarizerUnavailableError) as caught:
        await api.summarizer().summarize(None, AGENT_TURNS, max_tokens=200)
    assert caught.value.retry_after == wait
    assert str(status) in str(caught.value)
    assert len(api.requests) == 1


def choice(message: dict[str, Any]) -> httpx2.Response:
    """A 200 whose one choice is ``message``."""
    return httpx2.Response(200, json=completion_json(message))


PERMANENT: dict[str, Reply] = {
    "400 context length": api_error(
        400, "This model's maximum context length is 8192 tokens", "invalid_request_error"
    ),
    "401": api_error(401, "Incorrect API key provided", "invalid_request_error"),
    "403": api_error(403, "Project does not have access to model", "invalid_request_error"),
    "404 model": api_error(404, "The model `qwen-nope` does not exist", "NotFoundError"),
    "409": api_error(409, "Conflict", "invalid_request_error"),
    "422": api_error(422, "messages: field required", "invalid_request_error"),
    "200 no choices": httpx2.Response(200, json={**completion_json(), "choices": []}),
    "200 choices not a list": httpx2.Response(200, json={**completion_json(), "choices": "x"}),
    "200 empty object": httpx2.Response(200, json={}),
    "200 only a tool call": choice(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_9",
                    "type": "function",
                    "function": {"name": "bash", "arguments": "{}"},
                }
            ],
        }
    ),
    "200 only whitespace": choice({"role": "assistant", "content": " \n "}),
    "200 only thoughts": choice({"role": "assistant", "content": "<think>hmm</think>\n"}),
    "200 content a number": choice({"role": "assistant", "content": 42}),
}


@pytest.mark.parametrize("case", list(PERMANENT))
async def test_permanent_failures_are_errors_not_unavailable(api: FakeChatAPI, case: str) -> None:
    """Refused requests and answers with no summary text: SummarizerError, after one request."""
    api.script += [PERMANENT[case], ok()]
    with pytest.raises(SummarizerError) as caught:
        await api.summarizer().summarize(None, AGENT_TURNS, max_tokens=200)
    assert not isinstance(caught.value, SummarizerUnavailableError)
    assert len(api.requests) == 1
    check_request(api.requests[0], max_tokens=200, prompt=conversation_part(AGENT_TURNS))


async def test_a_refusal_says_so(api: FakeChatAPI) -> None:
    """An answer that refuses carries the refusal into the SummarizerError."""
    api.script.append(
        choice({"role": "assistant", "content": None, "refusal": "I can't help with that."})
    )
    with pytest.raises(SummarizerError, match="refused: I can't help with that"):
        await api.summarizer().summarize(None, AGENT_TURNS, max_tokens=200)


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (b"{not json", "application/json"),
        (b"", "application/json"),
        (b"<html>maintenance</html>", "text/html"),
    ],
    ids=["truncated", "empty", "html"],
)
async def test_a_body_that_is_not_a_completion_is_a_summarizer_error(
    api: FakeChatAPI, body: bytes, kind: str
) -> None:
    """A 200 that cannot be read as a completion raises SummarizerError, not Unavailable."""
    api.script.append(httpx2.Response(200, content=body, headers={"content-type": kind}))
    with pytest.raises(SummarizerError) as caught:
        await api.summarizer().summarize(None, AGENT_TURNS, max_tokens=200)
    assert not isinstance(caught.value, SummarizerUnavailableError)
    assert len(api.requests) == 1


# -- chosen by the settings ---------------------------------------------------------

SUMMARIZER_VARIABLES = (
    "CTXSTORE_SUMMARIZER",
    "CTXSTORE_SUMMARY_MODEL",
    "CTXSTORE_ANTHROPIC_API_KEY",
    "ANTHROPIC_API_KEY",
    "CTXSTORE_OPENAI_API_KEY",
    "OPENAI_API_KEY",
    "CTXSTORE_OPENAI_BASE_URL",
    "OPENAI_BASE_URL",
)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The environment with none of the summarizer's variables set, to set them one by one."""
    for name in SUMMARIZER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


async def test_the_settings_name_a_local_server_and_its_model(
    api: FakeChatAPI, env: pytest.MonkeyPatch
) -> None:
    """CTXSTORE_SUMMARIZER=openai with a base URL and no key: that server, no SDK retry."""
    built = api.spy(env)
    env.setenv("CTXSTORE_SUMMARIZER", "openai")
    env.setenv("CTXSTORE_OPENAI_BASE_URL", VLLM)
    env.setenv("CTXSTORE_SUMMARY_MODEL", "Qwen/Qwen3-8B")
    env.setenv("CTXSTORE_SUMMARY_TIMEOUT", "9")
    summarizer = summarizer_from_settings(Settings())
    assert isinstance(summarizer, OpenAISummarizer) and summarizer.name == "Qwen/Qwen3-8B"
    (kwargs,) = built
    assert set(kwargs) == {"api_key", "base_url", "max_retries", "timeout"}
    assert (kwargs["base_url"], kwargs["max_retries"], kwargs["timeout"]) == (VLLM, 0, 9.0)
    api.script += [api_error(429, "slow down", "requests"), ok()]
    with pytest.raises(SummarizerUnavailableError):
        await summarizer.summarize(None, AGENT_TURNS, max_tokens=300)
    assert len(api.requests) == 1  # the SDK did not retry behind arq's back
    check_request(
        api.requests[0],
        url=VLLM,
        limit="max_tokens",
        cache_key=None,
        model="Qwen/Qwen3-8B",
        max_tokens=300,
        timeout=9.0,
        prompt=conversation_part(AGENT_TURNS),
    )


async def test_the_settings_send_openais_key_to_openai(
    api: FakeChatAPI, env: pytest.MonkeyPatch
) -> None:
    """OPENAI_API_KEY and no base URL: OpenAI's API, with that key as the bearer token."""
    built = api.spy(env)
    env.setenv("CTXSTORE_SUMMARIZER", "openai")
    env.setenv("OPENAI_API_KEY", "sk-proj-test")
    env.setenv("CTXSTORE_SUMMARY_MODEL", MODEL)
    summarizer = summarizer_from_settings(Settings())
    assert [(k["api_key"], k["base_url"]) for k in built] == [("sk-proj-test", OPENAI)]
    api.script.append(ok("port: 8443"))
    assert await summarizer.summarize(None, AGENT_TURNS, max_tokens=300) == "port: 8443"
    assert api.requests[0].headers["authorization"] == "Bearer sk-proj-test"
    check_request(
        api.requests[0], max_tokens=300, timeout=60.0, prompt=conversation_part(AGENT_TURNS)
    )


def test_an_openai_key_alone_leaves_the_default_local(env: pytest.MonkeyPatch) -> None:
    """With only OPENAI_API_KEY set (as agent pods often have), auto still picks the local one."""
    env.setenv("OPENAI_API_KEY", "sk-proj-test")
    assert isinstance(summarizer_from_settings(Settings()), LocalSummarizer)


@pytest.mark.parametrize(
    ("values", "kind"),
    [
        ({"anthropic_api_key": SecretStr("sk-ant")}, AnthropicSummarizer),
        ({"anthropic_api_key": SecretStr("sk-ant"), "summarizer": "local"}, LocalSummarizer),
        (
            {"summarizer": "anthropic", "anthropic_api_key": SecretStr("sk-ant")},
            AnthropicSummarizer,
        ),
    ],
    ids=["auto-with-anthropic-key", "local-over-a-key", "anthropic-named"],
)
def test_the_summarizer_follows_the_setting(
    env: pytest.MonkeyPatch, values: dict[str, Any], kind: type
) -> None:
    """By default Anthropic's goes with its key; a summarizer named wins over the keys set."""
    summarizer = summarizer_from_settings(Settings(**values))
    assert type(summarizer) is kind
    if kind is AnthropicSummarizer:
        assert summarizer.name == "claude-haiku-4-5"


@pytest.mark.parametrize(
    ("values", "needs"),
    [
        ({"summarizer": "anthropic"}, "ANTHROPIC_API_KEY"),
        ({"summarizer": "openai", "openai_api_key": SecretStr("sk")}, "CTXSTORE_SUMMARY_MODEL"),
        ({"summarizer": "openai", "summary_model": MODEL}, "OPENAI_API_KEY"),
    ],
    ids=["anthropic-without-key", "openai-without-model", "openai-api-without-key"],
)
def test_a_summarizer_missing_what_it_needs_is_refused(
    env: pytest.MonkeyPatch, values: dict[str, Any], needs: str
) -> None:
    """A named summarizer without its key, model or server: ConfigurationError naming it."""
    with pytest.raises(ConfigurationError, match=needs):
        summarizer_from_settings(Settings(**values))


def test_an_unknown_summarizer_is_refused(env: pytest.MonkeyPatch) -> None:
    """CTXSTORE_SUMMARIZER=gemini is a ConfigurationError naming the variable, read or built."""
    env.setenv("CTXSTORE_SUMMARIZER", "gemini")
    with pytest.raises(ConfigurationError, match="CTXSTORE_SUMMARIZER"):
        Settings()
    env.delenv("CTXSTORE_SUMMARIZER")
    unchecked = Settings().model_copy(update={"summarizer": "gemini"})
    with pytest.raises(ConfigurationError, match="CTXSTORE_SUMMARIZER: no summarizer 'gemini'"):
        summarizer_from_settings(unchecked)


@pytest.mark.parametrize("url", ["localhost:8000/v1", "ftp://models.test/v1", "http://"])
def test_a_base_url_that_is_not_http_is_refused(env: pytest.MonkeyPatch, url: str) -> None:
    """CTXSTORE_OPENAI_BASE_URL must be an http(s) URL with a host."""
    env.setenv("CTXSTORE_OPENAI_BASE_URL", url)
    with pytest.raises(ConfigurationError, match="CTXSTORE_OPENAI_BASE_URL"):
        Settings()


def test_blank_openai_variables_are_unset(env: pytest.MonkeyPatch) -> None:
    """An empty OPENAI_API_KEY, base URL or model (a blank line in a Secret) means: not set."""
    env.setenv("OPENAI_API_KEY", " ")
    env.setenv("OPENAI_BASE_URL", "")
    env.setenv("CTXSTORE_SUMMARY_MODEL", "")
    settings = Settings()
    assert (settings.openai_api_key, settings.openai_base_url, settings.summary_model) == (
        None,
        None,
        None,
    )


# -- a worker that summarizes with it, on real Redis --------------------------------


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Put the loggers the worker configures back as they were (configure is process-wide)."""
    saved = {name: logging.getLogger(name) for name in LOGGERS}
    before = {name: (logger.level, list(logger.handlers)) for name, logger in saved.items()}
    yield
    for name, logger in saved.items():
        level, handlers = before[name]
        logger.setLevel(level)
        logger.handlers[:] = handlers


@pytest.mark.usefixtures("restore_logging")
async def test_a_worker_configured_for_a_local_server_commits_its_summary(
    summary_settings: Settings,
    tenant: str,
    api: FakeChatAPI,
    env: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A burst worker built from settings alone: the 429's retry-after is honoured, then commits."""
    built = api.spy(env)
    waits: list[float | None] = []

    def no_wait(job_try: int, retry_after: float | None = None) -> float:
        waits.append(retry_after)
        return 0.0

    env.setattr(workers.jobs, "retry_delay", no_wait)
    settings = summary_settings.model_copy(
        update={
            "worker_name": f"worker-{tenant}",
            "summarizer": "openai",
            "openai_base_url": VLLM,
            "summary_model": "llama3.2",
        }
    )
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        await store.append("s", SYSTEM)
        await append_until_due(store, "s")
        api.script += [api_error(429, "slow down", "requests", {"retry-after": "7"}), ok()]

        worker = await asyncio.wait_for(run_burst(settings, None), 60)

        assert (worker.jobs_complete, worker.jobs_failed, worker.jobs_retried) == (1, 0, 1)
        assert waits == [7.0]
        assert len(built) == 1 and built[0]["base_url"] == VLLM
        assert len(api.requests) == 2
        first, second = api.requests
        assert first.content == second.content  # the retry asks the same
        body = json.loads(second.content)
        assert (body["model"], body["max_tokens"]) == ("llama3.2", settings.summary_max_tokens)
        assert str(second.url) == f"{VLLM}/chat/completions"
        assert "turn 0: the quick brown fox" in body["messages"][1]["content"]
        info = await store.info("s")
        assert info.summary_runs == 1 and info.summary_last_outcome == "committed"
        assert info.summary_model == "llama3.2"
        view = await store.view("s", token_budget=info.summary_tokens + 300)
    assert view.stats.summary_used
    summary = view.messages[1]
    assert summary["role"] == "user" and summary["content"].startswith(f"<summary>\n{LEDGER}")
    assert "summarizer openai (llama3.2)" in capsys.readouterr().err
