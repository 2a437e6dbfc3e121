"""The world the demo's agent works in: what its tools answer about the service it moves.

A :class:`World` is one service and its databases, drawn from a seed: the old
Postgres 12 primary, the new cluster's write endpoint, sizes, and one client
of the old primary that nobody listed (it shows in one row pair of a day's
connection log). Each function is one tool call the agent makes, as
``(tool, arguments, result)``, its result as a real tool prints it: config
files, SQL results, logs, a diff.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NEW_HOST", "Call", "World"]

NEW_HOST = "pg-main-rw.db.internal"
"""The new cluster's write endpoint (the ticket names the read pool's, pg-main.db.internal)."""
_WINDOWS = ("Saturday 02:00-04:00 UTC", "Sunday 01:30-03:30 UTC", "Saturday 01:00-03:30 UTC")
"""Each holds 03:10-03:30 UTC, when the client nobody listed runs (after the cleanup)."""
_CLIENTS = (
    ("finance", "fin-nightly-export", "fin_ro"),
    ("analytics", "looker-pdt-refresh", "bi_reader"),
    ("support", "zendesk-sync", "support_ro"),
)
"""Who owns the client nobody listed, its application name and its database user."""
DAY = "2025-06-12"
"""A Thursday: the connection log the agent pulls ends at 09:00 that morning."""
_EVE = "2025-06-11"

Call = tuple[str, dict[str, Any], str]
"""A tool call: the tool's name, its arguments, and what it answered."""


@dataclass
class World:
    """One service's databases, as the tools see them.

    Attributes:
        service: The service whose database moves (also its namespace).
        seed: What the names and numbers are drawn from.
        db: Its database, and the database user of the service.
        old: The old primary's host name.
        ticket, window: The change ticket and the maintenance window.
        team, app, user, address: The client nobody listed.
    """

    service: str
    seed: str
    rng: random.Random = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rng = self.rng = random.Random(self.seed)
        self.db = self.service.split("-")[0]
        self.old = f"pg-legacy-0{rng.randint(1, 4)}"
        self.ticket = f"CHG-{rng.randint(40_000, 49_999)}"
        self.window = rng.choice(_WINDOWS)
        self.team, self.app, self.user = rng.choice(_CLIENTS)
        self.address = f"10.4.9.{rng.randint(20, 60)}"
        self.lines_gb = rng.randint(80, 120)
        self.lines_rows = rng.randint(900, 1_400) * 1_000_000 + rng.randint(0, 999_999)
        self.invoices_gb = rng.randint(25, 40)
        self.payments_gb = rng.randint(15, 30)
        self.total_gb = self.lines_gb + self.invoices_gb + self.payments_gb + 17
        self.slot_gb = rng.randint(30, 60)
        self.pool = rng.choice((30, 40, 50))
        self.copied = rng.randint(55, 70)
        self.opens = int(self.window.split()[1][:2]) * 60 + int(self.window.split()[1][3:5])
        start = 3 * 3600 + rng.randint(10, 19) * 60 + rng.randint(0, 59)
        self.stay = rng.randint(300, 560)
        self.came, self.left = _clock(start), _clock(start + self.stay)

    @property
    def night(self) -> str:
        """The date of the cutover: the window's day (Saturday 14 or Sunday 15 June)."""
        return "2025-06-14" if self.window.startswith("Saturday") else "2025-06-15"

    def at(self, minutes: int) -> str:
        """The time of day ``minutes`` after the window opens (HH:MM)."""
        return _clock(60 * (self.opens + minutes))[:5]

    def call_id(self) -> str:
        """A fresh tool call id, as a provider makes them."""
        return "call_" + "".join(self.rng.choices(string.ascii_letters + string.digits, k=24))


def _clock(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    return f"{hours:02}:{rest // 60:02}:{rest % 60:02}"


def _sql(host: str, sql: str, result: str) -> Call:
    return ("run_query", {"host": host, "sql": sql}, result)


def _shell(cmd: str, result: str) -> Call:
    return ("run_command", {"cmd": cmd}, result)


def values_file(w: World) -> Call:
    """The service's Helm values."""
    return ("read_file", {"path": f"deploy/{w.service}/values.yaml"}, f"""\
# deploy/{w.service}/values.yaml
image:
  repository: registry.northwind.internal/{w.service}
  tag: "2025.06.2"
replicas: 6
env:
  DATABASE_URL: postgres://{w.db}@pgbouncer-{w.service}.{w.db}.svc:6432/{w.db}
  DATABASE_STATEMENT_TIMEOUT: 30s
  RECONCILE_BATCH_SIZE: "5000"
  OTEL_EXPORTER_OTLP_ENDPOINT: http://otel-collector.observability.svc:4317
pgbouncer:
  enabled: true
  pool_mode: transaction
  default_pool_size: {w.pool}
  max_client_conn: 2000
  server:
    host: {w.old}.db.internal
    port: 5432
resources:
  requests: {{cpu: 500m, memory: 768Mi}}
  limits: {{memory: 1536Mi}}
""")  # fmt: skip


def table_sizes(w: World) -> Call:
    """The old primary's largest tables."""
    rng = w.rng
    sql = (
        "SELECT relname, pg_size_pretty(pg_total_relation_size(relid)) AS total, n_live_tup "
        "FROM pg_stat_user_tables ORDER BY pg_total_relation_size(relid) DESC LIMIT 8"
    )
    return _sql(w.old, sql, f"""\
     relname       | total  |  n_live_tup
-------------------+--------+--------------
 invoice_lines     | {w.lines_gb} GB | {w.lines_rows:>12,}
 invoices          | {w.invoices_gb} GB  |  {rng.randint(150_000_000, 260_000_000):>12,}
 payments          | {w.payments_gb} GB  |  {rng.randint(90_000_000, 180_000_000):>12,}
 audit_events_2019 | 9 GB   |    61,220,913
 customers         | 4 GB   |     8,112,560
 webhooks_outbox   | 2 GB   |     3,904,112
 tmp_import_rows   | 780 MB |     2,000,001
 schema_migrations | 48 kB  |           412
(8 rows)""")  # fmt: skip


def errors(w: World) -> Call:
    """The service's errors of the last day."""
    pod = f"{w.service}-7d9f"
    lines = [
        f"{_EVE}T09:00:{10 + n}Z {pod}-{n % 6} FATAL remaining connection slots are reserved "
        "for non-replication superuser connections"
        for n in range(6)
    ]
    lines += [
        f"{_EVE}T11:42:5{n}Z {pod}-{n} ERROR duplicate key value violates unique constraint "
        '"payments_idempotency_key_key" (retried request, handled)'
        for n in range(3)
    ]
    lines += [
        f"{DAY}T01:{31 + 2 * n}:{7 * n % 60:02}Z {pod}-{n % 6} ERROR canceling statement due "
        f"to statement timeout (reconcile batch {1800 + 7 * n}, invoice_lines)"
        for n in range(12)
    ]
    arguments = {"service": w.service, "pattern": "ERROR|FATAL", "since": "24h"}
    return ("grep_logs", arguments, "\n".join([*lines, "21 matching lines in 24 h"]))


def slots(w: World) -> Call:
    """wal_level, the slot limit and the replication slots of the old primary."""
    sql = (
        "SHOW wal_level; SHOW max_replication_slots; SELECT slot_name, slot_type, active, "
        "pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)) AS retained "
        "FROM pg_replication_slots"
    )
    return _sql(w.old, sql, f"""\
 wal_level
-----------
 logical

 max_replication_slots
-----------------------
 10

  slot_name   | slot_type | active | retained
--------------+-----------+--------+----------
 replica_02   | physical  | t      | 312 MB
 debezium_cdc | logical   | f      | {w.slot_gb} GB
(2 rows)""")  # fmt: skip


def keyless_tables(w: World) -> Call:
    """The old primary's tables without a primary key."""
    sql = (
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind = 'r' AND n.nspname = 'public' AND NOT EXISTS (SELECT 1 FROM "
        "pg_constraint p WHERE p.conrelid = c.oid AND p.contype = 'p')"
    )
    rows = "      relname\n-------------------\n audit_events_2019\n tmp_import_rows\n(2 rows)"
    return _sql(w.old, sql, rows)


_RUNBOOK = """\
# Logical replication between Postgres clusters: minutes of write downtime, not hours

## Before
1. `wal_level = logical` on the source (a restart if it is not).
2. Every replicated table needs a primary key or `REPLICA IDENTITY FULL`; updates and
   deletes on a table without either fail on the source once it is published.
3. Copy the schema first: logical replication does not replicate DDL. Freeze
   migrations for the service until the cutover is done.
4. Check free disk on the source: a slot that stops being read retains WAL forever.

## Set up
    CREATE PUBLICATION <db>_migration FOR TABLE ...;        -- source
    CREATE SUBSCRIPTION <db>_migration CONNECTION '...'
        PUBLICATION <db>_migration;                         -- target
Watch `pg_subscription_rel` until every table is `r` (ready).

## Cutover
1. Stop writes (pause pgbouncer, suspend the crons).
2. Wait for the subscription's lag to reach 0.
3. Sequences are NOT replicated: `setval` each one on the target to the source's
   value, after the last write.
4. Point the clients at the target; resume.
5. On the source, take LOGIN away from the application roles: a client still
   pointing there then fails loudly instead of writing to the old database.
6. Drop the subscription, then the publication and its slot on the source.

## Rollback
Until writes resume on the target, point the clients back at the source. After
that, writes made on the target are lost unless replicated back: decide before
you resume.
"""


def runbook_file() -> Call:
    """The team's logical replication runbook."""
    return ("read_file", {"path": "runbooks/postgres/logical-replication.md"}, _RUNBOOK)


def connection_log(w: World) -> Call:
    """A day of the old primary's connection log: 167 rows, two of the client nobody listed."""
    rng = w.rng
    rows: list[tuple[str, str, str, str, str]] = []
    monitor = ("10.4.5.9", "datadog-agent", "datadog")
    for slot in range(48):  # the monitoring agent, every half hour
        hour, minute = divmod(9 * 60 + 30 * slot, 60)
        at, second = f"{hour % 24:02}:{minute:02}:", rng.randint(0, 58)
        rows.append((f"{at}{second:02}", *monitor, "connection authorized"))
        rows.append((f"{at}{second + 1:02}", *monitor, "disconnection: session time 0:00:00.9"))
    for _ in range(56):  # pgbouncer's server connections coming and going
        at = f"{rng.randrange(24):02}:{rng.randint(0, 59):02}:{rng.randint(0, 59):02}"
        event = rng.choice(("connection authorized", "disconnection: session time 1:12:04.2"))
        rows.append((at, f"10.4.7.{rng.randint(10, 12)}", w.service, w.db, event))
    cron = ("invoice-reconcile", "reconcile")
    for worker in range(4):  # the nightly reconcile batch
        address = f"10.4.8.{14 + worker}"
        rows.append((f"01:30:0{worker}", address, *cron, "connection authorized"))
        rows.append(
            (f"02:1{worker}:4{worker}", address, *cron, "disconnection: session time 0:40:41.3")
        )
    replica = ("10.4.6.20", "walreceiver", "replicator", "replication connection authorized")
    rows.append(("04:12:09", *replica))
    minutes, seconds = divmod(w.stay, 60)
    stayed = f"disconnection: session time 0:{minutes:02}:{seconds:02}.4"
    rows.append((w.came, w.address, w.app, w.user, "connection authorized"))
    rows.append((w.left, w.address, w.app, w.user, stayed))
    lines = [
        f"# /var/log/postgresql/connections.csv on {w.old}, {len(rows)} rows, "
        f"{_EVE} 09:00 to {DAY} 09:00 UTC",
        "log_time,client_addr,application_name,user_name,database_name,message",
    ]
    # The log starts at 09:00 yesterday: an earlier time of day is today's.
    for at, address, app, user, event in sorted(rows, key=lambda r: (r[0] < "09:00", r[0])):
        day = DAY if at < "09:00" else _EVE
        lines.append(f"{day}T{at}Z,{address},{app},{user},{w.db},{event}")
    arguments = {"host": w.old, "file": "/var/log/postgresql/connections.csv", "since": "24h"}
    return ("grep_logs", arguments, "\n".join(lines))


def live_sessions(w: World) -> Call:
    """The old primary's live sessions, by client."""
    sql = (
        "SELECT application_name, client_addr, usename, count(*) FROM pg_stat_activity "
        f"WHERE datname = '{w.db}' GROUP BY 1, 2, 3 ORDER BY 4 DESC"
    )
    third = w.pool // 3
    return _sql(w.old, sql, f"""\
  application_name  | client_addr |  usename   | count
--------------------+-------------+------------+-------
 {w.service:<18} | 10.4.7.10   | {w.db:<10} |    {third}
 {w.service:<18} | 10.4.7.11   | {w.db:<10} |    {third}
 {w.service:<18} | 10.4.7.12   | {w.db:<10} |    {w.pool - 2 * third}
 walreceiver        | 10.4.6.20   | replicator |     1
 datadog-agent      | 10.4.5.9    | datadog    |     1
(5 rows)""")  # fmt: skip


def new_side() -> Call:
    """The new endpoint's version, connection limit and role."""
    sql = "SELECT version(); SHOW max_connections; SELECT pg_is_in_recovery()"
    return _sql(NEW_HOST, sql, """\
                        version
-------------------------------------------------------------------------
 PostgreSQL 16.3 on x86_64-pc-linux-gnu, compiled by gcc 12.2.0, 64-bit

 max_connections
-----------------
 800

 pg_is_in_recovery
-------------------
 f""")  # fmt: skip


def new_roles(w: World) -> Call:
    """The new side's databases, and which of the clients' roles it has."""
    sql = (
        "SELECT datname FROM pg_database WHERE NOT datistemplate; SELECT rolname FROM "
        f"pg_roles WHERE rolname IN ('{w.db}', 'reconcile', 'datadog')"
    )
    found = (
        f"  datname\n-----------\n {w.db}\n postgres\n\n  rolname\n-----------\n {w.db}\n reconcile"
    )
    return _sql(NEW_HOST, sql, found)


def schema_copy(w: World) -> Call:
    """The schema, dumped from the old side into the new one."""
    lines = ["SET"] * 3 + ["CREATE TABLE"] * 36 + ["ALTER TABLE"] * 12 + ["CREATE INDEX"] * 71
    lines += ["CREATE SEQUENCE"] * 9 + ["pg_dump: 38 tables, 71 indexes, 9 sequences; 0 errors"]
    command = f"pg_dump --schema-only -h {w.old}.db.internal {w.db} | psql -h {NEW_HOST} {w.db}"
    return _shell(command, "\n".join(lines))


def publication(w: World) -> Call:
    """The publication, on the old side."""
    sql = (
        f"CREATE PUBLICATION {w.db}_migration FOR TABLE invoice_lines, invoices, payments, "
        "customers, webhooks_outbox, ... (34 tables)"
    )
    return _sql(w.old, sql, "CREATE PUBLICATION")


def subscription(w: World) -> Call:
    """The subscription, on the new side."""
    sql = (
        f"CREATE SUBSCRIPTION {w.db}_migration CONNECTION 'host={w.old}.db.internal "
        f"dbname={w.db} user=replicator' PUBLICATION {w.db}_migration"
    )
    notice = f'NOTICE:  created replication slot "{w.db}_migration" on publisher\n'
    return _sql(NEW_HOST, sql, notice + "CREATE SUBSCRIPTION")


def sync_states(w: World) -> Call:
    """Each replicated table's sync state on the new side."""
    names = ["invoice_lines", "invoices", "payments", "customers", "webhooks_outbox"]
    names += [f"{w.db}_{kind}" for kind in ("plans", "tax_rates", "credit_notes", "disputes")]
    names += [f"ref_{n:02}" for n in range(25)]
    rows = "\n".join(f" {name:<20} | {'d' if n < 3 else 'r'}" for n, name in enumerate(names))
    head = "       srrelid        | srsubstate\n----------------------+-----------\n"
    sql = "SELECT srrelid::regclass, srsubstate FROM pg_subscription_rel ORDER BY 2, 1"
    return _sql(NEW_HOST, sql, f"{head}{rows}\n(34 rows)")


def copy_progress(w: World) -> Call:
    """The initial copy's progress, table by table."""
    sql = "SELECT relid::regclass, bytes_processed, bytes_total FROM pg_stat_progress_copy"
    return _sql(NEW_HOST, sql, (
        " relid         | bytes_processed | bytes_total\n"
        f" invoice_lines | {w.copied * w.lines_gb // 100} GB | {w.lines_gb} GB\n"
        f" invoices      | {w.invoices_gb - 3} GB | {w.invoices_gb} GB\n"
        f" payments      | {w.payments_gb - 2} GB | {w.payments_gb} GB\n(3 rows)"
    ))  # fmt: skip


def reconcile_plan(w: World) -> Call:
    """EXPLAIN ANALYZE of the reconcile batch's query, on the old primary."""
    sql = (
        "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT * FROM invoice_lines l WHERE "
        "l.status = 'pending' AND l.reconciled_at IS NULL ORDER BY l.id LIMIT 5000"
    )
    return _sql(w.old, sql, f"""\
Limit (actual time=28412.118..29977.530 rows=5000 loops=1)
  ->  Seq Scan on invoice_lines l (actual time=28412.115..29976.902 rows=5000 loops=1)
        Filter: ((status = 'pending'::text) AND (reconciled_at IS NULL))
        Rows Removed by Filter: {w.lines_rows // 3:,}
        Buffers: shared hit=18234 read=4120992
Planning Time: 0.412 ms
JIT:
  Functions: 4
  Options: Inlining true, Optimization true, Expressions true, Deforming true
  Timing: Generation 0.611 ms, Inlining 12.2 ms, Optimization 41.8 ms, Emission 30.3 ms
Execution Time: 29981.204 ms""")  # fmt: skip


def partial_index() -> Call:
    """The index that lets the reconcile batch skip the table, built on the new side."""
    sql = (
        "CREATE INDEX CONCURRENTLY invoice_lines_pending_idx ON invoice_lines (id) "
        "WHERE status = 'pending' AND reconciled_at IS NULL"
    )
    return _sql(NEW_HOST, sql, "CREATE INDEX")


def pgbouncer_file(w: World) -> Call:
    """The service's pgbouncer config."""
    return ("read_file", {"path": f"deploy/{w.service}/pgbouncer.ini"}, f"""\
[databases]
{w.db} = host={w.old}.db.internal port=5432 dbname={w.db} pool_size={w.pool}

[pgbouncer]
listen_port = 6432
pool_mode = transaction
max_client_conn = 2000
server_reset_query = DISCARD ALL
admin_users = pgbouncer_admin""")  # fmt: skip


def cron_file() -> Call:
    """The reconcile batch's CronJob."""
    return ("read_file", {"path": "deploy/cron/invoice-reconcile.yaml"}, """\
apiVersion: batch/v1
kind: CronJob
metadata:
  name: invoice-reconcile
spec:
  schedule: "30 1 * * *"
  concurrencyPolicy: Forbid
  jobTemplate:
    spec:
      template:
        spec:
          containers:
            - name: reconcile
              env:
                - name: DATABASE_URL
                  valueFrom: {secretKeyRef: {name: reconcile-db, key: url}}""")  # fmt: skip


def rehearsal(w: World) -> Call:
    """The cutover script's run on staging: the sequences were set too early."""
    return _shell(f"./scripts/cutover.sh --env staging --service {w.service}", f"""\
cutover.sh --env staging --service {w.service} (dry run: no)
[00:00] cronjob.batch/invoice-reconcile suspended
[00:01] pgbouncer: PAUSE ok (118 client connections waiting)
[00:01] setval: 9 sequences set from the old side
[00:03] subscription lag 2.1 MB
[00:04] subscription lag 0 B
[00:05] pgbouncer: host switched, RELOAD ok, RESUME ok
[00:05] writes paused for 4 min 12 s
[00:06] smoke: POST /invoices -> 500 duplicate key value violates "invoices_pkey" (1040233)
[00:06] smoke: POST /invoices (retry) -> 201 created
[00:07] sequence behind on the new side: invoices_id_seq (-212)
[00:07] sequence behind on the new side: payments_id_seq (-97)
[00:07] sequence behind on the new side: webhooks_outbox_id_seq (-1,204)
[00:08] smoke: GET /invoices/1040245 -> 200
[00:08] smoke: POST /payments -> 500 duplicate key (id 880316)
[00:09] smoke tests: 10 passed, 2 failed
[00:09] old side: LOGIN revoked from application roles
[00:23] audit_events_2019 copied (pg_dump | psql, 9.1 GB)
[00:23] rehearsal finished: 2 failures""")  # fmt: skip


def script_diff() -> Call:
    """The fix: the sequences are set after the lag check."""
    return _shell("git diff scripts/cutover.sh", """\
--- a/scripts/cutover.sh
+++ b/scripts/cutover.sh
@@ -41,8 +41,8 @@ pause_writes
-set_sequences
 wait_for_lag 0
+set_sequences
 switch_pgbouncer "$NEW_HOST"
 resume_writes""")  # fmt: skip


def sequence_check() -> Call:
    """The sequences on staging's two sides, after the fix."""
    sql = "SELECT sequencename, old_value, new_value FROM cutover.sequence_check"
    return _sql("pg-main-rw.staging.internal", sql, """\
      sequencename       | old_value | new_value
-------------------------+-----------+-----------
 invoices_id_seq         |   1040245 |   1040245
 payments_id_seq         |    880412 |    880412
 webhooks_outbox_id_seq  |   3904530 |   3904530
(3 rows)""")  # fmt: skip


def stop_writes(w: World) -> tuple[Call, Call]:
    """Suspending the reconcile CronJob, and pausing pgbouncer."""
    patch = 'kubectl -n batch patch cronjob invoice-reconcile -p \'{"spec":{"suspend":true}}\''
    pause = f"psql -h pgbouncer-{w.service}.{w.db}.svc -p 6432 pgbouncer -c 'PAUSE {w.db}'"
    return _shell(patch, "cronjob.batch/invoice-reconcile patched"), _shell(pause, "PAUSE")


def lag(w: World) -> Call:
    """The subscription's position: caught up."""
    sql = "SELECT subname, received_lsn, latest_end_lsn, latest_end_time FROM pg_stat_subscription"
    return _sql(NEW_HOST, sql, f" {w.db}_migration | 3A/9F2C1B0 | 3A/9F2C1B0 | {w.at(4)}:12")


def cutover(w: World) -> Call:
    """The cutover script's run in production, from the lag check on."""
    command = f"./scripts/cutover.sh --env production --service {w.service} --from wait_for_lag"
    return _shell(command, f"""\
cutover.sh --env production --service {w.service} --from wait_for_lag
[00:00] subscription lag 0 B
[00:00] setval: 9 sequences set from the old side
[00:01] pgbouncer: host {w.old}.db.internal -> {NEW_HOST}, RELOAD ok
[00:01] pgbouncer: RESUME ok
[00:01] writes paused for 3 min 48 s
[00:02] secrets reconcile-db and datadog-db updated; role datadog created
[00:03] old side: LOGIN revoked from application roles
[00:03] audit_events_2019: copy started in the background""")  # fmt: skip


_SMOKE = (
    "POST /invoices", "GET /invoices/:id", "POST /payments", "GET /payments/:id",
    "POST /refunds", "GET /customers/:id", "POST /webhooks/replay", "GET /health/db",
    "reconcile --dry-run", "sequence check", "read-only user denied writes", "p99 < 250 ms",
)  # fmt: skip


def smoke(w: World) -> Call:
    """The smoke tests, against production."""
    lines = [*(f"ok {n} - {check}" for n, check in enumerate(_SMOKE, 1)), "12 passed"]
    return _shell(f"./scripts/smoke.sh --env production --service {w.service}", "\n".join(lines))


def service_log(w: World) -> Call:
    """The service's log since the switch: healthy, two slow queries."""
    rng = w.rng
    lines = []
    for n in range(36):
        route = rng.choice(("POST /invoices", "GET /invoices/:id", "POST /payments", "GET /health"))
        lines.append(
            f"{w.night}T{w.at(16 + n // 6)}:{n * 9 % 60:02}Z {w.service}-8c41-{n % 6} INFO {route} "
            f"{201 if route.startswith('POST') else 200} {rng.randint(12, 190)}ms"
        )
    slow = f"{w.service}-8c41-2 WARN slow query 1.4 s on invoice_lines (cache warming)"
    lines.insert(9, f"{w.night}T{w.at(17)}:41Z {slow}")
    lines.insert(22, f"{w.night}T{w.at(19)}:03Z {slow.replace('1.4', '1.1')}")
    lines.append(f"38 lines since {w.at(16)}")
    return ("grep_logs", {"service": w.service, "since": w.at(8)}, "\n".join(lines))


def recent_invoices(w: World) -> Call:
    """The invoices written on the new side in the last quarter hour."""
    sql = (
        "SELECT count(*), max(created_at) FROM invoices WHERE created_at > now() - "
        "interval '15 minutes'"
    )
    return _sql(NEW_HOST, sql, f" 1412 | {w.night} {w.at(22)}:48.201+00")


def health(w: World, check: int) -> tuple[Call, Call, Call]:
    """The ``check``-th look after the switch: the 5xx share, p99 latency, the audit copy."""
    of = f'{{service="{w.service}"'
    errors = (
        f'sum(rate(http_requests_total{of},code=~"5.."}}[5m])) / '
        f"sum(rate(http_requests_total{of}}}[5m]))"
    )
    p99 = (
        "histogram_quantile(0.99, sum by (le) "
        f"(rate(http_request_duration_seconds_bucket{of}}}[5m])))"
    )
    audit = (
        "SELECT relname, pg_size_pretty(pg_total_relation_size(relid)) FROM "
        "pg_stat_user_tables WHERE relname = 'audit_events_2019'"
    )
    copied = min(9.1, 1.6 * (check + 1))
    done = " (copy finished)" if copied >= 9.1 else ""
    return (
        ("query_metrics", {"query": errors},
         f"{of}}} {w.rng.randint(1, 6) / 10_000:.4f} @ {w.at(25 + 5 * check)}"),
        ("query_metrics", {"query": p99},
         f'{of},quantile="0.99"}} {w.rng.randint(150, 210) / 1000:.3f} s'),
        _sql(NEW_HOST, audit, f" audit_events_2019 | {copied:.1f} GB{done}"),
    )  # fmt: skip


def cleanup(w: World) -> tuple[Call, Call, Call]:
    """Dropping the subscription, then the publication, and scaling replica_02 to zero."""
    dropped = f'NOTICE:  dropped replication slot "{w.db}_migration" on publisher\n'
    slots = "SELECT slot_name FROM pg_replication_slots"
    return (
        _sql(NEW_HOST, f"DROP SUBSCRIPTION {w.db}_migration", dropped + "DROP SUBSCRIPTION"),
        _sql(w.old, f"DROP PUBLICATION {w.db}_migration; {slots}",
             "DROP PUBLICATION\n slot_name\n-----------\n(0 rows)"),
        _shell("kubectl -n db scale statefulset replica-02 --replicas=0",
               "statefulset.apps/replica-02 scaled"),
    )  # fmt: skip
