"""The demo's conversations: an agent helps an on-call engineer move a service's database.

Each session is one such conversation (:func:`story`). The engineer states
the change ticket and the maintenance window in the first message; the
agent sizes up the old Postgres primary with parallel tool calls (a config
file, SQL, logs), pulls a day of its connection log (a large CSV, in which
two rows name a client that the agent's list of clients then leaves out),
takes a correction of the target's endpoint, sets up logical replication,
looks into a slow query, drafts the cutover runbook, rehearses it on
staging, runs it in production and checks the service after. The last
question, a page about that forgotten client, is :attr:`Story.question`:
the demo asks it itself once the pods are done, and answers it through
recall.

The messages are in OpenAI Chat format; every tool result follows the
assistant message that called it. What the tools answer is in
:mod:`ctxstore._cli.demo_world`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ctxstore._cli import demo_world as tools
from ctxstore._cli.demo_world import NEW_HOST, Call, World

__all__ = ["SERVICES", "Step", "Story", "Turn", "session_name", "story"]

SERVICES = ("billing-api", "ledger-sync", "invoice-worker", "payments-gateway", "refunds-api")
"""The services the sessions move, in session order (with a suffix past the fifth)."""

SYSTEM = (
    "You are an SRE assistant pairing with the on-call engineer at Northwind Payments. "
    "Tools: read_file (the infra repository), run_query (SQL on a database host; anything "
    "that writes needs the engineer's go-ahead), grep_logs (service and host logs), "
    "query_metrics (Prometheus) and run_command (a shell on the bastion, staging only "
    "unless told otherwise). Say what you are about to do, run independent checks in "
    "parallel, and never change production outside an approved change window."
)


@dataclass(frozen=True)
class Step:
    """One model call's output: an assistant message, then the results of the tools it called."""

    assistant: dict[str, Any]
    results: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Turn:
    """What one request to the agent appends: the user's message, then each model call's step.

    Attributes:
        user: The engineer's message.
        steps: The agent's steps; a pod reads a view before each (its model call).
        opening: Messages before ``user`` (the system prompt, in the first turn).
    """

    user: dict[str, Any]
    steps: tuple[Step, ...]
    opening: tuple[dict[str, Any], ...] = ()

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The turn's messages, in the order they are appended."""
        out = [*self.opening, self.user]
        for step in self.steps:
            out += [step.assistant, *step.results]
        return out


@dataclass(frozen=True)
class Story:
    """One on-call conversation.

    Attributes:
        session: The session it is stored in.
        world: The service, its databases and the client nobody listed.
        turns: What the pods play, in order.
        question: The engineer's last message: a page about that client.
        answer: The agent's answer, once recall has found the client's rows.
    """

    session: str
    world: World
    turns: tuple[Turn, ...]
    question: dict[str, Any]
    answer: str


def session_name(index: int) -> str:
    """The session of the ``index``-th conversation: the service's name."""
    base = SERVICES[index % len(SERVICES)]
    return base if index < len(SERVICES) else f"{base}-{index // len(SERVICES) + 1}"


def story(index: int, seed: int) -> Story:
    """The ``index``-th conversation of a run seeded with ``seed`` (the same every time)."""
    w = World(SERVICES[index % len(SERVICES)], f"ctxstore-demo:{seed}:{index}")
    turns = (
        _picture(w),
        _replication(w),
        _clients(w),
        _correction(w),
        _replicate(w),
        _progress(w),
        _slow_query(w),
        _runbook(w),
        _rehearsal(w),
        _fix(w),
        _cutover(w),
        _after(w),
        _watch(w),
        _cleanup(w),
    )
    question = _user(
        f"Paged: the {w.team} team's nightly job failed at {w.came[:5]} with FATAL: role "
        f'"{w.user}" is not permitted to log in, on {w.old}. What is that? It was not on our list.'
    )
    answer = (
        f"It is {w.app}: the connection log I pulled earlier has it logging in as {w.user} "
        f"from {w.address} at {w.came} UTC and leaving at {w.left}, so it runs every night, "
        "inside the window. I left it out when I listed the clients. The fix: create the "
        f"{w.user} role on {NEW_HOST}, point the job's DSN there and re-run it; I have "
        "added it to the runbook's list of clients."
    )
    return Story(session_name(index), w, turns, question, answer)


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _say(text: str) -> Step:
    return Step({"role": "assistant", "content": text})


def _call(w: World, text: str, *calls: Call) -> Step:
    """An assistant message calling tools (in parallel, when more than one), and their results."""
    made = [
        (
            {
                "id": w.call_id(),
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            },
            result,
        )
        for name, args, result in calls
    ]
    assistant = {"role": "assistant", "content": text, "tool_calls": [call for call, _ in made]}
    results = tuple(
        {"role": "tool", "tool_call_id": call["id"], "content": result} for call, result in made
    )
    return Step(assistant, results)


def _picture(w: World) -> Turn:
    return Turn(
        _user(
            f"Hi, I'm on call this week and I've been handed {w.ticket}: move {w.service} off the "
            f"old Postgres 12 primary, {w.old}, onto the new Postgres 16 cluster. The maintenance "
            f"window is {w.window}; nothing touches production outside it. Can you start by "
            "getting a picture of what we're dealing with?"
        ),
        (
            _call(
                w,
                "I'll read the service's database settings, size up the database and look at "
                "the last day of errors, in parallel.",
                tools.values_file(w),
                tools.table_sizes(w),
                tools.errors(w),
            ),
            _say(
                f"Here is the picture:\n- The {w.db} database on {w.old} is about {w.total_gb} GB; "
                f"invoice_lines alone is {w.lines_gb} GB ({w.lines_rows / 1e9:.1f} billion rows), "
                f"then invoices ({w.invoices_gb} GB) and payments ({w.payments_gb} GB).\n"
                f"- {w.service} reaches it through pgbouncer in transaction mode, "
                f"{w.pool} server connections.\n- The errors are the nightly reconcile batch "
                "hitting the 30 s statement timeout around 01:30, and a burst of 'remaining "
                "connection slots are reserved' at 09:00: the old primary allows only 200 "
                "connections.\nAt this size a dump and restore will not fit in the window, so "
                "I suggest logical replication: copy in the background now, keep it in sync, "
                "and switch connections in the window. Shall I check that the old primary is "
                "ready for it?"
            ),
        ),
        opening=({"role": "system", "content": SYSTEM},),
    )


def _replication(w: World) -> Turn:
    return Turn(
        _user(f"Yes, logical replication. Check what we'd need on {w.old}."),
        (
            _call(
                w,
                "Checking the replication settings and slots, which tables lack a primary key "
                "(logical replication needs one for updates and deletes), and our runbook.",
                tools.slots(w),
                tools.keyless_tables(w),
                tools.runbook_file(),
            ),
            _say(
                "Good news first: wal_level is already logical, so no restart. Two things to "
                f"sort out:\n1. An inactive logical slot, debezium_cdc, holds {w.slot_gb} GB of "
                f"WAL on {w.old}. It looks left over from the retired CDC pipeline; if nobody "
                "owns it, drop it, or the disk fills up before the window.\n2. audit_events_2019 "
                "and tmp_import_rows have no primary key. I suggest we leave both out of the "
                "publication, copy audit_events_2019 with pg_dump in the window (9 GB, read-only "
                "since 2020) and skip tmp_import_rows.\nThe runbook also reminds us that "
                "sequences are not replicated: we set them on the new side at the cutover."
            ),
        ),
    )


def _clients(w: World) -> Turn:
    return Turn(
        _user(
            "The data team confirmed debezium_cdc is dead; I dropped it. Before we plan the "
            f"cutover I want every client that connects to {w.old}: last time we moved a "
            "database, a cron job nobody knew about broke. Can you pull the last day's "
            "connection log?"
        ),
        (
            _call(
                w,
                f"Pulling the last 24 hours of the connection log from {w.old}, and the live "
                "sessions, in parallel.",
                tools.connection_log(w),
                tools.live_sessions(w),
            ),
            _say(
                f"From the log and the live sessions, these connect to {w.db}:\n"
                f"- {w.service} through pgbouncer (10.4.7.10-12), user {w.db}: almost all of "
                "the day.\n- invoice-reconcile, the nightly cron on the batch hosts "
                "(10.4.8.14-17), user reconcile, 01:30 to 02:15.\n- walreceiver: replica_02's "
                "streaming replication (10.4.6.20).\n- datadog-agent (10.4.5.9), every half "
                f"hour.\nSo three DSNs move ({w.service}, invoice-reconcile, datadog) and "
                "replica_02 is retired after the cutover."
            ),
        ),
    )


def _correction(w: World) -> Turn:
    return Turn(
        _user(
            "One correction before we go on: the new cluster's write endpoint is "
            f"{NEW_HOST}, not pg-main.db.internal as the ticket says. The plain name points "
            "at the read pool. Can you check the new side is ready?"
        ),
        (
            _call(
                w,
                f"Noted: {NEW_HOST}. Checking its version and role, and what exists there.",
                tools.new_side(),
                tools.new_roles(w),
            ),
            _say(
                f"{NEW_HOST} is a primary (not in recovery) running PostgreSQL 16.3 with "
                f"max_connections 800. The {w.db} database exists and is empty; the roles "
                f"{w.db} and reconcile exist, datadog does not: creating it goes into the plan."
            ),
        ),
    )


def _replicate(w: World) -> Turn:
    return Turn(
        _user(
            "Go ahead and set up the replication: the schema, a publication on the old side, "
            "a subscription on the new one. It only reads from the old primary, so it's fine "
            "before the window."
        ),
        (
            _call(
                w,
                "Copying the schema first: logical replication does not copy DDL.",
                tools.schema_copy(w),
            ),
            _call(
                w,
                f"Schema in place. Creating the publication on {w.old}, without the two tables "
                "that have no primary key.",
                tools.publication(w),
            ),
            _call(
                w,
                f"And the subscription on {NEW_HOST}.",
                tools.subscription(w),
            ),
            _say(
                f"Replication is running: publication {w.db}_migration on {w.old} (34 tables), "
                f"subscription on {NEW_HOST}. The initial copy has started; invoice_lines will "
                "take the longest."
            ),
        ),
    )


def _progress(w: World) -> Turn:
    return Turn(
        _user("How's the initial copy doing?"),
        (
            _call(
                w,
                "Checking each table's sync state on the new side and the copy's progress.",
                tools.sync_states(w),
                tools.copy_progress(w),
            ),
            _say(
                "31 of 34 tables are synchronized and streaming. invoice_lines is "
                f"{w.copied}% copied; invoices and payments are nearly done. At about 140 MB/s "
                "invoice_lines needs roughly another hour: nothing to do until then."
            ),
        ),
    )


def _slow_query(w: World) -> Turn:
    return Turn(
        _user(
            "While we wait: the reconcile batch times out every night. Will that follow us "
            "to the new cluster?"
        ),
        (
            _call(
                w,
                "Looking at the batch's query plan on the old primary.",
                tools.reconcile_plan(w),
            ),
            _call(
                w,
                "It reads the whole table: 4.1 million buffers from disk, 30 s. A partial index "
                "on the pending rows fixes that; I'll build it on the new side, where it costs "
                "production nothing.",
                tools.partial_index(),
            ),
            _say(
                "Yes, it would have followed us: the batch scans all of invoice_lines for "
                "pending rows. invoice_lines_pending_idx now exists on the new side, so after "
                "the cutover the batch reads a few thousand index entries instead of the table."
            ),
        ),
    )


def _runbook(w: World) -> Turn:
    plan = (
        f"Cutover runbook for {w.ticket}, times from the start of the window:\n"
        "- T+0: suspend the invoice-reconcile CronJob; `PAUSE` in pgbouncer (writes stop).\n"
        f"- T+5 min: wait until the subscription's lag is 0 on {NEW_HOST}.\n"
        "- T+10 min: setval every sequence on the new side to the old side's value.\n"
        f"- T+15 min: pgbouncer's {w.db} host becomes {NEW_HOST}; reload; `RESUME`.\n"
        "- T+15 min: update the reconcile-db and datadog secrets; create the datadog role.\n"
        "- T+18 min: on the old side, take LOGIN away from the application roles, so "
        "anything still pointing there fails loudly.\n"
        "- T+20 min: pg_dump audit_events_2019 into the new side (9 GB, about 20 min).\n"
        "- T+25 min: smoke tests: create and pay a test invoice, read it back.\n"
        "- T+45 min: the last moment to roll back (pgbouncer back to the old host): after "
        "that, writes on the new side would be lost.\n"
        "- After the window: drop the subscription, then the publication and its slot; "
        "retire replica_02."
    )
    return Turn(
        _user(
            "Draft the cutover runbook for the window, step by step with times. Keep a way back."
        ),
        (
            _call(
                w,
                "Reading the pgbouncer config and the reconcile CronJob: the runbook changes both.",
                tools.pgbouncer_file(w),
                tools.cron_file(),
            ),
            _say(plan),
        ),
    )


def _rehearsal(w: World) -> Turn:
    return Turn(
        _user("Let's rehearse it on staging first."),
        (
            _call(
                w,
                "Running the cutover script against staging, as the runbook has it.",
                tools.rehearsal(w),
            ),
            _say(
                "The rehearsal went through in 23 minutes, with writes paused for 4 min 12 s. "
                "Two smoke tests failed: the script set the sequences before the last writes "
                "had replicated, so three were behind and the first inserts hit duplicate keys. "
                "The fix is to run setval after the lag check, not before it."
            ),
        ),
    )


def _fix(w: World) -> Turn:
    return Turn(
        _user("Do it, and re-run the sequence check on staging."),
        (
            _call(
                w,
                "Moving set_sequences after the lag check, and comparing the sequences again.",
                tools.script_diff(),
                tools.sequence_check(),
            ),
            _say(
                "Fixed: set_sequences now runs after wait_for_lag, and on staging the three "
                "sequences match the old side. The runbook stands, with that order."
            ),
        ),
    )


def _cutover(w: World) -> Turn:
    return Turn(
        _user(
            f"It's {w.at(0)} and the window is open. Go: run the cutover in production, step "
            "by step, and stop if anything looks off."
        ),
        (
            _call(
                w,
                "Step 1: stopping writes. Suspending the reconcile CronJob and pausing pgbouncer.",
                *tools.stop_writes(w),
            ),
            _call(
                w,
                "Writes are stopped. Step 2: the replication lag.",
                tools.lag(w),
            ),
            _call(
                w,
                "Lag is 0. Running the rest of the script from the lag check.",
                tools.cutover(w),
            ),
            _call(
                w,
                "Switched. Smoke tests against production.",
                tools.smoke(w),
            ),
            _say(
                f"The cutover is done: {w.service} writes to {NEW_HOST} since {w.at(8)}, after "
                "3 min 48 s of paused writes; all 12 smoke tests pass. The application roles "
                "can no longer log in on the old side, and audit_events_2019 is copying in the "
                f"background. We can still roll back until {w.at(45)}."
            ),
        ),
    )


def _after(w: World) -> Turn:
    return Turn(
        _user("Nice. Keep an eye on it: anything odd in the service's logs since the switch?"),
        (
            _call(
                w,
                "Reading the service's log since the switch, and counting the invoices written "
                "on the new side.",
                tools.service_log(w),
                tools.recent_invoices(w),
            ),
            _say(
                "Healthy: 1,412 invoices written on the new side in 15 minutes, requests at "
                "their usual latency, and two slow queries on invoice_lines while the cache "
                "warms up. Nothing points at the old primary any more."
            ),
        ),
    )


def _watch(w: World) -> Turn:
    checks = [
        _call(w, f"Check {check + 1} of 6, at {w.at(25 + 5 * check)}.", *tools.health(w, check))
        for check in range(6)
    ]
    return Turn(
        _user(
            "I'll grab a coffee. Watch it for the next half hour: every five minutes, check the "
            "error rate, latency and the audit copy, and tell me only if something is off."
        ),
        (
            *checks,
            _say(
                "Half an hour in, nothing is off: 5xx under 0.1% at every check, p99 between "
                "150 and 210 ms (as before the move), and audit_events_2019 is fully copied."
            ),
        ),
    )


def _cleanup(w: World) -> Turn:
    return Turn(
        _user("Good. Close it out per the runbook, then I'll update the ticket."),
        (
            _call(
                w,
                "Dropping the subscription first (it drops its slot on the old side), then "
                "the publication, and scaling replica_02 to zero.",
                *tools.cleanup(w),
            ),
            _say(
                f"Closed out: the subscription and publication are gone, no slot is left on "
                f"{w.old}, and replica_02 is scaled to zero (its volume kept for a week). For "
                f"{w.ticket}: cutover at {w.at(8)}, 3 min 48 s of paused writes, no errors since."
            ),
        ),
    )
