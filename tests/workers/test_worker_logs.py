"""The worker's log: formats, levels, what each event carries, and no secret in any line.

The formatter tests are pure. The worker tests run a real worker against a
private redis-server whose password is in the URL, with encryption keys and
an Anthropic key set (the SDK talks to a scripted transport), capture every
line it writes at DEBUG, and look for the password, the keys, message text
and summary text in them.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import os
import re
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest
from pydantic import SecretStr
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from support.apis.messages import api_error, ok
from support.servers import PrivateRedis, ServerPool, run_burst

import workers.jobs
from ctxstore import AnthropicSummarizer, ConfigurationError, ContextStore, Settings
from ctxstore.testing import FakeSummarizer
from workers.logs import LOGGERS, configure, error_text, mark_logged, redacted

CTXSTORE = str(Path(sys.executable).with_name("ctxstore"))
MODEL = "claude-haiku-4-5"
TRIGGER = 400
KEEP = 150
RUN = uuid.uuid4().hex[:10]
PASSWORD = f"pw-{RUN}-Secret"
API_KEY = f"sk-ant-api03-{RUN}-NeverLogged"
ENCRYPTION_KEY = base64.b64encode(b"K" * 16 + RUN.encode()[:10] + b"k" * 6).decode()
WORDS = f"ZebraWords{RUN}"
"""In every message's text: no log line may hold it."""
SUMMARY_WORDS = f"SummaryWords{RUN}"
"""In every summary the scripted API writes: no log line may hold it."""
SECRETS = (PASSWORD, API_KEY, ENCRYPTION_KEY, WORDS, SUMMARY_WORDS)
JOB_FIELDS = ("tenant", "session", "outcome", "entries", "tokens_in", "tokens_out", "duration_ms")

_TEXT_LINE = re.compile(r"(?P<ts>\S+) (?P<level>[A-Z]+) +(?P<logger>\S+)  (?P<rest>.*)")
_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\{\S*\}|\S+)')


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """Put the loggers configure touches back as they were (configure is process-wide)."""
    saved = {name: logging.getLogger(name) for name in LOGGERS}
    before = {name: (logger.level, list(logger.handlers)) for name, logger in saved.items()}
    yield
    for name, logger in saved.items():
        level, handlers = before[name]
        logger.setLevel(level)
        logger.handlers[:] = handlers


def parse(out: str, fmt: str) -> list[dict[str, Any]]:
    """Every record in ``out``, as a dict: ts, level, logger, message (text: fields only), fields.

    Fails on a line that is not a record: in text, only a traceback's lines
    (which start with spaces) may follow a record's line.
    """
    records: list[dict[str, Any]] = []
    for line in out.splitlines():
        if fmt == "json":
            records.append(json.loads(line))
            continue
        if line.startswith(" ") and records:
            records[-1].setdefault("exc", "")
            records[-1]["exc"] += line + "\n"
            continue
        match = _TEXT_LINE.fullmatch(line)
        assert match is not None, f"not a log line: {line!r}"
        record: dict[str, Any] = {k: match.group(k) for k in ("ts", "level", "logger")}
        record["message"] = match.group("rest")
        record.update({k: _text_value(v) for k, v in _FIELD.findall(match.group("rest"))})
        records.append(record)
    for record in records:
        stamp = datetime.fromisoformat(record["ts"])
        assert stamp.tzinfo is not None, record
    return records


def _text_value(raw: str) -> Any:
    if raw == "-":
        return None
    if raw[0] in '"{' or raw in ("true", "false") or re.fullmatch(r"-?\d+(\.\d+)?", raw):
        return json.loads(raw)
    return raw


def events(records: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    """The records of one event."""
    return [r for r in records if r.get("event") == event]


# -- the formatters ------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_record_is_one_line_with_a_zoned_timestamp_and_its_fields(fmt: str) -> None:
    """Each format writes one line per event: time with zone, level, logger, fields as keys."""
    out = io.StringIO()
    configure("INFO", fmt, stream=out)
    logging.getLogger("ctxstore.worker").info(
        "job %s",
        "committed",
        extra={"tenant": "acme", "entries": 12, "detail": "two words", "missing": None},
    )

    (record,) = parse(out.getvalue(), fmt)
    assert (record["level"], record["logger"]) == ("INFO", "ctxstore.worker")
    assert "job committed" in record["message"]
    assert record["tenant"] == "acme"
    assert record["entries"] == 12
    assert record["detail"] == "two words"
    assert record["missing"] is None


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_value_holding_a_newline_cannot_forge_a_line(fmt: str) -> None:
    """An untrusted value with a newline and a fake record stays inside its own line."""
    out = io.StringIO()
    configure("INFO", fmt, stream=out)
    forged = "acme\n2030-01-01T00:00:00+00:00 ERROR   ctxstore.worker  forged"
    logging.getLogger("ctxstore.worker").warning("skipped %s", forged, extra={"tenant": forged})

    assert out.getvalue().count("\n") == 1
    (record,) = parse(out.getvalue(), fmt)
    assert record["tenant"] == forged
    assert record["level"] == "WARNING"


def test_a_traceback_follows_on_indented_lines_in_text_and_in_one_key_in_json() -> None:
    """Text: the traceback's lines start with spaces; JSON: it is the ``exc`` key of one line."""
    for fmt in ("text", "json"):
        out = io.StringIO()
        configure("INFO", fmt, stream=out)
        try:
            raise KeyError("gone")
        except KeyError:
            logging.getLogger("workers").exception("bug")
        (record,) = parse(out.getvalue(), fmt)
        assert "KeyError: 'gone'" in record["exc"], fmt


def test_configure_again_replaces_its_handler_and_keeps_the_applications() -> None:
    """A second configure writes each line once, in the new format; another handler stays."""
    theirs = logging.NullHandler()
    logging.getLogger("ctxstore").addHandler(theirs)
    first, second = io.StringIO(), io.StringIO()
    configure("INFO", "text", stream=first)
    configure("INFO", "json", stream=second)
    logging.getLogger("ctxstore.worker").info("once")

    assert first.getvalue() == ""
    assert [r["message"] for r in parse(second.getvalue(), "json")] == ["once"]
    assert theirs in logging.getLogger("ctxstore").handlers


def test_the_level_applies_to_ctxstore_and_workers_and_arq_info_shows_from_debug() -> None:
    """At INFO: no DEBUG, no arq INFO, arq warnings; at DEBUG, all of them."""
    out = io.StringIO()
    configure("INFO", "json", stream=out)
    for name in ("ctxstore.summary_queue", "workers.x", "arq.worker"):
        logging.getLogger(name).debug("debug %s", name)
        logging.getLogger(name).info("info %s", name)
    logging.getLogger("arq.worker").warning("warning arq")
    assert [r["message"] for r in parse(out.getvalue(), "json")] == [
        "info ctxstore.summary_queue",
        "info workers.x",
        "warning arq",
    ]

    out = io.StringIO()
    configure("DEBUG", "json", stream=out)
    logging.getLogger("arq.worker").debug("debug arq")
    logging.getLogger("arq.worker").info("info arq")
    assert [r["message"] for r in parse(out.getvalue(), "json")] == ["debug arq", "info arq"]


@pytest.mark.parametrize(
    ("level", "fmt", "named"), [("VERBOSE", "text", "'VERBOSE'"), ("INFO", "yaml", "'yaml'")]
)
def test_an_unknown_level_or_format_is_a_configuration_error(
    level: str, fmt: str, named: str
) -> None:
    """An unknown level or format is refused with a ConfigurationError naming the value."""
    with pytest.raises(ConfigurationError, match=named):
        configure(level, fmt)


def test_arq_s_report_of_an_exception_the_job_logged_is_dropped() -> None:
    """An exception marked as logged is not reported again by arq; an unmarked one is."""
    out = io.StringIO()
    configure("INFO", "json", stream=out)
    arq_log = logging.getLogger("arq.worker")
    for marked in (True, False):
        try:
            raise ValueError("marked" if marked else "not marked")
        except ValueError as exc:
            if marked:
                mark_logged(exc)
            arq_log.exception("job failed")
    (record,) = parse(out.getvalue(), "json")
    assert "not marked" in record["exc"]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://worker:pw@10.0.0.5:6380/2?password=pw2", "redis://10.0.0.5:6380/2"),
        ("rediss://:pw@[::1]:7000/1", "rediss://[::1]:7000/1"),
        ("unix:///run/redis.sock?db=1&password=pw", "unix:///run/redis.sock"),
        ("redis+sentinel://u:pw@s1:26380,s2/queue/3", "redis+sentinel://s1:26380,s2:26379/queue/3"),
        ("redis://u:pw@host:port/0", "(a URL that does not parse)"),
    ],
)
def test_redacted_urls_keep_where_and_drop_who_and_the_query(url: str, shown: str) -> None:
    """redacted() keeps scheme, host, port and database; never a user, password or query."""
    assert redacted(url) == shown


# -- a real worker -----------------------------------------------------------------------


@pytest.fixture
def server(servers: ServerPool) -> PrivateRedis:
    """A private redis-server with a user whose password goes in the URL."""
    return servers.start(
        acl=f"user default on nopass ~* &* +@all\nuser logs on >{PASSWORD} ~* &* +@all\n"
    )


def worker_settings(server: PrivateRedis, **more: Any) -> Settings:
    """Settings on the private server: password in the URL, encryption on, an API key."""
    return Settings(
        redis_url=server.url("logs", PASSWORD),
        key_prefix=f"logs{RUN}",
        queue_name=f"logs{RUN}:summaries",
        worker_name=f"logs-{RUN}",
        summary_trigger_tokens=TRIGGER,
        summary_keep_tokens=KEEP,
        anthropic_api_key=SecretStr(API_KEY),
        encryption_keys={"k1": SecretStr(ENCRYPTION_KEY)},
        encryption_active_key="k1",
        **more,
    )


async def test_error_text_drops_the_command_a_failed_pipeline_quotes(server: PrivateRedis) -> None:
    """redis-py quotes a refused pipeline command with its arguments; error_text keeps neither."""
    client = Redis.from_url(server.url("logs", PASSWORD))
    try:
        async with client.pipeline(transaction=True) as pipe:
            pipe.set("k", "v")
            pipe.hset("k", "message", f"{WORDS}\nsecond line")
            with pytest.raises(ResponseError) as raised:
                await pipe.execute()
    finally:
        await client.aclose()

    assert WORDS in str(raised.value)  # what redis-py says
    text = error_text(raised.value)
    assert WORDS not in text
    assert "Command # 2 of pipeline" in text and "WRONGTYPE" in text
    assert "\n" not in text


async def make_due(store: ContextStore, session: str) -> None:
    """Append turns carrying WORDS (and the session's name) until a summary is due."""
    for i in range(100):
        text = f"{session} turn {i}: {WORDS} the quick brown fox jumps over the lazy dog"
        role = "user" if i % 2 == 0 else "assistant"
        if (await store.append(session, {"role": role, "content": text})).summary_due:
            return
    raise AssertionError("no append raised the summary flag")


class ScriptedAPI:
    """A Messages API that answers by session: ``flaky`` is overloaded once, ``broken`` is refused.

    Sessions run at once, so replies follow the session named in the prompt,
    not the order of requests.
    """

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.http = httpx2.AsyncClient(transport=httpx2.MockTransport(self._handle))

    def _handle(self, request: httpx2.Request) -> httpx2.Response:
        prompt = request.content.decode()
        session = next(s for s in ("flaky", "broken", "fine") if f"{s} turn" in prompt)
        self.calls[session] = self.calls.get(session, 0) + 1
        if session == "broken":
            return api_error(400, "invalid_request_error", "messages: bad request")
        if session == "flaky" and self.calls[session] == 1:
            return api_error(529, "overloaded_error", "Overloaded")
        return ok(f"<ledger>\nTask: {SUMMARY_WORDS}\n</ledger>\n<narrative>\n- done\n</narrative>")

    def summarizer(self) -> AnthropicSummarizer:
        """The real summarizer on this transport, with the run's API key."""
        client = anthropic.AsyncAnthropic(api_key=API_KEY, http_client=self.http, max_retries=0)
        return AnthropicSummarizer(client, model=MODEL)


@pytest.fixture
async def api() -> AsyncIterator[ScriptedAPI]:
    """The scripted Messages API, closed after the test."""
    scripted = ScriptedAPI()
    yield scripted
    await scripted.http.aclose()


@pytest.mark.parametrize("fmt", ["text", "json"])
async def test_a_worker_logs_start_jobs_failures_and_stop_and_no_secret(
    fmt: str,
    server: PrivateRedis,
    api: ScriptedAPI,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At DEBUG, every line parses; jobs carry their fields; no password, key or text appears."""
    monkeypatch.setattr(workers.jobs, "retry_delay", lambda job_try, retry_after=None: 0.01)
    settings = worker_settings(server, log_level="DEBUG", log_format=fmt)
    async with ContextStore.from_settings(settings, tenant="acme") as store:
        for session in ("fine", "flaky", "broken"):
            await make_due(store, session)
    capsys.readouterr()

    worker = await asyncio.wait_for(run_burst(settings, api.summarizer()), 60)

    out = capsys.readouterr().err
    assert (worker.jobs_complete, worker.jobs_failed, worker.jobs_retried) == (2, 1, 1)
    for secret in SECRETS:
        assert secret not in out
    records = parse(out, fmt)

    (start,) = events(records, "start")
    assert start["queue_redis"] == start["store_redis"] == f"redis://127.0.0.1:{server.port}/0"
    assert (start["summarizer"], start["model"]) == ("anthropic", MODEL)
    assert (start["worker"], start["queue"]) == (settings.worker_name, settings.queue_name)

    jobs = [r for r in events(records, "job") if r["outcome"] != "started"]
    for job in jobs:
        assert all(field in job for field in JOB_FIELDS), job
        assert job["tenant"] == "acme"
    ended = sorted((j["session"], j["outcome"]) for j in jobs)
    assert ended == [
        ("broken", "failed"),
        ("fine", "committed"),
        ("flaky", "committed"),
        ("flaky", "retry"),
    ]
    for job in jobs:
        if job["outcome"] == "committed":
            assert job["entries"] > 0 and job["tokens_in"] > 0 and job["tokens_out"] > 0
            assert job["level"] == "INFO"
    (retry,) = [j for j in jobs if j["outcome"] == "retry"]
    assert (retry["level"], retry["retry"], retry["try"]) == ("WARNING", True, 1)
    assert (retry["error"], retry["cause"]) == ("SummarizerUnavailableError", "OverloadedError")
    (failed,) = [j for j in jobs if j["outcome"] == "failed"]
    assert (failed["level"], failed["retry"]) == ("ERROR", False)
    assert (failed["error"], failed["cause"]) == ("SummarizerError", "BadRequestError")
    # Once per failure: arq does not report the failed job a second time.
    assert [r for r in records if r["level"] == "ERROR"] == [failed]

    (stop,) = events(records, "stop")
    assert stop["reason"] == "queue empty (burst)"
    assert (stop["jobs"], stop["committed"], stop["failed"], stop["retried"]) == (3, 2, 1, 1)
    assert records.index(start) < records.index(failed) < records.index(stop)


def cli_env(server: PrivateRedis, **more: str) -> dict[str, str]:
    """The environment of ``ctxstore worker`` on the private server: password, keys, no API key."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CTXSTORE_") and k != "ANTHROPIC_API_KEY"
    }
    env.update(
        CTXSTORE_REDIS_URL=server.url("logs", PASSWORD),
        CTXSTORE_KEY_PREFIX=f"logs{RUN}",
        CTXSTORE_QUEUE_NAME=f"logs{RUN}:summaries",
        CTXSTORE_WORKER_NAME=f"logs-{RUN}",
        CTXSTORE_SUMMARY_TRIGGER_TOKENS=str(TRIGGER),
        CTXSTORE_SUMMARY_KEEP_TOKENS=str(KEEP),
        CTXSTORE_ENCRYPTION_KEYS=json.dumps({"k1": ENCRYPTION_KEY}),
        CTXSTORE_ENCRYPTION_ACTIVE_KEY="k1",
        **more,
    )
    return env


async def test_ctxstore_worker_logs_json_until_sigterm_then_its_stop(server: PrivateRedis) -> None:
    """`ctxstore worker` (JSON, DEBUG): start, sweep, the job, SIGTERM's stop; no secret."""
    settings = worker_settings(server).model_copy(update={"anthropic_api_key": None})
    async with ContextStore.from_settings(settings, tenant="acme") as store:
        await make_due(store, "fine")
    env = cli_env(server, CTXSTORE_LOG_FORMAT="json", CTXSTORE_LOG_LEVEL="DEBUG")
    proc = await asyncio.create_subprocess_exec(
        CTXSTORE,
        "worker",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    seen: list[dict[str, Any]] = []
    lines: list[str] = []
    try:
        async with asyncio.timeout(60):
            # Read until the job's line and the start-up sweep's line are out.
            while not (
                any(r.get("outcome") == "committed" for r in seen)
                and any(r.get("event") == "sweep" for r in seen)
            ):
                line = (await proc.stderr.readline()).decode()
                assert line, f"the worker exited early: {''.join(lines)}"
                lines.append(line)
                seen.append(json.loads(line))
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            stdout, rest = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    out = "".join(lines) + rest.decode()

    assert stdout == b""
    assert proc.returncode == 0, out
    for secret in SECRETS:
        assert secret not in out
    records = parse(out, "json")
    (start,) = events(records, "start")
    assert (start["summarizer"], start["model"]) == ("local", "local-ledger")
    assert start["queue_redis"] == f"redis://127.0.0.1:{server.port}/0"
    (job,) = [r for r in events(records, "job") if r["outcome"] == "committed"]
    assert all(field in job for field in JOB_FIELDS), job
    (sweep,) = events(records, "sweep")
    assert all(key in sweep for key in ("tenants", "sessions", "queued", "skipped")), sweep
    (stopping,) = events(records, "stopping")
    assert stopping["signal"] == "SIGTERM"
    (stop,) = events(records, "stop")
    assert (stop["reason"], stop["jobs"], stop["committed"]) == ("SIGTERM", 1, 1)


async def test_a_fake_summarizer_is_named_by_its_class_in_the_start_line(
    server: PrivateRedis, capsys: pytest.CaptureFixture[str]
) -> None:
    """A summarizer neither local nor Anthropic's is named by its class, with its model name."""
    settings = worker_settings(server, log_format="json")
    capsys.readouterr()
    await asyncio.wait_for(run_burst(settings, FakeSummarizer()), 30)
    (start,) = events(parse(capsys.readouterr().err, "json"), "start")
    assert (start["summarizer"], start["model"]) == ("FakeSummarizer", "fake")
