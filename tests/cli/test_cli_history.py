"""The history commands (checkpoint, rewind, fork, export, import, compact) as people run them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from redis.asyncio import Redis
from support.cli import one_line, run_cli, run_json, use_settings
from support.helpers import turn
from support.servers import run_burst

from ctxstore import ContextStore, LocalSummarizer, Settings
from ctxstore.summary_queue import JobState, SummaryQueue


@pytest.fixture(autouse=True)
def _store_env(monkeypatch: pytest.MonkeyPatch, summary_settings: Settings) -> None:
    """The commands read the test Redis, a prefix and queue of this test's own."""
    use_settings(monkeypatch, summary_settings)


@pytest.fixture
async def store(summary_settings: Settings, tenant: str) -> ContextStore:
    async with ContextStore.from_settings(summary_settings, tenant=tenant) as opened:
        yield opened  # type: ignore[misc]


async def test_checkpoint_records_lists_and_drops(
    store: ContextStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """`checkpoint` records one (JSON or a line), `--list` shows them, `--delete` drops one."""
    await store.append_many("s", [turn(i) for i in range(4)])
    made = await run_json(["checkpoint", "s", "--tenant", store.tenant, "--name", "four"], capsys)
    assert made["checkpoint"]["checkpoint_id"] == "cp-1" and made["checkpoint"]["count"] == 4
    assert await run_cli(["checkpoint", "s", "--tenant", store.tenant]) == 0
    assert "checkpoint cp-2 of session 's': 4 messages" in capsys.readouterr().out
    listed = await run_json(["checkpoint", "s", "--tenant", store.tenant, "--list"], capsys)
    assert [c["name"] for c in listed["checkpoints"]] == ["four", None]
    assert await run_cli(["checkpoint", "s", "--tenant", store.tenant, "--list"]) == 0
    table = capsys.readouterr().out
    assert "cp-1" in table and "four" in table and "history" in table
    assert await run_cli(["checkpoint", "s", "--tenant", store.tenant, "--delete", "cp-1"]) == 0
    assert await run_cli(["checkpoint", "s", "--tenant", store.tenant, "--delete", "cp-1"]) == 1
    assert [c.checkpoint_id for c in await store.checkpoints("s")] == ["cp-2"]


async def test_rewind_and_fork_say_what_they_did(
    store: ContextStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rewind` to a checkpoint, `fork` at one: the sessions end up as asked."""
    await store.append_many("s", [turn(i) for i in range(3)])
    point = await store.checkpoint("s")
    await store.append_many("s", [turn(i) for i in range(3, 8)])
    forked = await run_json(
        ["fork", "s", "f", "--at", point.checkpoint_id, "--tenant", store.tenant], capsys
    )
    assert (forked["session"], forked["count"], forked["tenant"]) == ("f", 3, store.tenant)
    rewound = await run_json(["rewind", "s", point.checkpoint_id, "--tenant", store.tenant], capsys)
    assert (rewound["count"], rewound["abandoned"], rewound["branch"]) == (3, 5, "br-1")
    assert (
        await store.get_messages("s")
        == await store.get_messages("f")
        == [turn(i) for i in range(3)]
    )
    assert await run_cli(["rewind", "s", point.entry_id, "--tenant", store.tenant]) == 0
    assert "nothing changed" in capsys.readouterr().out
    assert await run_cli(["fork", "s", "g", "--tenant", store.tenant]) == 0
    assert "forked session 's' into 'g'" in capsys.readouterr().out


async def test_errors_are_one_line(store: ContextStore, capsys: pytest.CaptureFixture[str]) -> None:
    """A malformed target is status 2; a missing one, or an existing fork, 1: one line each."""
    await store.append("s", turn(0))
    await store.append("taken", turn(1))
    assert await run_cli(["rewind", "s", "cp-9", "--tenant", store.tenant]) == 1
    line = one_line(capsys.readouterr().err)
    assert f"no checkpoint cp-9 in session 's' of tenant {store.tenant!r}" in line
    assert await run_cli(["rewind", "s", "soon", "--tenant", store.tenant]) == 2
    assert "is not a stream entry id" in one_line(capsys.readouterr().err)
    assert await run_cli(["fork", "s", "taken", "--tenant", store.tenant]) == 1
    assert "exists" in one_line(capsys.readouterr().err)
    assert await run_cli(["compact", "nobody", "--tenant", store.tenant]) == 1
    assert one_line(capsys.readouterr().err) == (
        f"ctxstore: no session 'nobody' for tenant {store.tenant!r}"
    )
    with pytest.raises(SystemExit) as usage:
        await run_cli(["export", "s", "--all", "--tenant", store.tenant])
    assert usage.value.code == 2
    with pytest.raises(SystemExit):
        await run_cli(["compact", "s", "--timeout", "0"])


async def test_export_then_import_elsewhere(
    store: ContextStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`export` to a file, `import` into another tenant: the same; a second import: unchanged."""
    await store.append_many("a", [turn(i) for i in range(30)])
    await store.append_many("b", [turn(i) for i in range(30, 40)])
    await store.checkpoint("a")
    out = tmp_path / "tenant.jsonl"
    assert await run_cli(["export", "--all", "--tenant", store.tenant, "--out", str(out)]) == 0
    assert "exported 2 sessions" in capsys.readouterr().err
    other = store.tenant + "x"
    first = await run_json(["import", str(out), "--tenant", other], capsys)
    assert {(s["session"], s["status"], s["count"]) for s in first["sessions"]} == {
        ("a", "imported", 30),
        ("b", "imported", 10),
    }
    again = await run_json(["import", str(out), "--tenant", other], capsys)
    assert {s["status"] for s in again["sessions"]} == {"unchanged"}
    copy = store.for_tenant(other)
    assert await copy.get_messages("a") == await store.get_messages("a")
    assert len(await copy.checkpoints("a")) == 1
    one = tmp_path / "one.jsonl"
    assert await run_cli(["export", "b", "--tenant", store.tenant, "--out", str(one)]) == 0
    capsys.readouterr()
    assert await run_cli(["import", str(one), "--tenant", other, "--session", "b2"]) == 0
    assert "imported session 'b2'" in capsys.readouterr().out


async def test_export_all_walks_the_index(
    store: ContextStore,
    tmp_path: Path,
    raw_redis: Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`export --all` walks the tenant's index, misses no session, skips one that expired."""
    for i in range(8):
        await store.append(f"s{i}", turn(i))
    await store.append("gone", turn(9))
    await raw_redis.delete(*store.keys("gone").all())  # what its expiry does: listed, no keys
    out = tmp_path / "all.jsonl"
    assert await run_cli(["export", "--all", "--tenant", store.tenant, "--out", str(out)]) == 0
    assert "exported 8 sessions" in capsys.readouterr().err
    heads = [json.loads(line) for line in out.read_text().splitlines() if '"session"' in line]
    assert sorted(h["session"] for h in heads if h["ctxstore"] == "session") == [
        f"s{i}" for i in range(8)
    ]


async def test_a_malformed_import_names_its_line(
    store: ContextStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A broken line: one line naming it, status 2, nothing written; a missing file too."""
    await store.append_many("s", [turn(i) for i in range(5)])
    out = tmp_path / "s.jsonl"
    assert await run_cli(["export", "s", "--tenant", store.tenant, "--out", str(out)]) == 0
    capsys.readouterr()
    lines = out.read_text().splitlines()
    lines[3] = lines[3][:-5]
    out.write_text("\n".join(lines) + "\n")
    assert await run_cli(["import", str(out), "--tenant", store.tenant, "--session", "t"]) == 2
    assert "line 4: not JSON" in one_line(capsys.readouterr().err)
    assert not (await store.info("t")).exists
    assert await run_cli(["import", str(tmp_path / "none.jsonl"), "--tenant", store.tenant]) == 2
    assert "cannot read" in one_line(capsys.readouterr().err)


async def test_compact_queues_a_summary_and_waits_for_a_worker(
    store: ContextStore, summary_settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a worker running the queue, `compact` returns once the summary is committed."""
    await store.append_many("s", [turn(i) for i in range(30)])
    await store.summarize("s", LocalSummarizer())
    await store.append_many("s", [turn(i) for i in range(30, 50)])
    command = asyncio.create_task(
        run_cli(["compact", "s", "--tenant", store.tenant, "--timeout", "60", "--json"])
    )
    queue = await SummaryQueue.connect(summary_settings)
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
    await run_burst(summary_settings, LocalSummarizer())
    assert await command == 0
    report = json.loads(capsys.readouterr().out)
    assert report["outcome"] == "committed" and report["summary_covers"] is not None
    assert (await store.info("s")).summary_covers == report["summary_covers"]


async def test_compact_gives_up_after_its_timeout(
    store: ContextStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """No worker: status 1 after --timeout, one line saying what to check."""
    await store.append("s", turn(0))
    assert await run_cli(["compact", "s", "--tenant", store.tenant, "--timeout", "0.3"]) == 1
    assert "is `ctxstore worker` running?" in one_line(capsys.readouterr().err)
