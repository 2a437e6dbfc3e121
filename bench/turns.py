"""Cost per agent turn: client time, Redis CPU and bytes Redis sends, against a plain client.

An agent turn here is what a pod does around two model calls: append the
user's message, read the view, append the assistant's message with two
parallel tool calls and their two results, read the view again. The plain
client does the same turn with raw redis-py: one ``XADD`` per message, and
for each view ``XRANGE key - + COUNT 1`` (the system prompt) plus
``XREVRANGE key + - COUNT 64`` (the newest messages), as a hand-written
history would; it counts tokens with tiktoken at append, as ctxstore does.

Each workload runs on a private ``redis-server`` (Redis 7 from PATH, the
shipped deploy/redis.conf with persistence off), with the store's scripts
loaded as a Functions library, as the deploy's ``functions`` job loads them
(the pods run them by ``FCALL``), so the server's CPU
(``INFO cpu``: user + system, main thread and I/O) and its output bytes
(``INFO stats`` ``total_net_output_bytes``) belong to the run alone. The
workloads: one session of 100, 1,000 and 3,000 messages (filled untimed
first), 50 sessions of 1,000 messages served round robin, and the same run at
once, each session an agent loop of its own (as a pod serving many agents runs
them: the server then reads several requests per wake-up, and its cost per
request follows its instructions more than its system calls). ctxstore and the
plain client alternate in blocks, on sessions of their own, and each figure is
per turn: the median client time, and the server's CPU and bytes over the
block divided by its turns (the two INFO probes per block are under 0.1% of
a block's CPU and are left in).

Run it from the repository root::

    .venv/bin/python -m bench.turns            # make bench-turns
    .venv/bin/python -m bench.turns --quick    # fewer turns: a smoke run
    .venv/bin/python -m bench.turns --repeat 5 # per-operation tables 5 times: medians

A second table breaks the turn into its operations, as the cost-per-turn
issue states its targets, on 3,000-message sessions: an append of one
message (also by a pod whose tenant has a TTL and quotas, against a plain
client that gives its stream the TTL); a *cold* view (a pod that keeps no views: a store with
``view_cache_bytes=0``, which has viewed each session before, so it knows
where its last view started and reads back that far); and a *hot* view (the
pod that viewed the session last, after one new message: its own, as in an
agent loop, then in a second row another pod's). Each phase runs
over 50 sessions (:data:`OPS_SESSIONS`) between two INFO probes, and the plain client does the same
phases (its view is the same whether hot or cold). The probes' own CPU and
output (about 3 us and 80 bytes per operation, a tenth of a hot view's) are
measured around phases that do nothing, in the same rounds, and subtracted.
An operation's Redis CPU is its median phase's: a phase of 50 appends is some
2.5 ms of the server's CPU, which one hiccup of a shared machine can double.
It runs twice: with messages of 1,024 bytes of text, the issue's own setup
(its plain view sends 84 KB), and of 400 bytes, where the plain client's 64
messages hold less than the budget's view.

A third table appends one message at a time to 10 new sessions, as an agent
loop writes, through the first 512 keys of their idempotency generation, in
stretches (keys 2-16, 17-64, 65-256, 257-512), beside a plain ``XADD`` to
streams of the same age. The per-operation table's sessions are filled in
batches, so their generation is large from the start; an agent loop's begins
small every ``idempotency_seconds``, and its cost per append could depend on
how far into it the session is.

It prints the tables and writes ``bench/results/turns.json``.

``--repeat N`` runs only the per-operation and one-at-a-time tables, N times,
each on a fresh server, and prints each ratio's median and range (and writes
``bench/results/turns_repeat.json``): one run's ratios move by up to a fifth
between runs minutes apart here, more than a target's margin.

``--instructions`` (``make bench-instructions``, needs valgrind) runs the
1,024-byte per-operation table on a redis-server under callgrind and counts
the instructions it runs for its clients (reading and running their
commands, writing the replies; not its timer), on 4 sessions: exact and
repeatable where ``INFO cpu`` here moves by up to 2x between runs, but user
space only, so a plain ``XADD``'s system calls, most of its ``INFO cpu``, are
not in it. It writes ``bench/results/turns_instructions.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import random
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from bench.bench import SHIPPED_CONF, conversation, private_redis, tool_exchange
from ctxstore import ContextStore, Settings, TiktokenCounter, count_message
from ctxstore._redis.scripts import Script, library

RESULTS = Path(__file__).resolve().parent / "results" / "turns.json"
INSTRUCTION_RESULTS = RESULTS.with_name("turns_instructions.json")
BUDGET = 8_000
SIZE = 400
"""Bytes of text per message of the turn workloads (the tool results and prose of bench.bench)."""
OPS_LENGTH = 3_000
OPS_SESSIONS = 50
"""Sessions a per-operation phase runs over, one operation each: 50, so each phase of
script appends holds one of the Lua garbage collector's steps Redis forces every 50 script
calls (some 270k instructions, two appends' worth), its share in a steady state; with 20,
a phase held one in some rounds and none in others, in a pattern set by the rows' order.
The rows still move with their place in a round, by more than their instructions differ:
the first append phase after the views and the idle phase read the same append's CPU at
1.98x and 1.70x in two orders (it costs 146k-151k instructions there, 143k fourth)."""
OPS_SIZES = (1_024, 400)
"""The per-operation table's message sizes. 1,024 bytes is the cost-per-turn issue's own
setup (its plain client's view sends 84 KB: 65 entries of about 1.3 KB); at 400 bytes the
plain client's 64 messages hold less than the budget's view, which then sends more."""


@dataclass(slots=True)
class Block:
    """What one side's block of turns cost."""

    seconds: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    out_bytes: int = 0
    turns: int = 0
    probes: int = 0  # pairs of INFO probes around its phases
    instructions: int = 0  # the server's, when it runs under callgrind
    phases: list[tuple[float, int]] = field(default_factory=list)
    """Each phase's server CPU (seconds) and operations, when it ran in phases."""

    def less_probes(self, idle: Block) -> Block:
        """This block without its probes' own cost, as measured around phases that do nothing.

        A phase's CPU less the median idle phase's: a phase of 50 appends is 2.5 ms
        of the server's CPU, which one hiccup of a shared machine can double.
        """
        if not idle.probes:
            return self
        share = self.probes / idle.probes
        idle_phase = statistics.median(cpu for cpu, _ in idle.phases) if idle.phases else 0.0
        return Block(
            self.seconds,
            max(0.0, self.cpu_s - share * idle.cpu_s),
            max(0, self.out_bytes - round(share * idle.out_bytes)),
            self.turns,
            instructions=max(0, self.instructions - round(share * idle.instructions)),
            phases=[(max(0.0, cpu - idle_phase), ops) for cpu, ops in self.phases],
        )

    def row(self) -> dict[str, float]:
        """Per turn: median client time, the server's CPU and output bytes (and instructions).

        Run in phases, the CPU is the median phase's per operation (a hiccup of the
        machine lands in one phase); else the block's total per turn.
        """
        cpu = (
            statistics.median(cpu / ops for cpu, ops in self.phases)
            if self.phases
            else self.cpu_s / self.turns
        )
        row = {
            "client_ms_p50": statistics.median(self.seconds) * 1000,
            "redis_cpu_us": cpu * 1e6,
            "redis_out_kb": self.out_bytes / self.turns / 1024,
        }
        if self.instructions:  # counted only under callgrind
            row["redis_kinstr"] = self.instructions / self.turns / 1000
        return row


class Instructions:
    """Counts the instructions a redis-server under callgrind runs, phase by phase.

    ``INFO cpu`` moves by up to 2x between runs on a shared machine, more than
    most changes to a script; callgrind's count of the server's own
    instructions (user space only: no system calls, no network) is exact and
    repeatable to under 2% over the one-at-a-time table's phases, so a change
    of a few percent shows there. A per-operation phase (4 sessions) moves by
    up to 15% between runs: the Lua garbage collector's work lands in
    whichever phase allocates when it is due. The server runs with
    instrumentation off until :meth:`start` (filling the sessions runs at
    valgrind's plain speed).
    """

    def __init__(self, pid: int, out: Path) -> None:
        self._pid = str(pid)
        self._out = out  # callgrind writes each dump to <out>.<n>

    def _control(self, *flags: str) -> None:
        subprocess.run(["callgrind_control", *flags, self._pid], check=True, capture_output=True)

    def start(self) -> None:
        """Instrument from now on."""
        self._control("--instr=on")

    def zero(self) -> None:
        """Count from zero."""
        self._control("--zero")

    def total(self) -> int:
        """The instructions since :meth:`zero` (each dump file is read, then removed)."""
        self._control("--dump")
        dumps = sorted(
            self._out.parent.glob(self._out.name + ".*"), key=lambda p: int(p.suffix[1:])
        )
        text = dumps[-1].read_text()
        for dump in dumps:
            dump.unlink()
        found = re.search(r"^(?:summary|totals): (\d+)", text, re.MULTILINE)
        if found is None:
            raise RuntimeError(f"no instruction total in callgrind's dump {dumps[-1]}")
        return int(found[1])


async def server_counters(raw: Redis) -> tuple[float, int]:
    """The server's CPU seconds so far (user + system) and bytes sent."""
    cpu = await raw.info("cpu")
    stats = await raw.info("stats")
    return (
        float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
        int(stats["total_net_output_bytes"]),
    )


class Plain:
    """The hand-written baseline: raw streams, tiktoken at append.

    ``ttl_ms``: each append gives the stream this TTL (``PEXPIRE`` pipelined after
    each ``XADD``), as a hand-written store with retention would.
    """

    def __init__(self, raw: Redis, counter: TiktokenCounter, ttl_ms: int | None = None) -> None:
        self._raw = raw
        self._counter = counter
        self._ttl_ms = ttl_ms

    async def fill(self, session: str, messages: Sequence[dict[str, Any]]) -> None:
        """Write a history untimed, pipelined."""
        pipe = self._raw.pipeline(transaction=False)
        for message in messages:
            pipe.xadd(f"plain:{session}", {"m": json.dumps(message), "t": self._count(message)})
        await pipe.execute()

    async def append(self, session: str, messages: Sequence[dict[str, Any]]) -> None:
        """One XADD per message (and its PEXPIRE with a TTL, in the same round trip)."""
        key = f"plain:{session}"
        for message in messages:
            fields: dict[Any, Any] = {"m": json.dumps(message), "t": self._count(message)}
            if self._ttl_ms is None:
                await self._raw.xadd(key, fields)
            else:
                pipe = self._raw.pipeline(transaction=False)
                pipe.xadd(key, fields)
                pipe.pexpire(key, self._ttl_ms)
                await pipe.execute()

    async def view(self, session: str) -> int:
        """The system prompt and the newest 64 messages."""
        first = await self._raw.xrange(f"plain:{session}", "-", "+", count=1)
        newest = await self._raw.xrevrange(f"plain:{session}", "+", "-", count=64)
        return len(first) + len(newest)

    def _count(self, message: dict[str, Any]) -> int:
        return count_message(self._counter, message)


class Ctx:
    """ctxstore, as a pod uses it."""

    def __init__(self, store: ContextStore) -> None:
        self._store = store

    async def fill(self, session: str, messages: Sequence[dict[str, Any]]) -> None:
        """Write a history untimed, 500 messages per append_many."""
        for start in range(0, len(messages), 500):
            await self._store.append_many(session, messages[start : start + 500])

    async def append(self, session: str, messages: Sequence[dict[str, Any]]) -> None:
        """The first message alone (the user's turn), the rest in one batch."""
        await self._store.append(session, messages[0])
        if len(messages) > 1:
            await self._store.append_many(session, messages[1:])

    async def view(self, session: str) -> int:
        """The request view at the benchmark's budget."""
        return len((await self._store.view(session, token_budget=BUDGET)).messages)


async def run_block(
    side: Plain | Ctx,
    raw: Redis,
    sessions: Sequence[str],
    turns: int,
    next_turn: Callable[[], list[dict[str, Any]]],
    at_once: bool = False,
) -> Block:
    """``turns`` agent turns, round robin over ``sessions``.

    ``at_once``: each session is an agent loop of its own, all of them running
    together (``turns`` a session), as a pod serving many agents runs them.
    """

    async def one_turn(session: str) -> None:
        exchange = next_turn()
        started = time.perf_counter()
        await side.append(session, exchange[:1])
        await side.view(session)
        await side.append(session, exchange[1:])
        await side.view(session)
        block.seconds.append(time.perf_counter() - started)

    async def agent(session: str) -> None:
        for _ in range(turns):
            await one_turn(session)

    block = Block(turns=turns * len(sessions) if at_once else turns)
    cpu0, out0 = await server_counters(raw)
    if at_once:
        await asyncio.gather(*(agent(session) for session in sessions))
    else:
        for index in range(turns):
            await one_turn(sessions[index % len(sessions)])
    cpu1, out1 = await server_counters(raw)
    block.cpu_s, block.out_bytes = cpu1 - cpu0, out1 - out0
    return block


async def workload(
    url: str, name: str, length: int, sessions: int, turns: int, rounds: int, at_once: bool = False
) -> dict[str, Any]:
    """One workload: fill both sides, then alternate blocks of turns (see :func:`run_block`)."""
    counter = TiktokenCounter()
    settings = Settings(redis_url=url, key_prefix="turns", queue_name="turns:summaries")
    raw = Redis.from_url(url)
    numbers = itertools.count()
    rng = random.Random(11)

    def next_turn() -> list[dict[str, Any]]:
        return tool_exchange(rng, next(numbers), SIZE)

    history = conversation(length, SIZE, seed=3)
    async with ContextStore.from_settings(settings, tenant="bench") as store:
        plain, ctx = Plain(raw, counter), Ctx(store)
        names = [f"s{length}-{sessions}-{'once-' if at_once else ''}{i}" for i in range(sessions)]
        for session in names:
            await plain.fill(session, history)
            await ctx.fill(session, history)
        blocks: dict[str, list[Block]] = {"plain": [], "ctxstore": []}
        for round_ in range(rounds):
            order: list[tuple[str, Plain | Ctx]] = [("plain", plain), ("ctxstore", ctx)]
            if round_ % 2:
                order.reverse()
            for label, side in order:
                block = await run_block(side, raw, names, turns, next_turn, at_once)
                blocks[label].append(block)
    await raw.aclose()
    merged = {label: _merge(b) for label, b in blocks.items()}
    ratio = {k: merged["ctxstore"][k] / merged["plain"][k] for k in merged["plain"]}
    return {"workload": name, "messages": length, "sessions": sessions, **merged, "ratio": ratio}


OTHERS = "hot view, another's message"
LIMITED = "append, TTL and quotas"
EVALSHA_APPEND = "append, by EVALSHA"
LIMITS: dict[str, Any] = {
    "session_ttl_seconds": 86_400,
    "session_bytes": 10**9,
    "session_tokens": 10**9,
    "appends_per_second": 100.0,
    "append_burst": 10_000,
}
"""A tenant's TTL and quotas, as a platform would set them (none is reached here)."""
APPEND_AT_ONCE, VIEW_AT_ONCE = "append, all at once", "hot view, all at once"
FLOOR_APPEND, ONE_REQUEST = "floor: XADD in a script", "one request (PING)"
OPERATIONS = (
    "append",
    "append, paced",
    LIMITED,
    EVALSHA_APPEND,
    "cold view",
    "hot view",
    OTHERS,
    APPEND_AT_ONCE,
    VIEW_AT_ONCE,
    FLOOR_APPEND,
    ONE_REQUEST,
)
"""``append, paced``: each append is due the tenant index's touch, as when a session's
turns come a second or more apart (a model call between them): its pod's
``index_interval`` is 0. It writes sessions of its own, so the views' rows still
follow one new message. The plain client has no index: its row is a plain append.
``append, TTL and quotas``: a pod whose tenant has a TTL and size and rate quotas
(:data:`LIMITS`, never reached), on sessions of its own; the plain client's append
gives its stream the TTL too (``XADD`` and ``PEXPIRE`` in one round trip).
Every pod runs the scripts as the deploy leaves them (:func:`deployed`): by ``FCALL`` of
the Functions library ``ctxstore functions load`` loaded (``script_mode`` auto).
``append, by EVALSHA``: a pod with ``script_mode=eval`` (as where no library is loaded),
on sessions of its own, beside the same plain append. ``EVALSHA`` runs a script's whole
text each call (its shared functions made anew) and finds it by its SHA; ``FCALL`` calls
a function the library made once.
``append, all at once`` and ``hot view, all at once``: the same append, then the
hot view after it, on all of 50 sessions together (4 under ``--instructions``; sessions
of their own, so the cold view still reads back what it did),
as a pod serving many agents
sends them (the server reads several requests per wake-up: its system calls
are shared, and its cost per request follows its instructions). Their client
times are the wait of each of the calls in flight together.
``hot view``: the pod appended the new message itself (an agent loop), and so need not
read it back; ``hot view, another's message``: another pod did (the cold one), and the
hot pod reads it.
Two rows set beside the plain client's append and view what ctxstore's designs are bound
by, one request at a time, both sent through the hot pod's own connection: ``floor: XADD in
a script``, a script that does nothing but the message's ``XADD``, sent as the lean append
is (by ``FCALL``, 4 keys, 8 arguments; no atomic script append costs less); ``one request
(PING)``, what a request costs the server before any command's work (the plain view makes
two; any validated read at least one). Where Redis idles between requests its wake-up dominates
both, and the hot views' ``INFO cpu`` falls within its noise of the PING's."""


def user_turns(size: int) -> Callable[[], list[dict[str, Any]]]:
    """Each call, the next user turn of ``size`` bytes of text (numbered, so none repeats)."""
    numbers = itertools.count()

    def user_turn() -> list[dict[str, Any]]:
        return [{"role": "user", "content": f"question {next(numbers)}: " + "x" * (size - 20)}]

    return user_turn


def appending(
    side: Plain | Ctx, turn: Callable[[], list[dict[str, Any]]]
) -> Callable[[str], Awaitable[None]]:
    """An operation that appends the next ``turn`` to a session through ``side``."""

    async def add(session: str) -> None:
        await side.append(session, turn())

    return add


FLOOR_SOURCE = b"return redis.call('XADD', KEYS[1], '*', 'm', ARGV[6], 't', ARGV[7])"
FLOOR_SCRIPT = Script(
    "floor", FLOOR_SOURCE, hashlib.sha1(FLOOR_SOURCE).hexdigest(), "ctxbench_floor"
)
"""The least an atomic script append can do: the message's ``XADD``, nothing else."""
FLOOR_LIBRARY = (
    "#!lua name=ctxbench\n"
    f"redis.register_function('{FLOOR_SCRIPT.function}', function(KEYS, ARGV) "
    f"{FLOOR_SOURCE.decode()} end)\n"
)
"""The floor as a Functions library, called by ``FCALL`` as the store's scripts are."""


async def deployed(url: str) -> None:
    """Load the store's Functions library on ``url``, and the floor's beside it.

    As the deploy's ``functions`` job does (``ctxstore functions load``).
    """
    raw = Redis.from_url(url)
    try:
        await raw.execute_command("FUNCTION", "LOAD", "REPLACE", library())
        await raw.execute_command("FUNCTION", "LOAD", "REPLACE", FLOOR_LIBRARY)
    finally:
        await raw.aclose()


def floors(
    store: ContextStore, counter: TiktokenCounter, turn: Callable[[], list[dict[str, Any]]]
) -> tuple[Callable[[str], Awaitable[None]], Callable[[str], Awaitable[None]]]:
    """The floor's and the one request's operations (see :data:`OPERATIONS`).

    Sent through ``store``'s own connection, as its appends and views are; the script
    append counts the message's tokens, as both sides' appends do.
    """
    connection = store._connection

    async def script_append(session: str) -> None:
        keys = tuple(f"floor:{{{session}}}:{name}" for name in ("log", "meta", "idem", "old"))
        message = turn()[0]
        tokens = count_message(counter, message)
        args = ("", 128, 0, -1, 3_600_000, json.dumps(message), tokens, "k.1")
        await connection.script(FLOOR_SCRIPT, keys, args, session=session)

    async def one_request(session: str) -> None:
        await connection.batch([("PING",)], session=session, key=session)

    return script_append, one_request


def compare_rows(
    blocks: dict[tuple[str, Any], Block], idle: Block, labels: dict[Any, str]
) -> list[dict[str, Any]]:
    """Per key of ``labels``: the plain and ctxstore rows (probes subtracted), and their ratio."""
    rows = []
    for key, label in labels.items():
        plain_row = blocks[("plain", key)].less_probes(idle).row()
        ctx_row = blocks[("ctxstore", key)].less_probes(idle).row()
        ratio = {k: ctx_row[k] / plain_row[k] for k in plain_row}
        rows.append({"operation": label, "plain": plain_row, "ctxstore": ctx_row, "ratio": ratio})
    return rows


async def nothing(session: str) -> None:
    """An operation that sends Redis nothing (a phase of it measures the probes alone)."""


async def phase(
    raw: Redis,
    sessions: Sequence[str],
    operation: Callable[[str], Any],
    block: Block,
    meter: Instructions | None = None,
    times: int = 1,
    at_once: bool = False,
) -> None:
    """Run ``operation`` once per session (``times`` over), adding its cost to ``block``.

    ``at_once``: on every session together (each round of ``times``), not one by one.
    """

    async def timed(session: str) -> None:
        started = time.perf_counter()
        await operation(session)
        block.seconds.append(time.perf_counter() - started)

    cpu0, out0 = await server_counters(raw)
    if meter is not None:
        meter.zero()
    for _ in range(times):
        if at_once:
            await asyncio.gather(*(timed(session) for session in sessions))
        else:
            for session in sessions:
                await timed(session)
    if meter is not None:
        block.instructions += meter.total()
    cpu1, out1 = await server_counters(raw)
    block.cpu_s += cpu1 - cpu0
    block.out_bytes += out1 - out0
    block.turns += times * len(sessions)
    block.probes += 1
    block.phases.append((cpu1 - cpu0, times * len(sessions)))


async def operations(
    url: str,
    length: int,
    sessions: int,
    rounds: int,
    size: int,
    meter: Instructions | None = None,
    **settings: Any,
) -> list[dict[str, Any]]:
    """Per operation: append one message (back to back, and paced), a cold view, a hot view.

    The hot view comes after one new message: its own, then (a second hot view) another
    pod's. Then the rows of :data:`OPERATIONS` run all at once, the floor and the PING.

    ``size``: the bytes of text of each message (history and appends).
    ``meter``: counts the server's instructions in each phase (from after the fill).
    ``settings``: the stores' settings besides the defaults.
    """
    counter = TiktokenCounter()
    base = Settings(
        redis_url=url, key_prefix=f"ops{size}", queue_name=f"ops{size}:summaries", **settings
    )
    cold_settings = base.model_copy(update={"view_cache_bytes": 0})
    paced_settings = base.model_copy(update={"index_interval": 0.0})
    limited_settings = base.model_copy(update=LIMITS)
    evalsha_settings = base.model_copy(update={"script_mode": "eval"})
    raw = Redis.from_url(url)
    history = conversation(length, size, seed=9)
    names = [f"ops{length}-{i}" for i in range(sessions)]
    paced_names = [f"ops{length}-paced-{i}" for i in range(sessions)]
    limited_names = [f"ops{length}-limited-{i}" for i in range(sessions)]
    evalsha_names = [f"ops{length}-evalsha-{i}" for i in range(sessions)]
    once_names = [f"ops{length}-once-{i}" for i in range(sessions)]
    blocks = {(side, op): Block() for side in ("plain", "ctxstore") for op in OPERATIONS}
    idle = Block()  # phases that do nothing: what the INFO probes themselves cost
    async with (
        ContextStore.from_settings(base, tenant="bench") as hot,
        ContextStore.from_settings(cold_settings, tenant="bench") as cold,
        ContextStore.from_settings(paced_settings, tenant="bench") as paced,
        ContextStore.from_settings(limited_settings, tenant="bench") as limited,
        ContextStore.from_settings(evalsha_settings, tenant="bench") as evalsha,
    ):
        plain, ctx, ctx_cold, ctx_paced = Plain(raw, counter), Ctx(hot), Ctx(cold), Ctx(paced)
        plain_ttl = Plain(raw, counter, ttl_ms=LIMITS["session_ttl_seconds"] * 1000)
        ctx_limited = Ctx(limited)
        ctx_evalsha = Ctx(evalsha)
        filled: list[tuple[list[str], Plain, Ctx]] = [
            (names, plain, ctx),
            (paced_names, plain, ctx_paced),
            (limited_names, plain_ttl, ctx_limited),
            (evalsha_names, plain, ctx_evalsha),
            (once_names, plain, ctx),
        ]
        for group, plain_side, ctx_side in filled:
            for session in group:
                await plain_side.fill(session, history)
                await ctx_side.fill(session, history)
                if ctx_side is ctx:
                    await ctx.view(session)  # the hot pod has served its sessions once
        await ctx_cold.view("warm-up")  # the cold pod's connection and scripts are ready

        user_turn = user_turns(size)

        def adding(side: Plain | Ctx) -> Callable[[str], Awaitable[None]]:
            return appending(side, user_turn)

        floor_append, one_request = floors(hot, counter, user_turn)
        for session in names:  # untimed: the script is loaded, its streams made
            await floor_append(session)
        if meter is not None:
            meter.start()
        for _ in range(rounds):
            sides = (
                ("plain", plain, plain, plain, plain_ttl, adding(plain), plain.view),
                ("ctxstore", ctx, ctx_cold, ctx_paced, ctx_limited, floor_append, one_request),
            )
            for label, side, cold_side, paced_side, limited_side, least_append, least_view in sides:
                evalsha_side = ctx_evalsha if side is ctx else plain
                await phase(raw, names, adding(side), blocks[(label, "append")], meter)
                await phase(
                    raw, paced_names, adding(paced_side), blocks[(label, "append, paced")], meter
                )
                await phase(
                    raw, limited_names, adding(limited_side), blocks[(label, LIMITED)], meter
                )
                await phase(
                    raw, evalsha_names, adding(evalsha_side), blocks[(label, EVALSHA_APPEND)], meter
                )
                await phase(raw, names, side.view, blocks[(label, "hot view")], meter)
                await phase(raw, names, cold_side.view, blocks[(label, "cold view")], meter)
                for session in names:  # untimed: another pod's message (the cold pod's)
                    await cold_side.append(session, user_turn())
                await phase(raw, names, side.view, blocks[(label, OTHERS)], meter)
                at_once = blocks[(label, APPEND_AT_ONCE)], blocks[(label, VIEW_AT_ONCE)]
                await phase(raw, once_names, adding(side), at_once[0], meter, at_once=True)
                await phase(raw, once_names, side.view, at_once[1], meter, at_once=True)
                await phase(raw, names, least_append, blocks[(label, FLOOR_APPEND)], meter)
                await phase(raw, names, least_view, blocks[(label, ONE_REQUEST)], meter)
                await phase(raw, names, nothing, idle, meter)
    await raw.aclose()
    if meter is None:  # under valgrind, the server's CPU time says nothing
        print(
            f"INFO probes ({size:,} B): {idle.cpu_s / idle.turns * 1e6:.1f} us of Redis CPU and "
            f"{idle.out_bytes / idle.turns:.0f} bytes per operation, subtracted",
            flush=True,
        )
    return compare_rows(blocks, idle, {op: op for op in OPERATIONS})


GENERATION = ((2, 16), (17, 64), (65, 256), (257, 512))
"""Stretches of a session's first idempotency generation, by the keys it holds after each
append (the first, which creates the session, is not measured)."""
GENERATION_STEP = 16
"""Appends per session in each phase of :func:`generation`; the two sides alternate by phase."""


async def generation(
    url: str,
    sessions: int,
    size: int,
    meter: Instructions | None = None,
    **settings: Any,
) -> list[dict[str, Any]]:
    """Append one message at a time to new sessions, through 512 keys of their generation.

    An agent loop's session is written this way: a message or a few at a time, its
    idempotency generation (the keys of the last ``idempotency_seconds``) starting
    small every period. The per-operation table's sessions are filled in batches,
    so their generation is large from the start. Here each stretch of
    :data:`GENERATION` is a row: per append, the client's p50, the server's CPU and
    bytes (and instructions under callgrind), beside a plain ``XADD`` to a stream
    of the same age.
    """
    counter = TiktokenCounter()
    base = Settings(
        redis_url=url, key_prefix=f"gen{size}", queue_name=f"gen{size}:summaries", **settings
    )
    raw = Redis.from_url(url)
    user_turn = user_turns(size)
    names = [f"gen-{i}" for i in range(sessions)]
    blocks = {(side, span): Block() for side in ("plain", "ctxstore") for span in GENERATION}
    idle = Block()
    async with ContextStore.from_settings(base, tenant="bench") as store:
        plain, ctx = Plain(raw, counter), Ctx(store)

        for session in names:  # made untimed: a creation is no steady-state append
            await appending(plain, user_turn)(session)
            await appending(ctx, user_turn)(session)
        if meter is not None:
            meter.start()
        for span in GENERATION:
            first, last = span
            for _ in range((last - first + 1) // GENERATION_STEP or 1):
                times = min(GENERATION_STEP, last - first + 1)
                for label, side in (("plain", plain), ("ctxstore", ctx)):
                    add = appending(side, user_turn)
                    await phase(raw, names, add, blocks[(label, span)], meter, times)
                await phase(raw, names, nothing, idle, meter)
    await raw.aclose()
    return compare_rows(
        blocks, idle, {span: f"append, keys {span[0]}-{span[1]}" for span in GENERATION}
    )


def render_generation(rows: Sequence[dict[str, Any]], size: int) -> str:
    """The table of :func:`generation`: plain / ctxstore / ratio per stretch."""
    labels = [row["operation"] for row in rows]
    return _table(f"one at a time ({size:,} B)", labels, rows, width=28, digits=2)


def render_operations(rows: Sequence[dict[str, Any]], length: int, size: int) -> str:
    """The per-operation table: plain / ctxstore / ratio for each figure."""
    labels = [row["operation"] for row in rows]
    title = f"per op ({length:,} x {size:,} B)"
    return _table(title, labels, rows, width=28, digits=2)


def _merge(blocks: Sequence[Block]) -> dict[str, float]:
    merged = Block()
    for block in blocks:
        merged.seconds.extend(block.seconds)
        merged.cpu_s += block.cpu_s
        merged.out_bytes += block.out_bytes
        merged.turns += block.turns
    return merged.row()


def render(rows: Sequence[dict[str, Any]]) -> str:
    """The table: per turn, plain / ctxstore / ratio for each figure."""
    labels = [f"{row['workload']} ({row['messages']:,})" for row in rows]
    return _table("workload", labels, rows, width=22, digits=1)


def _table(
    title: str, labels: Sequence[str], rows: Sequence[dict[str, Any]], *, width: int, digits: int
) -> str:
    """Rows of plain / ctxstore / ratio for client time, Redis CPU and bytes, one per label."""
    head = (
        f"{title:<{width}}{'client p50 ms':>26}{'Redis CPU us':>26}{'Redis out KB':>26}\n"
        f"{'':<{width}}" + f"{'plain':>9}{'ctx':>9}{'ratio':>8}" * 3
    )
    lines = [head]
    for label, row in zip(labels, rows, strict=True):
        cells = [
            f"{row['plain'][key]:>9.{digits}f}{row['ctxstore'][key]:>9.{digits}f}"
            f"{row['ratio'][key]:>7.2f}x"
            for key in ("client_ms_p50", "redis_cpu_us", "redis_out_kb")
        ]
        lines.append(f"{label:<{width}}" + "".join(cells))
    return "\n".join(lines)


async def main_async(quick: bool) -> None:
    turns, rounds = (20, 2) if quick else (60, 4)
    # (name, messages a session, sessions, turns a block, all sessions at once)
    cases: list[tuple[str, int, int, int, bool]] = [
        ("one session", 100, 1, turns, False),
        ("one session", 1_000, 1, turns, False),
        ("one session", 3_000, 1, turns, False),
        ("50 sessions", 1_000, 50, turns, False),
        ("50 at once", 1_000, 50, 2, True),
    ]
    rows = []
    with private_redis(SHIPPED_CONF) as (url, note):
        if url is None:
            raise SystemExit(f"the turn benchmark needs a private Redis 7: {note}")
        await deployed(url)
        for name, length, sessions, block_turns, at_once in cases:
            row = await workload(url, name, length, sessions, block_turns, rounds, at_once)
            rows.append(row)
            print(render(rows[-1:]).splitlines()[-1], flush=True)
        per_op = {
            size: await operations(url, OPS_LENGTH, OPS_SESSIONS, 3 if quick else 10, size)
            for size in OPS_SIZES
        }
        one_at_a_time = await generation(url, GENERATION_SESSIONS, OPS_SIZES[0])
    print()
    print(render(rows))
    for size, ops in per_op.items():
        print()
        print(render_operations(ops, OPS_LENGTH, size))
    print()
    print(render_generation(one_at_a_time, OPS_SIZES[0]))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "budget": BUDGET,
                "rows": rows,
                "operations": {str(k): v for k, v in per_op.items()},
                "one_at_a_time": one_at_a_time,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"\nwritten to {RESULTS}")


INSTRUCTION_SESSIONS = 4
"""Sessions of the instruction count: it is exact, so a few suffice (filling is slow)."""
GENERATION_SESSIONS = 10
"""Sessions :func:`generation` appends to in turn (5,110 appends a side)."""
REPEAT_RESULTS = RESULTS.with_name("turns_repeat.json")


async def repeat(runs: int) -> None:
    """The per-operation and one-at-a-time tables ``runs`` times: each ratio's median [range].

    One run's ratios move by up to a fifth here between runs minutes apart (the
    server's CPU follows the machine's other tenants, and each run is a new
    server), more than a target's margin; the median of a few runs, each on a
    fresh server, is the figure to compare with a target.
    """
    tables: dict[str, list[list[dict[str, Any]]]] = {}
    for run in range(runs):
        with private_redis(SHIPPED_CONF) as (url, note):
            if url is None:
                raise SystemExit(f"the turn benchmark needs a private Redis 7: {note}")
            await deployed(url)
            for size in OPS_SIZES:
                rows = await operations(url, OPS_LENGTH, OPS_SESSIONS, 10, size)
                tables.setdefault(f"per op ({OPS_LENGTH:,} x {size:,} B)", []).append(rows)
            rows = await generation(url, GENERATION_SESSIONS, OPS_SIZES[0])
            tables.setdefault(f"one at a time ({OPS_SIZES[0]:,} B)", []).append(rows)
        print(f"run {run + 1} of {runs} done", flush=True)
    summary = {title: spread(table) for title, table in tables.items()}
    for title, rows in summary.items():
        print()
        print(render_spread(title, rows, runs))
    REPEAT_RESULTS.parent.mkdir(parents=True, exist_ok=True)
    REPEAT_RESULTS.write_text(
        json.dumps({"runs": runs, "tables": summary, "raw": tables}, indent=2) + "\n"
    )
    print(f"\nwritten to {REPEAT_RESULTS}")


FIGURES = ("client_ms_p50", "redis_cpu_us", "redis_out_kb")


def spread(runs: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per operation of a table run several times: each ratio's median, lowest and highest."""
    rows = []
    for same in zip(*runs, strict=True):
        ratios = {key: sorted(row["ratio"][key] for row in same) for key in FIGURES}
        rows.append(
            {
                "operation": same[0]["operation"],
                "ratio": {
                    key: {"median": statistics.median(v), "low": v[0], "high": v[-1]}
                    for key, v in ratios.items()
                },
            }
        )
    return rows


def render_spread(title: str, rows: Sequence[dict[str, Any]], runs: int) -> str:
    """A table of :func:`spread`: per figure, the ratio's median [lowest-highest]."""
    head = (
        f"{title + f', {runs} runs':<32}"
        + "".join(f"{name:>22}" for name in ("client p50", "Redis CPU", "Redis out"))
        + f"\n{'':<32}"
        + f"{'median [range]':>22}" * 3
    )
    lines = [head]
    for row in rows:
        cells = []
        for key in FIGURES:
            r = row["ratio"][key]
            cells.append(f"{r['median']:.2f}x [{r['low']:.2f}-{r['high']:.2f}]".rjust(22))
        lines.append(f"{row['operation']:<32}" + "".join(cells))
    return "\n".join(lines)


async def count_instructions(quick: bool) -> None:
    """The per-operation table in the server's instructions, under callgrind."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("the instruction count needs valgrind (callgrind) on PATH")
    with tempfile.TemporaryDirectory(prefix="ctxbench-callgrind-") as directory:
        out = Path(directory) / "callgrind.out"
        # Counted: what the server does for its clients (reading and running their
        # commands, writing the replies), not its timer (expiry, stats, rehashing),
        # whose share of a phase would follow valgrind's slowness, not the phase.
        wrapper = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            "--collect-atstart=no",
            "--toggle-collect=readQueryFromClient",
            "--toggle-collect=writeToClient",
            f"--callgrind-out-file={out}",
        ]
        with private_redis(SHIPPED_CONF, wrapper=wrapper) as (url, note):
            if url is None:
                raise SystemExit(f"the instruction count needs a private Redis 7: {note}")
            await deployed(url)
            raw = Redis.from_url(url)
            pid = int((await raw.info("server"))["process_id"])
            await raw.aclose()
            meter = Instructions(pid, out)
            # The activity index is refreshed at most once a second per session and
            # process: under valgrind's slowness every append would pay for it.
            rows = await operations(
                url,
                OPS_LENGTH,
                INSTRUCTION_SESSIONS,
                2 if quick else 10,
                OPS_SIZES[0],
                meter,
                index_interval=3600.0,
            )
            one_at_a_time = await generation(
                url, INSTRUCTION_SESSIONS, OPS_SIZES[0], meter, index_interval=3600.0
            )
    title = f"per op ({OPS_LENGTH:,} x {OPS_SIZES[0]:,} B)"
    print(f"\n{title:<28}{'redis-server instructions (thousands)':>40}")
    print(f"{'':<28}{'plain':>12}{'ctx':>12}{'ratio':>12}")
    for row in [*rows, *one_at_a_time]:
        plain, ctx = row["plain"]["redis_kinstr"], row["ctxstore"]["redis_kinstr"]
        print(f"{row['operation']:<28}{plain:>12.1f}{ctx:>12.1f}{ctx / plain:>11.2f}x")
    INSTRUCTION_RESULTS.parent.mkdir(parents=True, exist_ok=True)
    INSTRUCTION_RESULTS.write_text(
        json.dumps({"operations": rows, "one_at_a_time": one_at_a_time}, indent=2) + "\n"
    )
    print(f"\nwritten to {INSTRUCTION_RESULTS}")


def main(argv: Sequence[str] | None = None) -> None:
    """Run the turn benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer turns: a smoke run")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="the per-operation table in redis-server instructions, under callgrind",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        metavar="N",
        help="only the per-operation and one-at-a-time tables, N times: medians and ranges",
    )
    args = parser.parse_args(argv)
    if args.repeat is not None and args.repeat < 1:
        parser.error("--repeat takes a number of runs, 1 or more")
    if args.repeat:
        asyncio.run(repeat(args.repeat))
    else:
        asyncio.run(count_instructions(args.quick) if args.instructions else main_async(args.quick))


if __name__ == "__main__":
    main()
