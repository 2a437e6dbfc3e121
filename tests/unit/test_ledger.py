"""The ledger summarizer: facts by kind, corrections, merging, eviction, budgets, folding.

The last tests build long synthetic agent conversations (facts of every kind
planted among chatter and tool output full of numbers), fold them in batches,
and measure how many planted values the summary still holds.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

import pytest

from ctxstore._local.ledger_text import HEADER, MORE
from ctxstore._local.narrative import NARRATIVE
from ctxstore._local.summarizer import LocalSummarizer as LedgerSummarizer
from ctxstore.models import Summary
from ctxstore.tokens import TiktokenCounter

COUNTER = TiktokenCounter()


def user(text: str) -> dict[str, Any]:
    """A user message."""
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    """An assistant message."""
    return {"role": "assistant", "content": text}


def openai_call(
    call_id: str, tool: str, arguments: dict[str, Any], output: str
) -> list[dict[str, Any]]:
    """An OpenAI Chat tool call and its result."""
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": tool, "arguments": json.dumps(arguments)},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": output},
    ]


def anthropic_call(
    call_id: str, tool: str, arguments: dict[str, Any], output: str, *, is_error: bool = False
) -> list[dict[str, Any]]:
    """An Anthropic tool_use block and its tool_result, thinking included."""
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "The batch size is 999999.", "signature": "c2ln"},
                {"type": "tool_use", "id": call_id, "name": tool, "input": arguments},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": call_id,
                    "is_error": is_error,
                    "content": [{"type": "text", "text": output}],
                }
            ],
        },
    ]


def responses_call(
    call_id: str, tool: str, arguments: dict[str, Any], output: str
) -> list[dict[str, Any]]:
    """An OpenAI Responses API function call and its output, with a reasoning item."""
    return [
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "ORD-99999"}],
        },
        {
            "type": "function_call",
            "call_id": call_id,
            "name": tool,
            "arguments": json.dumps(arguments),
        },
        {"type": "function_call_output", "call_id": call_id, "output": output},
    ]


async def ledger_of(messages: Sequence[dict[str, Any]], **budget: int) -> str:
    """The ledger of ``messages`` summarized in one batch (a roomy budget by default)."""
    summary = await LedgerSummarizer(COUNTER).summarize_levels(
        None,
        messages,
        max_tokens=budget.get("max_tokens", 6_000),
        ledger_tokens=budget.get("ledger_tokens", 2_000),
    )
    return summary.ledger


def section(ledger: str, heading: str) -> list[str]:
    """The lines under one heading of a ledger, without their bullets."""
    lines, inside = [], False
    for line in ledger.splitlines():
        if line.endswith(":") and not line.startswith("- "):
            inside = line == f"{heading}:"
        elif inside:
            lines.append(line.removeprefix("- "))
    return lines


def told(summary: Summary) -> str:
    """Level 2's narrative: what follows its further facts."""
    return summary.narrative[summary.narrative.index(NARRATIVE) :]


def state_entries(summary: Summary) -> list[dict[str, Any]]:
    """The entries a summary's state carries."""
    assert summary.state is not None
    entries: list[dict[str, Any]] = json.loads(summary.state)["entries"]
    return entries


async def two_batches(first: Sequence[dict[str, Any]], then: Sequence[dict[str, Any]]) -> str:
    """The ledger after folding ``then`` into the summary of ``first``."""
    summarizer = LedgerSummarizer(COUNTER)
    earlier = await summarizer.summarize_levels(None, first, max_tokens=6_000, ledger_tokens=2_000)
    summary = await summarizer.summarize_levels(
        earlier, then, max_tokens=6_000, ledger_tokens=2_000
    )
    return summary.ledger


TASK = user("Please harden the upload service before the release.")


# -- facts by kind -----------------------------------------------------------------


@pytest.mark.parametrize(
    "ask",
    [
        "Can you add retries to the webhook handler?",
        "Could you write a migration for the invoices table?",
        "I need you to review the consumer loop.",
        "Next, refactor the retry helper into its own module.",
    ],
)
async def test_the_first_message_is_the_task_and_later_asks_are_requests(ask: str) -> None:
    """The first user message is the Task line; a later ask is listed under Requests."""
    ledger = await ledger_of([TASK, assistant("On it."), user(ask)])
    assert "Task: Please harden the upload service before the release." in ledger.splitlines()
    assert section(ledger, "Requests") == [ask]


async def test_a_greeting_is_not_the_task() -> None:
    """The task is the first sentence that says something, not "Hi!"."""
    ledger = await ledger_of([user("Hi! I'm migrating the ctx service to the new queue.")])
    assert "Task: I'm migrating the ctx service to the new queue." in ledger


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (
            "We decided to use PostgreSQL 16 for the store because it handles JSONB well.",
            "We decided to use PostgreSQL 16 for the store because it handles JSONB well",
        ),
        (
            "Let's go with Redis streams since ops already runs Redis.",
            "Let's go with Redis streams since ops already runs Redis",
        ),
        (
            "We'll use pnpm so that installs stay reproducible.",
            "We'll use pnpm so that installs stay reproducible",
        ),
        (
            "We settled on gRPC. That's because the clients are generated.",
            "We settled on gRPC, that's because the clients are generated",
        ),
        (
            "I recommend orjson for the serialization library because it is the fastest.",
            "I recommend orjson for the serialization library because it is the fastest",
        ),
        (
            "OK, final answer on the locking strategy is optimistic versioning.",
            "final answer on the locking strategy is optimistic versioning",
        ),
    ],
)
async def test_decisions_keep_their_reason(text: str, line: str) -> None:
    """A decision is one line with its reason, stated in the same sentence or the next."""
    assert section(await ledger_of([TASK, user(text)]), "Decisions") == [line]


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("Never touch the billing module.", "Never touch the billing module"),
        ("You must not push to main directly.", "You must not push to main directly"),
        ("Do not delete the nightly backups.", "Do not delete the nightly backups"),
        ("Keep each answer at most 200 words.", "Keep each answer at most 200 words"),
        ("No more than 3 retries per request.", "No more than 3 retries per request"),
        ("The budget is 4,250 EUR.", "budget: 4,250 EUR"),
        ("The deadline is March 14.", "deadline: March 14"),
        ("We need it shipped by Friday.", "deadline: Friday"),
        ("No production changes on Wednesdays, please.", "No production changes on Wednesdays"),
        (
            "Goodwill credits can't go above 7.5% of the order value.",
            "Goodwill credits can't go above 7.5% of the order value",
        ),
        (
            "Nobody should have more than 9 hours of flying.",
            "Nobody should have more than 9 hours of flying",
        ),
    ],
)
async def test_constraints(text: str, line: str) -> None:
    """Musts, nevers, limits, budgets and deadlines are constraints, values kept exactly."""
    assert section(await ledger_of([TASK, user(text)]), "Constraints") == [line]


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("I prefer tabs over spaces.", "I prefer tabs over spaces"),
        ("I'd rather use httpx than requests.", "I'd rather use httpx than requests"),
        ("Always use UTC timestamps in logs.", "Always use UTC timestamps in logs"),
        ("Please use pnpm for installs.", "Please use pnpm for installs"),
        ("Please always answer in Portuguese.", "Please always answer in Portuguese"),
        ("Times in America/Halifax please.", "Times in America/Halifax please"),
        (
            "Give me commands for POSIX sh; that's what I run.",
            "Give me commands for POSIX sh; that's what I run",
        ),
    ],
)
async def test_preferences(text: str, line: str) -> None:
    """Stated preferences are kept as said."""
    assert section(await ledger_of([TASK, user(text)]), "Preferences") == [line]


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("The order is ORD-123.", "order: ORD-123"),
        ("Incident INC-4411 is still open.", "Incident INC-4411"),
        ("The regression started at commit 9f3c2ab.", "commit 9f3c2ab"),
        ("Send the report to dana.li@example.com please.", "report: dana.li@example.com"),
        (
            "The runbook is at https://wiki.example.com/runbooks/upload.",
            "runbook: https://wiki.example.com/runbooks/upload",
        ),
        ("Pin ctx-client to version 3.2.1.", "ctx-client: 3.2.1"),
        ("The ticket is 4411.", "ticket 4411"),
        ("See PR #482 for the fix.", "PR #482"),
        ("The staging box is at 10.0.4.17.", "staging box: 10.0.4.17"),
        (
            "Use fdf57f1 as the commit that broke it in anything you file.",
            "commit that broke it: fdf57f1",
        ),
        (
            "Here's the customer's account id: acct_scQoYod3.",
            "customer's account id: acct_scQoYod3",
        ),
        (
            "The DOI of the main study is 10.3875/lithium.4447.296.",
            "DOI of the main study: 10.3875/lithium.4447.296",
        ),
        ("It crashed with ECONNRESET 10.49.103.169 again.", "error: ECONNRESET 10.49.103.169"),
        ("Error from my side: nonce_upstream_replica.", "error: nonce_upstream_replica"),
    ],
)
async def test_identifiers(text: str, line: str) -> None:
    """Tickets, shas, emails, URLs, versions, IPs, DOIs, generated ids, error names in prose."""
    ledger = await ledger_of([TASK, user(text)])
    assert section(ledger, "Identifiers") == [line]
    assert section(ledger, "Errors") == []  # only a failed tool call is an error


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("Set the batch size to 512.", "batch size: 512"),
        ("p95 latency: 230 ms", "p95 latency: 230 ms"),
        ("Our p95 latency is 230 ms right now.", "p95 latency: 230 ms"),
        ("We run 6 replicas in production.", "6 replicas"),
        ("The service listens on port 8443.", "port 8443"),
        ("Use a learning rate of 0.001 for the fine-tune.", "learning rate: 0.001"),
        ("Target throughput: 1.2k req/s.", "Target throughput: 1.2k req/s"),
    ],
)
async def test_numbers_keep_their_subject(text: str, line: str) -> None:
    """A number is kept with the words that say what it measures."""
    assert section(await ledger_of([TASK, user(text)]), "Numbers") == [line]


@pytest.mark.parametrize(
    ("text", "heading", "line"),
    [
        ("The config lives at /etc/app/app.yaml.", "Paths", "config: /etc/app/app.yaml"),
        ("Open src/parser/lexer.py and fix the import.", "Paths", "src/parser/lexer.py"),
        ("Logs go to ~/logs/upload.log.", "Paths", "~/logs/upload.log"),
        ("Priya Raman owns the deploy.", "Names", "Priya Raman"),
        ("The reviewer is Dana Li.", "Names", "reviewer: Dana Li"),
        ("Ask Marco before merging.", "Names", "Ask Marco"),
        ("The payments-api keeps timing out.", "Names", "payments-api"),
        ("The launch is on 2024-06-03.", "Dates", "launch: 2024-06-03"),
        ("Maintenance is scheduled for May 20.", "Dates", "Maintenance: May 20"),
        ("The code freeze starts next Monday.", "Dates", "code freeze starts next Monday"),
    ],
)
async def test_paths_names_and_dates(text: str, heading: str, line: str) -> None:
    """Paths, people and services, and dates are kept exactly, with their subject when stated."""
    assert section(await ledger_of([TASK, user(text)]), heading) == [line]


async def test_questions_and_chatter_state_no_facts() -> None:
    """A question, an acknowledgement, a code block and a step number are not facts."""
    ledger = await ledger_of(
        [
            TASK,
            assistant("Should the batch size be 512? Let me check. Step 3: read the file."),
            assistant("Here it is:\n```python\nretries = 5\nraise ValueError('error')\n```\nDone."),
        ]
    )
    assert ledger.splitlines() == [HEADER, "Task: " + TASK["content"]]


# -- tool results -------------------------------------------------------------------


async def test_a_code_line_with_error_in_it_is_not_an_error() -> None:
    """A file whose code logs and raises errors, or a log of ERROR lines, is no failure."""
    code = 'if error:\n    log.error("failed: %s", error)\n    raise ValueError("bad input")\n'
    logs = "2024-05-01T12:00:01Z ERROR worker-3 retrying 8f2a11c0 after 3 attempts\n" * 3
    messages = [
        TASK,
        *openai_call("c1", "read_file", {"path": "src/worker.py"}, code),
        *anthropic_call("t2", "tail_logs", {"service": "worker"}, logs),
    ]
    ledger = await ledger_of(messages)
    assert section(ledger, "Errors") == []
    assert section(ledger, "Tools") == [
        "read_file: 1 call; src/worker.py → 3 lines",
        "tail_logs: 1 call; worker → 3 lines",
    ]


@pytest.mark.parametrize(
    ("output", "is_error", "line"),
    [
        (
            'Traceback (most recent call last):\n  File "x.py", line 3, in <module>\n'
            "    raise KeyError('customer_id')\nKeyError: 'customer_id'",
            False,
            "run(job.py): KeyError: 'customer_id'",
        ),
        (
            "running migrations...\nmake: *** [migrate] Error 1\nexit code 2",
            False,
            "run(job.py): exit code 2",
        ),
        (
            "fatal: could not read Username for 'https://github.com'",
            False,
            "run(job.py): fatal: could not read Username for 'https://github.com'",
        ),
        ("permission problem on the bucket", True, "run(job.py): permission problem on the bucket"),
        (
            '{"exit_code": 1, "stderr": "psycopg.OperationalError: connection refused"}',
            False,
            "run(job.py): psycopg.OperationalError: connection refused",
        ),
    ],
    ids=["traceback", "exit-code", "fatal", "is-error", "json"],
)
async def test_a_failing_tool_result_gives_its_error_line(
    output: str, is_error: bool, line: str
) -> None:
    """A failed call (exception, non-zero exit, error line, is_error, JSON) is an error fact."""
    messages = [TASK, *anthropic_call("t1", "run", {"path": "job.py"}, output, is_error=is_error)]
    ledger = await ledger_of(messages)
    assert section(ledger, "Errors") == [line]
    assert section(ledger, "Tools") == ["run: 1 call, 1 failed; job.py → failed"]


async def test_tool_output_numbers_are_not_facts() -> None:
    """Logs, tables and git output full of numbers, ids and emails add only the tools' lines."""
    rng = random.Random(7)
    messages = [
        TASK,
        *openai_call("c1", "tail_logs", {"lines": 12}, log_lines(rng, 12)),
        *responses_call(
            "c2",
            "git_log",
            {"n": 1},
            "commit 4e5f6a7b8c9d\nAuthor: CI Bot <ci@example.com>\n\n    chore: bump",
        ),
        *anthropic_call(
            "c3", "run_sql", {"q": "select"}, "| id | total |\n| 17 | 20.50 |\n(1 row)"
        ),
    ]
    ledger = await ledger_of(messages)
    headings = [line for line in ledger.splitlines() if line.endswith(":")]
    assert headings == [HEADER, "Tools:"]
    assert section(ledger, "Tools")[-1] == "run_sql: 1 call; select → (1 row)"


async def test_notes_written_among_tool_data_are_facts_and_config_blocks_are_not() -> None:
    """Notes, commented or lone key: value lines and settings lines are read; a config is data."""
    output = "\n".join(
        [
            "region | 2024-05-04 | 45366 | $605.50",
            "note: the next release is set for March 26",
            "region | 2024-05-06 | 9120 | $12.00",
            "security_review: 7 February",
            "revenue | 2024-05-07 | 77 | $1.00",
            "assigned_to=session-hot-relay  # the service we call for tax rates",
            "    2  INFO  settings: cache_ttl resolved to 84,893 seconds",
            "> Don't cite anything published before 2006, the methods changed.",
            "server:",
            "  port: 8443",
            "  workers: 12",
            "  host: db.internal",
        ]
    )
    ledger = await ledger_of([TASK, *openai_call("c1", "query", {"q": "report"}, output)])
    facts = [
        line
        for heading in ("Constraints", "Identifiers", "Numbers", "Dates")
        for line in section(ledger, heading)
    ]
    assert facts == [
        "Don't cite anything published before 2006",
        "service we call for tax rates: session-hot-relay",
        "cache_ttl: 84,893 seconds",
        "next release: March 26",
        "security_review: 7 February",
    ]


async def test_failures_a_passing_call_reports_are_errors_and_retries_are_not() -> None:
    """What a traceback raised, an ERROR "failed" log line, an HTTP error's message: errors."""
    run = "\n".join(
        [
            "collected 12 items",
            "Traceback (most recent call last):",
            '  File "tests/test_queue.py", line 77, in test_drain',
            "    drain(ctx)",
            "ERR_REPLICA_LOST: while processing job_m0FiP8cTkJ after 859ms",
            "2025-07-02T23:28:27.709Z ERROR [pricing-api] request failed: drift_lost_lease",
            "2025-07-02T23:28:28.001Z ERROR [search-sync] retrying req_ZXYX: upstream timeout",
            "=== 11 passed, 1 failed in 4.02s ===",
        ]
    )
    http = 'HTTP/1.1 500\n{"error": "ETIMEDOUT 10.9.29.117", "detail": "upstream"}'
    messages = [
        TASK,
        *openai_call("c1", "run_tests", {"path": "tests/"}, run),
        *responses_call("c2", "fetch", {"url": "/rates"}, http),
    ]
    ledger = await ledger_of(messages)
    assert section(ledger, "Errors") == [
        "run_tests(tests/): ERR_REPLICA_LOST: while processing job_m0FiP8cTkJ after 859ms",
        "run_tests(tests/): request failed: drift_lost_lease",
        "fetch(/rates): HTTP/1.1 500: ETIMEDOUT 10.9.29.117",
    ]


# -- corrections and duplicates ----------------------------------------------------


@pytest.mark.parametrize(
    "correction",
    [
        "Actually, make the batch size 384.",
        "Correction: the batch size should be 384, not 512.",
        "Change the batch size from 512 to 384.",
        "Update: batch size is now 384.",
        "The batch size is 384.",
    ],
    ids=["actually", "correction-not", "from-to", "update-now", "same-key"],
)
async def test_a_correction_overwrites_and_notes_the_old_value(correction: str) -> None:
    """A new value for a subject replaces the old, shown beside it; the old is never alone."""
    first = [TASK, user("Set the batch size to 512."), assistant("Using batch size 512.")]
    for ledger in (
        await ledger_of([*first, user(correction)]),
        await two_batches(first, [user(correction)]),
    ):
        lines = [line.removeprefix("- ") for line in ledger.splitlines() if "512" in line]
        assert len(lines) == 1 and "384" in lines[0] and lines[0].endswith("(was 512)")
        assert section(ledger, "Numbers") == lines


@pytest.mark.parametrize(
    ("before", "after", "line", "old"),
    [
        (
            "We'll use MySQL 8.0 for the store.",
            "Actually, let's use PostgreSQL 16 instead of MySQL 8.0.",
            "let's use PostgreSQL 16 instead of MySQL 8.0",
            "MySQL 8.0",
        ),
        (
            "Use Redis for the cache.",
            "Scratch that, use Memcached for the cache.",
            "use Memcached for the cache (was Redis)",
            "Redis",
        ),
        (
            "The deadline is March 14.",
            "Update: the deadline moved to March 21.",
            "deadline: March 21 (was March 14)",
            "March 14",
        ),
        ("The port is 8080.", "The port is not 8080 but 8443.", "port: 8443 (was 8080)", "8080"),
        (
            "I prefer npm for installs.",
            "I'd rather use pnpm instead of npm.",
            "I'd rather use pnpm instead of npm",
            "npm",
        ),
    ],
    ids=["instead-of", "scratch-that", "moved-to", "not-but", "preference"],
)
async def test_explicit_corrections(before: str, after: str, line: str, old: str) -> None:
    """Instead of, scratch that, moved to, not X but Y: each overwrites the line it corrects."""
    ledger = await ledger_of([TASK, user(before), assistant("Noted."), user(after)])
    assert [stated for stated in ledger.splitlines() if f" {old}" in stated] == [f"- {line}"]


async def test_a_correction_drops_other_lines_that_state_the_old_value() -> None:
    """A line that restated the replaced value goes; the task line says what replaced it."""
    messages = [
        user("Migrate the store to PostgreSQL 16 by Friday."),
        user("We decided to use PostgreSQL 16 for the store."),
        assistant("Noted, PostgreSQL 16 it is. The staging copy runs PostgreSQL 16 too."),
        user("Actually, we'll use CockroachDB 23.1 instead of PostgreSQL 16."),
    ]
    ledger = await ledger_of(messages)
    stale = [line for line in ledger.splitlines() if "PostgreSQL 16" in line]
    assert stale == [
        "Task: Migrate the store to PostgreSQL 16 by Friday. (now CockroachDB 23.1)",
        "- we'll use CockroachDB 23.1 instead of PostgreSQL 16",
    ]


@pytest.mark.parametrize(
    ("before", "after", "line"),
    [
        (
            "Located the flaky test at tests/upload/test_router_audit.py.",
            "I got the flaky test wrong earlier. It's tests/auth/test_retry_webhook.py.",
            "flaky test: tests/auth/test_retry_webhook.py (was tests/upload/test_router_audit.py)",
        ),
        (
            "The report number is TR-132-zTFL.",
            "Scratch what I said about the report number - it's TR-963-D5Ns.",
            "report number: TR-963-D5Ns (was TR-132-zTFL)",
        ),
        (
            "The warehouse contact: Mateo Okafor.",
            "My earlier note on the warehouse contact was wrong; the right one is Viktor Ferreira",
            "warehouse contact: Viktor Ferreira (was Mateo Okafor)",
        ),
        (
            "Never use figures from Ambergate Systems, they have a conflict of interest.",
            "Per the latest message, the excluded publisher is now Drummond Energy "
            "(it was Ambergate Systems).",
            "excluded publisher: Drummond Energy (was Ambergate Systems)",
        ),
        (
            "The retry backoff multiplier = 3.25 at the moment.",
            "The retry backoff multiplier is no longer 3.25; use 3.52 from now on.",
            "retry backoff multiplier: 3.52 (was 3.25)",
        ),
    ],
    ids=["got-it-wrong", "scratch-what-i-said", "earlier-note", "it-was", "no-longer"],
)
async def test_corrections_that_name_the_subject_or_the_old_value_elsewhere(
    before: str, after: str, line: str
) -> None:
    """A correction whose subject or old value is in another sentence still overwrites the fact."""
    ledger = await ledger_of([TASK, user(before), assistant("Noted."), user(after)])
    old = line.rpartition("(was ")[2].rstrip(")")
    assert [stated for stated in ledger.splitlines() if old in stated] == [f"- {line}"]


@pytest.mark.parametrize(
    ("before", "after", "new", "old"),
    [
        (
            "Add Dana Whitfield to the thread; she's who approves the travel budget.",
            "Correcting myself: who approves the travel budget is Omar Lindqvist.",
            "Omar Lindqvist",
            "Dana Whitfield",
        ),
        (
            "Call made on where the incident notes live: Confluence space OPS.",
            "That changes things: for where the incident notes live I'm moving to Notion, "
            "since the responders already read it.",
            "Notion",
            "Confluence",
        ),
        (
            "We're going with weekly releases for the mobile app cadence - QA signed off.",
            "No wait, let's do fortnightly releases for the mobile app cadence after all.",
            "fortnightly releases",
            "weekly releases",
        ),
        (
            "Decided to use Stripe Radar for the fraud screening vendor, it is already wired in.",
            "New direction on the fraud screening vendor: Sift. Reason: better chargeback data.",
            "Sift",
            "Stripe Radar",
        ),
        (
            "On second thought I had it right before: the staging bucket is s3://acme-stage-eu.",
            "Re-checking the runbook, the staging bucket should read s3://acme-stage-us rather "
            "than s3://acme-stage-eu.",
            "s3://acme-stage-us",
            "s3://acme-stage-eu",
        ),
    ],
    ids=["subject-outside-the-clause", "changes-things", "no-wait", "new-direction", "should-read"],
)
async def test_corrections_worded_as_people_word_them_leave_no_old_value_alone(
    before: str, after: str, new: str, old: str
) -> None:
    """Every line that still names the old value names the new one beside it (as "was")."""
    ledger = await ledger_of(
        [TASK, user(before), assistant("Noted."), user("What next?"), assistant(after)]
    )
    lines = ledger.splitlines()[1:]  # the task line states nothing here
    assert any(new in line for line in lines), ledger
    alone = [line for line in lines if old in line and new not in line]
    assert alone == [], ledger


@pytest.mark.parametrize(
    ("after", "new", "old"),
    [
        (
            "Deploy log: INFO updated the Helm values file for prod to "
            "deploy/charts/web/values-prod-b.yaml (was deploy/charts/web/values-prod-a.yaml)",
            "values-prod-b.yaml",
            "values-prod-a.yaml",
        ),
        (
            "Item | Owner | Path | Before\n"
            "Signing key | Ana | keys/2025/sign-new.pem | was keys/2024/sign-old.pem\n",
            "keys/2025/sign-new.pem",
            "keys/2024/sign-old.pem",
        ),
    ],
    ids=["log-was", "table-was-cell"],
)
async def test_a_tool_line_that_names_the_value_it_replaces_overwrites_it(
    after: str, new: str, old: str
) -> None:
    """A log line's "(was X)", or a "was X" cell: the entry holding X takes the new value."""
    before = (
        "Confirmed the Helm values file for prod is at deploy/charts/web/values-prod-a.yaml."
        if "Helm" in after
        else "For the record, the signing key is at keys/2024/sign-old.pem."
    )
    call = openai_call("c1", "read_log", {"name": "latest"}, after)
    ledger = await ledger_of([TASK, user(before), assistant("Checking."), *call])
    lines = ledger.splitlines()[1:]
    assert any(new in line for line in lines), ledger
    assert [line for line in lines if old in line and new not in line] == [], ledger


@pytest.mark.parametrize(
    ("before", "after", "new", "old"),
    [
        (
            "The sample for the retention study is 2,400 rows.",
            "Make that 3,100 rows.",
            "3,100",
            "2,400",
        ),
        (
            "We're booked on UA 512 out of Denver.",
            "We rebooked onto DL 1893 this morning.",
            "DL 1893",
            "UA 512",
        ),
        (
            "The incident lead is @jlee for now.",
            "Handing the lead to @mpatel, effective now.",
            "@mpatel",
            "@jlee",
        ),
        (
            "The crash comes from billing.py line 212.",
            "I misread the traceback, it's invoice.py line 248.",
            "invoice.py",
            "billing.py",
        ),
        (
            "The grant report is due June 3, 2025.",
            "Correction: the grant report is due June 10, 2025.",
            "June 10",
            "June 3",
        ),
        (
            "The notice period in the lease is 30 days.",
            "I had the notice period wrong. It's 60 days.",
            "60 days",
            "30 days",
        ),
        (
            "Our standup is Tuesday at 9:30.",
            "We moved the standup to Thursday at 10:15.",
            "Thursday",
            "Tuesday",
        ),
    ],
    ids=[
        "make-that",
        "rebooked",
        "handing",
        "misread",
        "correction-keeps-it",
        "had-it-wrong",
        "moved",
    ],
)
async def test_a_correction_finds_the_value_of_the_same_form(
    before: str, after: str, new: str, old: str
) -> None:
    """A correction naming no subject replaces the latest value of its form (unit, code, file)."""
    filler = [user("What else is open?"), assistant("Two tickets and the review."), user("Ok.")]
    ledger = await ledger_of([TASK, user(before), assistant("Noted."), *filler, user(after)])
    lines = ledger.splitlines()[1:]
    assert any(new in line for line in lines), ledger
    assert [line for line in lines if old in line and new not in line] == [], ledger


@pytest.mark.parametrize(
    ("before", "after", "new", "old"),
    [
        ("The retry limit for the uploader is 5.", "Hmm, make it 8.", "8 (was 5)", "5"),
        ("Reserve 20 chairs for the training.", "Actually, 24.", "24 chairs (was 20)", "20"),
        ("Cap the request body at 10 MB.", "Let's go with 15 MB instead.", "15 MB", "10 MB"),
        ("Warm up for 500 steps.", "Let's do 800 steps instead.", "800 steps", "500 steps"),
        (
            "We'll bundle the frontend with Webpack.",
            "Webpack is out, Rollup is in.",
            "Rollup",
            "Webpack",
        ),
        (
            "The favicon is static/icon-old.ico.",
            "I'll replace static/icon-old.ico with static/brand/icon-v2.svg in every page.",
            "static/brand/icon-v2.svg",
            "static/icon-old.ico",
        ),
        (
            "Median session length was 7.5 minutes.",
            "I recalculated it: median session length was 6.1 minutes.",
            "6.1 minutes",
            "7.5 minutes",
        ),
        (
            "The release ticket is OPS-4410.",
            "Wrong ticket, sorry, it's OPS-4401.",
            "OPS-4401",
            "OPS-4410",
        ),
    ],
    ids=[
        "bare-make-it",
        "bare-actually",
        "instead-same-unit",
        "instead-sentence-initial-verb",
        "is-out",
        "replace-with",
        "recalculated",
        "wrong-x-sorry",
    ],
)
async def test_corrections_in_few_words(before: str, after: str, new: str, old: str) -> None:
    """A correction with no subject, or worded as a swap, replaces the value it corrects.

    A bare number ("Actually, 24.") corrects the number stated last, in that entry's words.
    """
    ledger = await ledger_of([TASK, user(before), assistant("Noted."), user("Next?"), user(after)])
    lines = ledger.splitlines()[1:]
    assert any(new in line for line in lines), ledger
    assert [line for line in lines if f"{old}" in line and new not in line] == [], ledger


@pytest.mark.parametrize(
    ("said", "kept"),
    [
        (["We'll deploy on Friday.", "Switch the deploy script to bash."], ["Friday", "bash"]),
        (["Invoice font is Arial.", "Switch the email signature font to Georgia."], ["Arial"]),
        (["The batch size is 64.", "We have 3 GPUs.", "Actually, 4."], ["64", "4 GPUs"]),
        (["Deploy region is us-east-1.", "Backups go to us-west-2 instead."], ["us-east-1"]),
    ],
    ids=["shared-verb", "other-qualifier", "bare-takes-the-latest", "instead-elsewhere"],
)
async def test_look_alike_statements_are_not_taken_for_corrections(
    said: list[str], kept: list[str]
) -> None:
    """A word in common, or a cue, is not enough: each value stays, not as "(was X)"."""
    ledger = await ledger_of([TASK, *(m for s in said for m in (user(s), assistant("Noted.")))])
    for value in kept:
        lines = [line for line in ledger.splitlines()[1:] if value in line]
        assert lines and any("(was" not in line.split(value)[0] for line in lines), ledger


async def test_a_bare_number_corrects_nothing_that_has_a_subject_of_its_own() -> None:
    """A correction naming its subject is not taken for a bare number: other numbers stay."""
    ledger = await ledger_of(
        [
            TASK,
            user("The expected attendance at the launch is 4,250. We expect 15811 people overall."),
            assistant("Noted."),
            user("Correcting myself: the expected attendance at the launch is 7,204."),
        ]
    )
    assert "15811" in ledger and "7,204 (was 4,250)" in ledger, ledger


@pytest.mark.parametrize(
    ("first", "second", "a", "b"),
    [
        ("The frontend runs on port 3000.", "The backend runs on port 8000.", "3000", "8000"),
        ("Q1 revenue was $3.1M.", "Q2 revenue was $3.9M.", "$3.1M", "$3.9M"),
        ("The staging DB is pg-stage-1.", "The prod DB is pg-prod-3.", "pg-stage-1", "pg-prod-3"),
    ],
    ids=["ports", "quarters", "databases"],
)
async def test_facts_keyed_alike_but_qualified_apart_both_stay(
    first: str, second: str, a: str, b: str
) -> None:
    """Two facts with one key and different qualifiers: neither is said to replace the other."""
    ledger = await ledger_of([TASK, user(first), assistant("Noted."), user(second)])
    assert a in ledger and b in ledger, ledger
    assert f"(was {a}" not in ledger, ledger


async def test_a_line_naming_the_old_value_as_its_subject_survives_the_correction() -> None:
    """Replacing "Figma" as the SSO vendor keeps "Figma seats left: 14"."""
    ledger = await ledger_of(
        [
            TASK,
            user("For the record, the SSO app with the lockouts is Figma."),
            user("Figma seats left: 14 seats, keep that handy."),
            assistant(
                "Re-checking, the SSO app with the lockouts should read Workday rather than Figma."
            ),
        ]
    )
    assert "14 seats" in ledger, ledger
    assert "Workday" in ledger, ledger


@pytest.mark.parametrize(
    ("output", "new", "old"),
    [
        (
            '{"repo": "payments", "owner": "Ana Ruiz", "previous_owner": "Tom Bell"}',
            "Ana Ruiz",
            "Tom Bell",
        ),
        (
            "| service | owner | previous owner |\n|---|---|---|\n"
            "| payments | Ana Ruiz | Tom Bell |",
            "Ana Ruiz",
            "Tom Bell",
        ),
        (
            "key,current,previous\nowner,Ana Ruiz,Tom Bell\nregion,eu-west-1,us-east-1",
            "Ana Ruiz",
            "Tom Bell",
        ),
    ],
    ids=["json-previous-field", "table-previous-column", "csv-current-previous"],
)
async def test_a_structured_output_naming_the_previous_value_replaces_it(
    output: str, new: str, old: str
) -> None:
    """A "previous" field or column beside the current one: the entry holding it takes the new."""
    call = openai_call("c1", "lookup_owner", {"service": "payments"}, output)
    ledger = await ledger_of(
        [TASK, user("For the record, the payments service owner is Tom Bell."), *call]
    )
    lines = ledger.splitlines()[1:]
    assert any(new in line for line in lines), ledger
    assert [line for line in lines if old in line and new not in line] == [], ledger


@pytest.mark.parametrize(
    ("before", "after", "new", "old"),
    [
        (
            "Data freeze is scheduled for 2025-09-30.",
            "Data freeze slipped to 2025-10-21.",
            "2025-10-21",
            "2025-09-30",
        ),
        (
            "The lease term is 36 months.",
            "Legal negotiated the lease term down to 24 months.",
            "24 months",
            "36 months",
        ),
    ],
    ids=["slipped-to", "down-to"],
)
async def test_a_value_that_moved_replaces_the_one_it_moved_from(
    before: str, after: str, new: str, old: str
) -> None:
    """A value said to have slipped, been pushed or negotiated down replaces the old one."""
    ledger = await ledger_of([TASK, user(before), assistant("Noted."), user(after)])
    lines = ledger.splitlines()[1:]
    assert any(new in line for line in lines), ledger
    assert [line for line in lines if old in line and new not in line] == [], ledger


@pytest.mark.parametrize(
    "output",
    [
        '{"field": "release date", "from": "June 3", "to": "June 10", "by": "pm-bot"}',
        "2025-06-01T10:00:00Z INFO scheduler: release date changed (June 3 -> June 10)",
    ],
    ids=["json-from-to", "log-arrow"],
)
async def test_a_change_a_tool_reports_from_one_value_to_another_replaces_it(output: str) -> None:
    """A JSON change record or a log's "X -> Y" replaces the entry holding X."""
    call = openai_call("c1", "audit_log", {"item": "release"}, output)
    ledger = await ledger_of([TASK, user("The release date is June 3."), *call])
    lines = [line for line in ledger.splitlines()[1:] if not line.startswith("- audit_log:")]
    assert any("June 10" in line for line in lines), ledger
    assert [line for line in lines if "June 3" in line and "June 10" not in line] == [], ledger


async def test_the_value_a_correction_replaces_is_not_carried_to_an_unrelated_fact() -> None:
    """A value named as replaced ("rather than X") does not carry past the next sentence."""
    ledger = await ledger_of(
        [
            TASK,
            user("Heads up, the CDN vendor with the degraded POP is Vantor AG this week."),
            assistant(
                "Re-checking, the CDN vendor with the degraded POP should read Ferrobyte GmbH "
                "rather than Vantor AG. That output also has the review we needed. The cache "
                "pool is saturated - 21 of 38 connections in use."
            ),
        ]
    )
    vendor = [line for line in ledger.splitlines() if "Ferrobyte GmbH" in line]
    assert len(vendor) == 1 and "38" not in vendor[0], ledger


async def test_statements_alike_but_for_a_value_share_one_line() -> None:
    """Three "don't touch X" lines become one that lists the other values, counting references."""
    files = ["src/a.py", "src/b.py", "src/c.py", "src/d.py", "src/e.py"]
    messages = [
        TASK,
        *(user(f"Don't touch {f} for now, someone else is editing it.") for f in files),
    ]
    summary = await LedgerSummarizer(COUNTER).summarize_levels(None, messages, max_tokens=4_000)
    assert section(summary.ledger, "Constraints") == [
        "Don't touch src/a.py for now, someone else is editing it"
        " (also src/c.py, src/d.py, src/e.py and 1 more)"
    ]
    assert [e["refs"] for e in state_entries(summary) if e["kind"] == "constraint"] == [4]


async def test_near_duplicates_merge_and_count_references() -> None:
    """Restatements add no line but a reference; alike statements share a line and list values."""
    messages = [
        TASK,
        user("Never touch the billing module."),
        user("Remember: never touch the billing module!"),
        user("Next, look at module m7 and report."),
        user("Next, look at module m8 and report."),
        user("The reviewer is Dana Li."),
        assistant("Dana Li will review it then."),
    ]
    summary = await LedgerSummarizer(COUNTER).summarize_levels(None, messages, max_tokens=4_000)
    assert section(summary.ledger, "Constraints") == ["Never touch the billing module"]
    assert section(summary.ledger, "Requests") == ["Next, look at module m7 and report. (also m8)"]
    refs = {e["value"]: e["refs"] for e in state_entries(summary)}
    assert refs["Never touch the billing module"] == 1
    assert refs["Next, look at module m7 and report."] == 1
    assert refs["Dana Li"] == 1


# -- budgets and eviction ----------------------------------------------------------


async def test_eviction_keeps_referenced_facts_over_unreferenced_newer_and_older_ones() -> None:
    """With room for one number, the one referred to most stays, older or newer than the rest."""
    warmup, batch, dropout = (
        user(f"The {k} is {v}.")
        for k, v in [("warmup", "100 steps"), ("batch size", "512"), ("dropout", "0.1")]
    )
    mentions = [assistant("The batch size looks right."), user("Keep the batch size as it is.")]
    expected = "\n".join([HEADER, f"Task: {TASK['content']}", "Numbers:", "- batch size: 512"])
    budget = COUNTER.count(expected)
    assert (
        await ledger_of([TASK, warmup, batch, dropout, *mentions], ledger_tokens=budget) == expected
    )
    flood = [user(f"Metric m{i} is {100 + i}.") for i in range(30)]
    assert await ledger_of([TASK, batch, *flood, *mentions], ledger_tokens=budget) == expected
    full = await ledger_of([TASK, batch, *flood, *mentions])
    assert len(section(full, "Numbers")) == 31


async def test_eviction_keeps_constraints_and_decisions_over_tool_outcomes() -> None:
    """With room for little, tool lines go before constraints, decisions and errors."""
    messages = [
        TASK,
        *[m for i in range(8) for m in openai_call(f"c{i}", f"tool_{i}", {"i": i}, "ok")],
        user("Never touch the billing module."),
        user("We decided to use pnpm because of the lockfile."),
        *anthropic_call(
            "t1",
            "run_python",
            {"code": "import yaml"},
            "ModuleNotFoundError: No module named 'yaml'",
        ),
    ]
    expected = "\n".join(
        [
            HEADER,
            f"Task: {TASK['content']}",
            "Constraints:",
            "- Never touch the billing module",
            "Decisions:",
            "- We decided to use pnpm because of the lockfile",
            "Errors:",
            "- run_python(import yaml): ModuleNotFoundError: No module named 'yaml'",
        ]
    )
    assert await ledger_of(messages, ledger_tokens=COUNTER.count(expected)) == expected
    assert len(section(await ledger_of(messages), "Tools")) == 9


@pytest.mark.parametrize(
    ("max_tokens", "ledger_tokens"),
    [(120, None), (600, None), (2_000, None), (2_000, 250), (900, 900)],
)
async def test_ledger_and_whole_summary_fit_their_budgets(
    max_tokens: int, ledger_tokens: int | None
) -> None:
    """The ledger fits ledger_tokens (min(600, max_tokens // 3) by default), both max_tokens."""
    messages, _ = synthetic_conversation(1)
    summary = await LedgerSummarizer(COUNTER).summarize_levels(
        None, messages, max_tokens=max_tokens, ledger_tokens=ledger_tokens
    )
    budget = min(600, max_tokens // 3) if ledger_tokens is None else ledger_tokens
    assert summary.ledger and told(summary).startswith(NARRATIVE + "\n- ")
    assert COUNTER.count(summary.ledger) <= budget
    whole = await ledger_of(messages, ledger_tokens=100_000, max_tokens=100_000)
    if COUNTER.count(whole) > budget:  # there was more to show: the budget was used
        assert COUNTER.count(summary.ledger) >= budget - 40
    assert COUNTER.count(f"{summary.ledger}\n\n{summary.narrative}") <= max_tokens
    assert summary.ledger.splitlines()[1].startswith("Task: ")


async def test_level_two_adds_the_facts_the_ledger_had_no_room_for() -> None:
    """Level 2 holds, under its heading, the best facts the ledger left out, then the story."""
    messages, _ = synthetic_conversation(1)
    summarizer = LedgerSummarizer(COUNTER)
    small = await summarizer.summarize_levels(None, messages, max_tokens=4_000, ledger_tokens=150)
    large = await summarizer.summarize_levels(None, messages, max_tokens=4_000, ledger_tokens=3_000)
    assert small.narrative.startswith(MORE + "\n")
    more = small.narrative[: small.narrative.index(NARRATIVE)]
    shown = [ln for ln in small.ledger.splitlines() if ln.startswith("- ")]
    extra = [ln for ln in more.splitlines() if ln.startswith("- ")]
    assert extra and not set(extra) & set(shown)  # no fact twice
    assert set(extra) <= {ln for ln in large.ledger.splitlines() if ln.startswith("- ")}
    assert COUNTER.count(f"{small.ledger}\n\n{small.narrative}") <= 4_000


async def test_the_narrative_shrinks_its_oldest_bullets_first() -> None:
    """Over budget, old bullets lose their wording first; the newer ones stay whole."""
    # A ledger with room for every fact: level 2 adds no further facts, only the story.
    messages, _ = synthetic_conversation(2)
    summarizer = LedgerSummarizer(COUNTER)
    whole = await summarizer.summarize_levels(
        None, messages, max_tokens=200_000, ledger_tokens=100_000
    )
    tight_budget = COUNTER.count(whole.ledger) + COUNTER.count(whole.narrative) * 7 // 8
    tight = await summarizer.summarize_levels(
        None, messages, max_tokens=tight_budget, ledger_tokens=100_000
    )
    lines, all_lines = told(tight).splitlines()[1:], told(whole).splitlines()[1:]
    kept = [line in all_lines for line in lines]
    assert not kept[0] and kept[-1] and kept.index(True) > 0
    assert all(kept[kept.index(True) :])  # once a bullet is whole, every newer one is
    assert lines[0].startswith(("- noted: ", "- asked: "))


# -- folding, the legacy protocol, formats -------------------------------------------


async def test_folding_in_batches_gives_the_ledger_of_one_pass() -> None:
    """Batches of 40, 17 or 1 fold to the ledger (and entries) of the whole conversation at once."""
    messages, _ = synthetic_conversation(0)
    budget = {"max_tokens": 2_000, "ledger_tokens": 600}
    once = await LedgerSummarizer(COUNTER).summarize_levels(None, messages, **budget)
    for batch in (40, 17, 1):
        folded = await fold_in_batches(messages, batch, **budget)
        assert folded.ledger == once.ledger
        assert json.loads(str(folded.state))["entries"] == json.loads(str(once.state))["entries"]


async def test_legacy_summarize_round_trips_through_its_own_parser() -> None:
    """Folding nothing into a summary's text gives it back; a stateless Summary keeps its ledger."""
    messages, _ = synthetic_conversation(0)
    summarizer = LedgerSummarizer(COUNTER)
    text = await summarizer.summarize(None, messages, max_tokens=2_000)
    assert text.startswith(HEADER) and f"\n\n{NARRATIVE}\n" in text
    assert await summarizer.summarize(text, [], max_tokens=2_000) == text
    ledger, _, narrative = text.partition("\n\n")
    again = await summarizer.summarize_levels(
        Summary(ledger, narrative, None), [], max_tokens=2_000
    )
    assert again.ledger == ledger
    more = await summarizer.summarize(
        text, [user("Actually, make the batch size 256.")], max_tokens=2_000
    )
    assert "- batch size: 256 (was 384, 512)" in more.partition("\n\n")[0].splitlines()


async def test_a_foreign_summary_is_read_as_well_as_it_can_be() -> None:
    """Another summarizer's lines become facts where they state some, narrative lines where not."""
    foreign = (
        "Summary of the earlier conversation:\n"
        "- Decisions: user: We decided to use PostgreSQL 16 for the store.\n"
        "- Errors: run_python(import yaml): Error: no yaml\n"
        "- Facts: The budget is 4,250 EUR.\n"
        "- Facts: the team met and talked it over"
    )
    summary = await LedgerSummarizer(COUNTER).summarize_levels(
        Summary(foreign, "", None), [user("The budget is 5,000 EUR.")], max_tokens=2_000
    )
    assert section(summary.ledger, "Decisions") == ["We decided to use PostgreSQL 16 for the store"]
    assert section(summary.ledger, "Errors") == ["run_python(import yaml): Error: no yaml"]
    assert section(summary.ledger, "Constraints") == ["budget: 5,000 EUR (was 4,250 EUR)"]
    assert summary.narrative.splitlines()[1] == "- Facts: the team met and talked it over"


async def test_anthropic_blocks_are_read_and_thinking_is_skipped() -> None:
    """Text, tool_use and tool_result blocks are read; thinking is never summarized."""
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "The batch size is 512."}]},
        *anthropic_call(
            "t1", "run_tests", {"path": "tests/"}, "collected 9 items\n9 passed in 0.4s"
        ),
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Tests pass; the owner is Priya Raman."}],
        },
    ]
    summary = await LedgerSummarizer(COUNTER).summarize_levels(None, messages, max_tokens=2_000)
    assert section(summary.ledger, "Numbers") == ["batch size: 512"]
    assert section(summary.ledger, "Names") == ["owner: Priya Raman"]
    assert section(summary.ledger, "Tools") == ["run_tests: 1 call; tests/ → 9 passed in 0.4s"]
    assert "999999" not in summary.ledger + summary.narrative + str(summary.state)


async def test_responses_api_items_are_read_and_reasoning_is_skipped() -> None:
    """message, function_call and function_call_output items are read; reasoning is skipped."""
    messages = [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Fix order ORD-4821."}],
        },
        *responses_call("fc1", "lookup_order", {"id": "ORD-4821"}, '{"error": "order not found"}'),
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "The order id is ORD-4822."}],
        },
    ]
    summary = await LedgerSummarizer(COUNTER).summarize_levels(None, messages, max_tokens=2_000)
    assert section(summary.ledger, "Errors") == ["lookup_order(ORD-4821): order not found"]
    assert section(summary.ledger, "Identifiers") == ["order ORD-4821", "order id: ORD-4822"]
    assert "ORD-99999" not in summary.ledger + summary.narrative + str(summary.state)


async def test_the_summary_is_deterministic() -> None:
    """The same input gives the same ledger, narrative and state, from one instance or two."""
    messages, _ = synthetic_conversation(2)
    first = await LedgerSummarizer().summarize_levels(None, messages, max_tokens=2_000)
    second = LedgerSummarizer()
    assert await second.summarize_levels(None, messages, max_tokens=2_000) == first
    assert await second.summarize_levels(None, messages, max_tokens=2_000) == first


# -- a synthetic agent conversation ------------------------------------------------

FILES = [
    "src/worker.py",
    "src/api/routes.py",
    "src/queue/consumer.py",
    "lib/retry.py",
    "src/models.py",
]
COMPONENTS = ["scheduler", "retry helper", "consumer loop", "routes table", "session cache"]
CODE = '''def handle(event):
    """Handle one event; log an error and re-raise when it fails."""
    try:
        return process(event)
    except TimeoutError as error:
        log.error("failed to handle %s: %s", event.id, error)
        raise HandlerError(str(error)) from error
'''

# Per conversation: the values planted, so each conversation has its own.
VALUES = [
    {
        "project": "ledger-sync",
        "db": "PostgreSQL 16",
        "db2": "CockroachDB 23.1",
        "module": "legacy-billing",
        "latency_cap": "300 ms",
        "budget": "4,250 EUR",
        "deadline": "March 14",
        "deadline2": "March 21",
        "pref": "pnpm",
        "style": "UTC timestamps",
        "ticket": "INC-4411",
        "order": "ORD-48213",
        "sha": "9f3c2ab",
        "email": "dana.li@example.com",
        "url": "https://runbooks.example.com/ledger-sync",
        "version": "3.2.1",
        "batch": "512",
        "batch2": "384",
        "p95": "230 ms",
        "replicas": "6 replicas",
        "config": "/etc/ledger/app.yaml",
        "source": "src/parser/lexer.py",
        "person": "Priya Raman",
        "service": "payments-api",
        "window": "2024-06-03",
        "flag": "export_v2",
        "error": "ModuleNotFoundError: No module named 'yaml'",
        "error2": "psycopg.OperationalError: connection refused",
        "outcome": "42 passed",
        "feature": "webhook retries",
        "release": "May 12",
        "retries": "17 retries",
    },
    {
        "project": "invoice-export",
        "db": "MySQL 8.0",
        "db2": "PostgreSQL 15",
        "module": "payroll-core",
        "latency_cap": "250 ms",
        "budget": "$12,000",
        "deadline": "April 2",
        "deadline2": "April 9",
        "pref": "poetry",
        "style": "structured JSON logs",
        "ticket": "OPS-2210",
        "order": "ORD-77120",
        "sha": "e41b07d",
        "email": "marco.rossi@example.org",
        "url": "https://wiki.example.org/invoice-export",
        "version": "1.14.2",
        "batch": "1,024",
        "batch2": "768",
        "p95": "410 ms",
        "replicas": "4 replicas",
        "config": "/srv/invoice/config.toml",
        "source": "app/export/writer.py",
        "person": "Marco Rossi",
        "service": "ledger-api",
        "window": "May 20",
        "flag": "new_writer",
        "error": "KeyError: 'customer_id'",
        "error2": "fatal: could not read Username for 'https://github.com'",
        "outcome": "118 passed",
        "feature": "CSV streaming",
        "release": "June 2",
        "retries": "23 retries",
    },
    {
        "project": "search-indexer",
        "db": "Elasticsearch 8.13",
        "db2": "OpenSearch 2.11",
        "module": "auth-gateway",
        "latency_cap": "120 ms",
        "budget": "900 GPU hours",
        "deadline": "June 30",
        "deadline2": "July 7",
        "pref": "ruff",
        "style": "snake_case names",
        "ticket": "SRCH-981",
        "order": "ORD-30077",
        "sha": "77ad2e0",
        "email": "li.wei@example.net",
        "url": "https://status.example.net/incidents/77",
        "version": "2.0.4",
        "batch": "256",
        "batch2": "128",
        "p95": "95 ms",
        "replicas": "3 shards",
        "config": "~/indexer/settings.yaml",
        "source": "indexer/tokenize.py",
        "person": "Li Wei",
        "service": "catalog-service",
        "window": "2024-09-12",
        "flag": "bulk_v3",
        "error": "TimeoutError: bulk request timed out after 30s",
        "error2": "error: failed to push some refs",
        "outcome": "7 passed",
        "feature": "synonym expansion",
        "release": "July 21",
        "retries": "9 retries",
    },
]

# What each planted fact must leave: its value (batch2 and deadline2 are corrected ones).
CHECKED = [
    *("project", "db2", "module", "latency_cap", "budget", "deadline2", "pref", "style", "ticket"),
    *("order", "sha", "email", "url", "version", "batch2", "p95", "replicas", "config", "source"),
    *("person", "service", "window", "flag", "error", "error2", "outcome", "feature"),
    *("release", "retries"),  # stated only in tool output
]

# Each planted fact's phrasings; a conversation picks one by its index.
PHRASINGS = [
    (
        "Hi! I need you to migrate the {project} job to the new queue API before the release.",
        "Hello. Please move the {project} job off the legacy cron setup and onto the queue.",
        "Can you port the {project} job to the async queue? It keeps timing out.",
    ),
    (
        "We decided to use {db} for the store because it handles our JSON columns well.",
        "Let's go with {db} for the store since ops already runs it.",
        "We'll use {db} for the store, so that backups stay simple.",
    ),
    (
        "Never touch the {module} module; finance owns it.",
        "Do not modify the {module} module under any circumstances.",
        "The {module} module must stay untouched, it belongs to another team.",
    ),
    (
        "Responses must stay under {latency_cap} at p95.",
        "Keep the API latency at most {latency_cap}, that's the SLO.",
        "Latency can be no more than {latency_cap} for the search endpoint.",
    ),
    (
        "We have a budget of {budget} for the hosted database this quarter.",
        "The budget is {budget} for this project.",
        "Budget: {budget}, and that is firm.",
    ),
    (
        "The deadline is {deadline}.",
        "We need this shipped by {deadline}.",
        "It has to land by {deadline} at the latest.",
    ),
    (
        "I prefer {pref} over the default tooling.",
        "Please use {pref} for dependency management.",
        "I'd rather we use {pref} than anything else for this.",
    ),
    (
        "Always use {style} in new code.",
        "Please keep {style} everywhere.",
        "I prefer {style}, consistently.",
    ),
    (
        "This work is tracked in {ticket}.",
        "The incident for the outage is {ticket}.",
        "File everything under {ticket} please.",
    ),
    (
        "The customer's order is {order}, use it for the repro.",
        "Reproduce it with order {order}.",
        "Order id: {order}",
    ),
    (
        "The regression started at commit {sha}.",
        "Bisecting points at {sha} as the first bad commit.",
        "Revert {sha} if nothing else works.",
    ),
    (
        "Send the report to {email} when done.",
        "The owner's email is {email}.",
        "CC {email} on the summary.",
    ),
    (
        "The runbook is at {url} if you need it.",
        "See {url} for the incident timeline.",
        "Docs: {url}",
    ),
    (
        "Pin ctx-client to version {version} as the changelog asks.",
        "We're on ctx-client {version} in production.",
        "Upgrade the SDK to v{version} first.",
    ),
    (
        "Set the batch size to {batch}.",
        "Use a batch size of {batch} for the backfill.",
        "batch size: {batch}",
    ),
    (
        "Our p95 latency is {p95} right now.",
        "p95 latency: {p95}",
        "The p95 latency hit {p95} yesterday.",
    ),
    (
        "We run {replicas} in production.",
        "Production has {replicas} behind the balancer.",
        "The cluster runs {replicas} today.",
    ),
    (
        "The config lives at {config}.",
        "Config file: {config}",
        "The settings are read from {config} on startup.",
    ),
    (
        "The tokenizer lives in {source}.",
        "Most of the logic is in {source}, start there.",
        "Look at {source} for the entry point.",
    ),
    (
        "{person} from platform will review the PR.",
        "The reviewer is {person}.",
        "Loop in {person} before merging anything.",
    ),
    (
        "The {service} is the one timing out.",
        "Calls to {service} fail about once an hour.",
        "Don't forget that {service} depends on this.",
    ),
    (
        "The migration window opens on {window}.",
        "Maintenance is scheduled for {window}.",
        "We cut over on {window}.",
    ),
    (
        "We agreed to ship it behind the {flag} feature flag.",
        "Decision: gate it behind the {flag} flag.",
        "We'll keep it behind {flag} until QA signs off.",
    ),
    (
        "Next, please add {feature} to the worker.",
        "After that, implement {feature}.",
        "Can you also look into {feature}?",
    ),
]
CORRECTIONS = [
    (
        "Actually, make the batch size {batch2}.",
        "Correction: batch size should be {batch2}, not {batch}.",
        "Change the batch size from {batch} to {batch2}.",
    ),
    (
        "Update: the deadline moved to {deadline2}.",
        "Actually the deadline is {deadline2} now.",
        "The deadline changed to {deadline2}.",
    ),
    (
        "Actually, let's use {db2} instead of {db}.",
        "Scratch that: we decided to use {db2} for the store.",
        "Change of plans, go with {db2} rather than {db}.",
    ),
]
REMINDERS = (  # the agent restating some facts, as agents do
    "Using batch size {batch2} and {db2} as agreed; {person} is reviewing.",
    "Reminder to self: {module} is off limits, deadline {deadline2}.",
    "As discussed, {person} reviews and the budget stays {budget}.",
)
TRACEBACK = 'Traceback (most recent call last):\n  File "<string>", line 1, in <module>\n'


def plants(v: dict[str, str], variant: int) -> list[list[dict[str, Any]]]:
    """The planted turns in conversation order; ``variant`` picks each fact's phrasing."""
    said = [[user(p[variant % len(p)].format(**v).replace("vv", "v"))] for p in PHRASINGS]
    tools = [
        anthropic_call(
            "toolu_e1", "run_python", {"code": "import yaml"}, TRACEBACK + v["error"], is_error=True
        ),
        openai_call(
            "call_e2", "bash", {"cmd": "make migrate"}, f"migrating...\n{v['error2']}\nexit code 2"
        ),
        responses_call(
            "fc_tests",
            "run_tests",
            {"path": "tests/"},
            f"collected 50 items\n{v['outcome']} in 4.02s",
        ),
    ]
    rng = random.Random(variant)
    logs = log_lines(rng, 6).split("\n")
    logs.insert(3, f"note: the next release is set for {v['release']}")
    rows = [f"| {rng.randint(1, 99)} | {rng.randint(10, 999)}.50 |" for _ in range(4)]
    rows.insert(2, f"retry_budget: {v['retries']}")
    tools += [
        openai_call("call_n1", "tail_logs", {"service": "api"}, "\n".join(logs)),
        anthropic_call("toolu_n2", "run_sql", {"query": "select * from limits"}, "\n".join(rows)),
    ]
    corrections = [[user(p[variant % len(p)].format(**v))] for p in CORRECTIONS]
    return [*said, *tools, *corrections, [assistant(REMINDERS[variant % 3].format(**v))]]


def log_lines(rng: random.Random, count: int) -> str:
    """A tail of service logs: timestamps, levels, ids and latencies, one retried error."""
    lines = []
    for i in range(count):
        level = rng.choice(["INFO", "INFO", "INFO", "WARN", "ERROR"])
        day, hour, ms = rng.randint(1, 28), rng.randint(0, 23), rng.randint(0, 999)
        stamp = f"2024-05-{day:02d}T{hour:02d}:{rng.randint(0, 59):02d}:{i:02d}.{ms:03d}Z"
        what = (
            f"processed batch {rng.randint(1000, 9999)} in {rng.randint(20, 900)}ms"
            if level == "INFO"
            else f"retrying request {rng.getrandbits(32):08x} after {rng.randint(1, 5)} attempts"
        )
        lines.append(f"{stamp} {level} worker-{rng.randint(1, 9)} {what}")
    return "\n".join(lines)


def filler(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """One stretch of everyday agent work that plants nothing."""
    path, component = rng.choice(FILES), rng.choice(COMPONENTS)
    asks = [
        f"Now look at the {component} in {path}.",
        f"Can you check why the {component} is slow?",
        "ok, continue",
        "Looks good, go on.",
        f"What does the {component} do?",
        f"Next, look at module m{n} and report.",
        f"Don't touch {rng.choice(FILES)} for now, someone else is editing it.",
    ]
    outputs = [
        ("read_file", {"path": path}, CODE),
        (
            "grep",
            {"pattern": "error"},
            f'{path}:{rng.randint(10, 400)}:        log.error("failed")\n'
            f"{rng.choice(FILES)}:{rng.randint(10, 400)}:    except TimeoutError as err:",
        ),
        ("tail_logs", {"service": "worker", "lines": 12}, log_lines(rng, 12)),
        (
            "run_sql",
            {"query": "select id, total from invoices limit 3"},
            f"| id | total |\n|----|-------|\n"
            f"| {rng.randint(1, 99)} | {rng.randint(10, 999)}.50 |\n"
            f"| {rng.randint(100, 999)} | 12.00 |\n(3 rows)",
        ),
        (
            "git_log",
            {"n": 2},
            f"commit {rng.getrandbits(160):040x}\nAuthor: CI Bot <ci@example.com>\n"
            f"Date:   Tue May {rng.randint(1, 28)} 10:{rng.randint(10, 59)}:00 2024\n\n"
            "    chore: bump deps",
        ),
    ]
    tool, arguments, output = rng.choice(outputs)
    call = [openai_call, anthropic_call, responses_call][n % 3](
        f"call_f{n}", tool, arguments, output
    )
    comments = [
        "Let me check that.",
        f"I read {path}; nothing stands out.",
        f"The {component} handles the parsing and looks fine.",
        f"I found {rng.randint(2, 9)} call sites that need updating.",
        f"There are {rng.randint(2, 5)} warnings but nothing blocking.",
        "Done. The change compiles.",
        f"Module m{n} looks fine; nothing to do.",
        f"The {component} budget has ${rng.randint(100, 999)}.{rng.randint(10, 99)} left.",
    ]
    return [user(rng.choice(asks)), *call, assistant(rng.choice(comments))]


def synthetic_conversation(
    index: int, size: int = 200
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """About ``size`` messages: the planted facts spread evenly among filler stretches."""
    rng = random.Random(index)
    values = VALUES[index]
    first, *rest = plants(values, index)
    fills: list[list[dict[str, Any]]] = []
    room = size - len(first) - sum(len(p) for p in rest)
    while sum(len(f) for f in fills) < room:
        fills.append(filler(rng, len(fills)))
    # each plant after an even share of the filler, so the last ones land near the end
    stretches = [first]
    for n, fill in enumerate(fills):
        stretches.append(fill)
        if rest and n % max(1, len(fills) // (len(rest) + 1)) == 0 and n:
            stretches.append(rest.pop(0))
    stretches.extend(rest)
    messages = [m for stretch in stretches for m in stretch]
    return messages, {name: values[name] for name in CHECKED}


async def fold_in_batches(messages: Sequence[dict[str, Any]], batch: int, **budget: int) -> Summary:
    """Summarize ``messages`` ``batch`` at a time, each fold starting from the last summary."""
    summarizer = LedgerSummarizer(COUNTER)
    summary = None
    for start in range(0, len(messages), batch):
        summary = await summarizer.summarize_levels(
            summary, messages[start : start + batch], **budget
        )
    assert summary is not None
    return summary


async def test_retention_of_planted_facts_over_long_folded_conversations() -> None:
    """Folded 40 at a time, >=85% of planted values stay in 2,000 tokens; >=70% in 600 of ledger."""
    both_kept = ledger_kept = total = lines = factual = 0
    lost: list[str] = []
    for index in range(3):
        messages, facts = synthetic_conversation(index)
        assert 190 <= len(messages) <= 230
        summary = await fold_in_batches(messages, 40, max_tokens=2_000, ledger_tokens=600)
        text = f"{summary.ledger}\n\n{summary.narrative}"
        assert COUNTER.count(summary.ledger) <= 600 and COUNTER.count(text) <= 2_000
        planted = set(VALUES[index].values())
        bullets = [line for line in summary.ledger.splitlines() if line.startswith("- ")]
        lines += len(bullets)
        factual += sum(any(value in line for value in planted) for line in bullets)
        total += len(facts)
        both_kept += sum(value in text for value in facts.values())
        ledger_kept += sum(value in summary.ledger for value in facts.values())
        lost += [f"{index}:{name}" for name, value in facts.items() if value not in text]
        lost += [
            f"{index}:{name}(ledger)"
            for name, value in facts.items()
            if value not in summary.ledger
        ]
    print(
        f"retention over {total} planted facts: ledger+narrative {both_kept / total:.0%}, "
        f"ledger alone {ledger_kept / total:.0%}; ledger lines holding a planted value: "
        f"{factual / lines:.0%}; lost: {lost}"
    )
    assert both_kept / total >= 0.85
    assert ledger_kept / total >= 0.70
