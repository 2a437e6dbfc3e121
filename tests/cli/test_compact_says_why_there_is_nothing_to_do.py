"""`ctxstore compact` of a session too short to summarize says why, not "idle ... 0 of N"."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from support.cli import run_cli, use_settings
from support.helpers import turn
from support.servers import run_burst

from ctxstore import ContextStore, LocalSummarizer, Settings
from ctxstore.summary_queue import JobState, SummaryQueue


@pytest.fixture
async def store(
    summary_settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[ContextStore]:
    """A store with a small summary window; the command reads the same settings."""
    use_settings(monkeypatch, summary_settings)
    async with ContextStore.from_settings(summary_settings, tenant=tenant) as opened:
        yield opened


async def compact_with_a_worker(store: ContextStore, settings: Settings, *flags: str) -> int:
    """Run `compact` while a burst worker runs its job; its exit status."""
    command = asyncio.create_task(
        run_cli(["compact", "s", "--tenant", store.tenant, "--timeout", "60", *flags])
    )
    queue = await SummaryQueue.connect(settings)
    try:
        generation = 0
        async with asyncio.timeout(30):
            while generation == 0 or await queue.status(store.tenant, "s", generation) not in (
                JobState.QUEUED,
                JobState.COMPLETE,
            ):
                generation = (await store.info("s")).summary_generation
                await asyncio.sleep(0.01)  # the command enqueues in its own thread: polled
    finally:
        await queue.aclose()
    await run_burst(settings, LocalSummarizer())
    return await command


async def test_compact_of_a_short_session_says_there_is_nothing_to_summarize(
    store: ContextStore, summary_settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """Within what a summary leaves raw: why, in the settings' numbers and names; status 0."""
    await store.append("s", turn(0))
    tokens = (await store.info("s")).tokens
    status = await compact_with_a_worker(store, summary_settings)
    assert status == 0
    said = capsys.readouterr().out.strip()
    assert said.startswith(
        f"nothing to summarize in session 's' ({tokens:,} tokens, 0 summarized): a summary "
        f"leaves the newest up to {summary_settings.summary_keep_tokens:,} tokens raw "
        "(CTXSTORE_SUMMARY_KEEP_TOKENS)"
    )
    assert f"{summary_settings.summary_trigger_tokens:,} tokens" in said
    assert "CTXSTORE_SUMMARY_TRIGGER_TOKENS" in said


async def test_compact_json_of_a_short_session_reports_idle(
    store: ContextStore, summary_settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """--json keeps its keys: outcome idle, no summary, status 0."""
    await store.append("s", turn(0))
    status = await compact_with_a_worker(store, summary_settings, "--json")
    assert status == 0
    report = json.loads(capsys.readouterr().out)
    assert report["outcome"] == "idle" and report["summary_covers"] is None
