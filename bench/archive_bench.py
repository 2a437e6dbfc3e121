"""Export and import: their time at 10,000 and 100,000 messages, and the export's memory.

Each history is short agent turns (about 40 cl100k tokens each, one in fifty
a tool call and its result), pinned and checkpointed here and there.

- **export**: ``export_session`` written to a file; then again, traced: the
  Python heap's peak while it runs (tracemalloc), and the process's peak
  resident memory before and after it. Target: the peak at 100,000 messages
  within 1.5x the one at 10,000 (an export reads a page at a time: its
  memory does not follow the history).
- **import**: that file into another tenant, then the same file again (it
  checks every line and changes nothing).

Every key is under a prefix of the run's own, deleted at the end. Run it from
the repository root::

    .venv/bin/python -m bench.archive_bench [--quick]
"""

from __future__ import annotations

import resource
import secrets
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.runner import run_bench
from ctxstore import ContextStore, Settings
from ctxstore.testing import remove_keys

TARGET = 1.5
"""The most the export's peak memory at 100,000 messages may be against 10,000."""


def turns(start: int, stop: int) -> list[dict[str, Any]]:
    """Agent turns ``start`` to ``stop``: text, and a tool call with its result now and then."""
    out: list[dict[str, Any]] = []
    for i in range(start, stop):
        if i % 50 == 48:
            function = {"name": "grep", "arguments": "{}"}
            call = {"id": f"c{i}", "type": "function", "function": function}
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif i % 50 == 49:
            out.append({"role": "tool", "tool_call_id": f"c{i - 1}", "content": f"match {i}"})
        else:
            role = "user" if i % 2 == 0 else "assistant"
            out.append({"role": role, "content": f"turn {i}: the build of module {i % 97} passes"})
    return out


async def export(store: ContextStore, session: str, path: Path) -> None:
    with path.open("w") as out:
        async for line in store.export_session(session):
            out.write(line + "\n")


def rss_mb() -> float:
    """The process's peak resident memory so far, in MB (Linux reports KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def measure(store: ContextStore, other: ContextStore, count: int, folder: Path) -> float:
    """One row; returns the export's peak heap in bytes."""
    session = f"s{count}"
    for start in range(0, count, 1_000):
        results = await store.append_many(session, turns(start, start + 1_000))
        if start % 20_000 == 0:
            await store.pin(session, results[0].entry_id)
            await store.checkpoint(session, name=f"at {start:,}")
    path = folder / f"{session}.jsonl"
    started = time.perf_counter()
    await export(store, session, path)
    export_s = time.perf_counter() - started
    rss_before = rss_mb()
    tracemalloc.start()  # a second export, traced (tracing slows it down)
    await export(store, session, path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    rss_after = rss_mb()
    started = time.perf_counter()
    with path.open() as lines:
        (first,) = await other.import_sessions(lines)
    import_s = time.perf_counter() - started
    started = time.perf_counter()
    with path.open() as lines:
        (again,) = await other.import_sessions(lines)
    again_s = time.perf_counter() - started
    assert (first.status, again.status, first.count) == ("imported", "unchanged", count)
    size = path.stat().st_size / 1e6
    print(f"{count:>9,}{size:>9.1f} MB{export_s:>9.2f} s{peak / 1e6:>10.2f} MB"
          f"{rss_before:>10.0f} MB{rss_after:>8.0f} MB{import_s:>9.2f} s"
          f"{again_s:>9.2f} s")  # fmt: skip
    await store.delete(session)
    await other.delete(session)
    return peak


async def run(url: str, quick: bool) -> bool:
    prefix = f"ctxbench-{secrets.token_hex(5)}"
    settings = Settings(redis_url=url, key_prefix=prefix, summary_trigger_tokens=0)
    store = ContextStore.from_settings(settings, tenant="bench")
    other = store.for_tenant("imported")
    try:
        print(f"{'history':>9}{'file':>12}{'export':>11}{'heap peak':>13}{'RSS before':>13}"
              f"{'after':>11}{'import':>11}{'again':>11}")  # fmt: skip
        with tempfile.TemporaryDirectory() as folder:
            small = await measure(store, other, 10_000, Path(folder))
            large = await measure(store, other, 20_000 if quick else 100_000, Path(folder))
    finally:
        await store.aclose()
        await remove_keys(url, prefix)
    ratio = large / small
    ok = ratio <= TARGET
    print(f"\nexport heap peak, large / 10,000 messages: {ratio:.2f}x (target <= {TARGET}x) "
          f"{'ok' if ok else 'OVER'}")  # fmt: skip
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; exit status 1 when the memory ratio is over its target."""
    return run_bench(run, __doc__, argv, "20,000 messages, not 100,000")


if __name__ == "__main__":
    sys.exit(main())
