"""One settings object, read once, from ``CTXSTORE_*`` environment variables.

Nothing here reads the environment at import time: ``Settings()`` does, when
it is called.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from ctxstore._layout.keys import validate_id, validate_prefix
from ctxstore.errors import ConfigurationError

__all__ = ["SentinelAddress", "Settings", "check_redis_url", "describe_errors", "sentinel_address"]

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Seconds = Annotated[int, Field(gt=0, le=100 * 365 * 86_400)]  # up to a century


class Settings(BaseSettings):
    """Everything ctxstore can be configured with.

    Every field can be set from the environment as ``CTXSTORE_<NAME>``
    (``CTXSTORE_REDIS_URL``, ``CTXSTORE_KEY_PREFIX``...); dicts are given as
    JSON. ``Settings.from_url("redis://...")`` is the short form for code.

    Attributes:
        redis_url: The store's Redis. ``None``: the embedded Redis, whose
            data lives under ``data_dir``. The store reads RESP2 replies: a
            ``protocol=`` other than 2 in it is refused, and so is a URL
            redis-py would misread (:func:`check_redis_url`).
        data_dir: Where the embedded Redis keeps its data; ``None``: the
            user's data directory (``~/.local/share/ctxstore`` on Linux).
        redis_cluster: ``redis_url`` names a node of a Redis Cluster.
        replica_acks: Wait until this many replicas acknowledge each write
            (``WAIT``) before answering; ``ReplicationError`` if they do not
            within ``replica_ack_timeout_ms``. ``0``: answer at once (a
            failover can then lose the last writes).
        replica_ack_timeout_ms: How long a write waits for its replicas.
        script_mode: How the SDK runs its Lua scripts. ``auto`` (the default):
            by ``FCALL`` of this version's Functions library where it is loaded
            (``ctxstore functions load``, as the deploy's ``functions`` job
            does; the embedded Redis is given it by the SDK), which costs Redis
            less per call than ``EVALSHA``; where it is not, by ``EVALSHA``, and
            ``FCALL`` is tried again a minute later. ``eval``: always by
            ``EVALSHA`` (sent with ``EVAL`` once per server). ``functions``:
            always by ``FCALL``; a missing library is a ``ConfigurationError``.
            A tenant's own ACL user runs no script of its own: it needs the
            library loaded (``auto`` or ``functions``).
        key_prefix: The first part of every key; tests use their own.
        tenant: The tenant used where none is given (CLI, demo, adapter).
        default_token_budget: The view's budget when neither the caller nor
            the provider gives one.
        provider_safety_margin: Tokens kept free below a provider's window
            (context_window - max_output_tokens - margin).
        max_message_bytes: The largest message, as JSON, that is accepted.
        session_ttl_seconds: Sessions expire this long after their last write,
            and at most a tenth of it (a minute at most) later: an append moves
            the expiry of a session's keys only when they would otherwise
            expire sooner; ``None`` keeps them until deleted.
        connect_timeout: Seconds to wait for a connection to Redis.
        operation_timeout: Seconds to wait for one Redis reply.
        max_connections: The most connections a process opens to one Redis
            (to each node of a cluster). On one Redis, a call past it waits for
            a free connection, within its deadline, instead of failing.
        coalesce_calls: The most calls in flight together to one Redis (one
            node of a cluster) that are sent in one write, on one connection:
            each call a connection of its own costs the server a wake-up, a
            read and a write, more than an append itself. A call that finds
            none other in flight goes at once; ``0`` sends every call alone.
            The replies of a batch's calls are in Redis's output buffer
            together: a ``client-output-buffer-limit`` for normal clients must
            hold this many views' replies (some 80 KB each at 8,000 tokens).
        retry_attempts: How many times a call is retried after a transient
            connection error (appends keep their idempotency key).
        retry_base_delay: The first retry's delay, doubled on each retry,
            with full jitter.
        retry_max_delay: The longest delay between two retries.
        lease_ttl_seconds: How long a lease lasts unless renewed.
        lease_wait_seconds: How long replace and clear wait for a lease that
            another writer holds.
        token_safety_factors: Model family (a substring of the model or
            provider name) -> factor applied to cl100k counts, because
            cl100k under-counts other tokenizers (Claude by 15-45%). The
            start: ``record_usage`` learns each model's own factor, per tenant.
        token_ratio_margin: Added to a model's observed ratio of its tokens to
            cl100k's, for the factor budgets use.
        idempotency_seconds: A retried append is recognised (not written
            twice) when it comes within this many seconds of the original...
            A retried replace, clear, delete, summary request or lease
            release is answered with its first run's reply for this long.
        idempotency_window: ...and within this many appends to the session.
            Keys are kept in two rotating generations, so memory follows the
            recent append rate, not the history's length. A batch larger than
            this keeps all its keys (a call rotates them at most once).
        tombstone_seconds: How long a deleted session's tombstone lasts: a
            session written again within it continues its epoch and
            sequence number (an append-if or a paged read of the deleted
            history is refused, never applied to the new one).
        history_page_size: Entries read per round trip by ``get_messages``.
        index_interval: Seconds between two refreshes, by one process, of a
            session's last activity in the tenant's index, however often it
            writes the session (its first write records it). A refresh rides
            with a write and is best effort: one that fails is logged and
            tried again on the next write.
        offload_threshold_tokens: Tool results larger than this are sent in
            views as a preview (head and tail) plus a retrieval note; the
            full text stays in the history. ``0`` never offloads.
        offload_preview_tokens: The size of such a preview.
        search_index: The worker brings a session's search index up to date
            after each summary job (searches then seldom index anything
            themselves); off, each search indexes what it finds new.
        summary_trigger_tokens: A summary is due when this many tokens have
            been appended past the summary watermark; ``0`` turns background
            summaries off.
        summary_keep_tokens: The newest tokens a summary leaves raw (the
            tail that views send as it is), at most.
        summary_keep_share: Of the smallest budget a session is viewed
            with, the share a summary leaves raw, when that is less than
            ``summary_keep_tokens``: a small view's raw part must reach back
            to what the summary covers, or what lies between is in neither.
        summary_chunk_tokens: The most tokens sent to the summarizer in one
            call; longer inputs are summarized in chunks, each folded into
            the running summary.
        summary_max_tokens: The longest summary (ledger and narrative), in tokens.
        summary_ledger_tokens: The longest facts ledger (a summary's level 1).
        summary_pressure: A view asks for a summary when this share of its
            budget has been written past the summary's watermark: summaries
            follow the budgets the session is read with, not only the trigger.
        view_low_water: When a view would overflow, its anchor moves so the
            view holds this share of the budget; appends then extend it, its
            prefix unchanged, until it is full again (the provider's prompt
            cache stays warm in between).
        view_low_water_floor: The least a view is cut back to: when each model
            call adds so much that ``view_low_water`` would break the prompt
            cache within ``view_step_calls`` calls, a step cuts the view back
            further, down to this share.
        view_step_calls: How many model calls a step should last at a
            4,000-token budget (more at larger budgets, as the fourth root).
        view_summary_share: The most of a view's budget a summary may take.
        view_full_share: A tool result over this share of a 4,000-token
            view's budget is sent as its preview (when it has one); the share
            grows with the budget's fourth root (0.16 at 64,000 tokens).
        view_max_anchors: The most budgets one session keeps an anchor for
            (the oldest anchor goes first).
        view_cache_bytes: The memory each process spends keeping the
            sessions it served, so its next view of one reads only what is
            new (validated in the same round trip: epoch, life, count, the
            anchor and the pinned copies). Each message kept is charged its
            stored bytes, again for its decoded copy, and some 460 bytes of
            objects beside (within 10% of what Python allocates for it), and
            400 bytes a message sent for the caller's copy of the next view,
            made ahead while the pod waits. The least recently viewed go
            first; ``0`` turns it off (every view reads as a cold pod does).
        summary_role: The role of the summary message in views: ``user`` (so
            a cached system prompt stays byte-stable) or ``system``.
        summary_retry_seconds: After a failed summary, the sweep waits this
            long before it queues the session again.
        summarizer: Who writes the summaries: ``anthropic`` (Anthropic's API),
            ``openai`` (OpenAI's API, or a server that speaks it at
            ``openai_base_url``: vLLM, Ollama, LiteLLM), ``local`` (the local
            extractive summarizer), or ``auto`` (the default): Anthropic's
            with ``anthropic_api_key`` set, else the local one.
        anthropic_api_key: Anthropic's API key. Also read from
            ``ANTHROPIC_API_KEY``.
        openai_api_key: The key of OpenAI's API, or of the server at
            ``openai_base_url`` (``None``: a server that needs none). Also
            read from ``OPENAI_API_KEY``.
        openai_base_url: The API root of an OpenAI-compatible server
            (``http://localhost:8000/v1``); ``None``: OpenAI's. Also read
            from ``OPENAI_BASE_URL``.
        summary_model: The model that writes summaries, as its API names
            it; ``None``: ``claude-haiku-4-5`` for Anthropic's (OpenAI's
            summarizer needs one named).
        summary_timeout: Seconds one summarizer call may take.
        queue_url: The Redis of the worker queue (arq cannot use Redis
            Cluster); the store's Redis by default. A ``redis://``,
            ``rediss://`` or ``unix://`` URL, or a Redis Sentinel one:
            ``redis+sentinel://[user[:password]@]host[:port][,host[:port]...]/master[/db]``
            (sentinel ports default to 26379).
        queue_name: The arq queue the summary jobs go to.
        worker_name: This worker's name, in its health-check key; the host
            name by default.
        session_bytes: Default quota: the most bytes one session may hold:
            its messages, pinned copies, checkpoints and branches (``None``:
            no limit). Tenants may have their own limits
            (``ContextStore.set_limits``); these are the defaults.
        session_tokens: Default quota: the most tokens in one session.
        max_sessions: Default quota: the most sessions a tenant may have.
        max_checkpoints: Default quota: the most checkpoints one session may
            keep (``None``: no limit).
        max_branches: The most abandoned tails (branches) a session keeps
            readable after rewinds; the oldest goes when a rewind makes one more.
        bridge_tokens: The most raw tokens a fork (or a rewind into older
            history) copies into the new live log, and that a fork leaves in
            the source's: the newest entries, what views read most. It bounds
            a fork's cost, whatever the history's length; a view that needs
            more reads on into the shared segments, in more round trips.
        bridge_entries: The most entries such a copy takes.
        appends_per_second: Default quota: the sustained append rate of one
            session, with bursts of ``append_burst`` messages.
        append_burst: The burst the append rate allows.
        encryption_keys: Master key id -> 32-byte key (base64). Set it (and
            ``encryption_active_key``) to seal message content at rest.
        encryption_active_key: The id of the key new values are sealed with.
        log_level: The workers' and CLI's log level.
        log_format: ``text`` (one readable line per event) or ``json`` (one
            JSON object per line, for log shippers).
        metrics: Record Prometheus metrics (:mod:`ctxstore.metrics`) when
            ``prometheus_client`` is installed (the ``metrics`` extra; workers
            always have it). On by default; ``false`` records nothing.
        metrics_tenant_labels: Add a ``tenant`` label to the metrics that can
            carry one: a series per tenant, so only for a bounded number of
            tenants. Never a per-session label.
    """

    model_config = SettingsConfigDict(
        env_prefix="CTXSTORE_",
        extra="ignore",
        validate_default=True,
        frozen=True,
        populate_by_name=True,
        # URLs carry passwords: an error names the field, never echoes its value.
        hide_input_in_errors=True,
    )

    redis_url: str | None = None
    data_dir: Path | None = None
    redis_cluster: bool = False
    replica_acks: Annotated[int, Field(ge=0, le=16)] = 0
    replica_ack_timeout_ms: PositiveInt = 500
    script_mode: Literal["auto", "eval", "functions"] = "auto"
    key_prefix: str = "ctx"
    tenant: str = "default"
    default_token_budget: PositiveInt = 100_000
    provider_safety_margin: Annotated[int, Field(ge=0)] = 1_000
    max_message_bytes: PositiveInt = 1_048_576
    session_ttl_seconds: Seconds | None = None
    connect_timeout: PositiveFloat = 2.0
    operation_timeout: PositiveFloat = 5.0
    max_connections: Annotated[int, Field(ge=1, le=100_000)] = 512
    coalesce_calls: Annotated[int, Field(ge=0, le=10_000)] = 64
    retry_attempts: Annotated[int, Field(ge=0, le=100)] = 3
    retry_base_delay: PositiveFloat = 0.05
    retry_max_delay: PositiveFloat = 1.0
    lease_ttl_seconds: Annotated[float, Field(gt=0, le=86_400, allow_inf_nan=False)] = 30.0
    lease_wait_seconds: Annotated[float, Field(ge=0, le=86_400, allow_inf_nan=False)] = 10.0
    token_safety_factors: dict[str, Annotated[float, Field(ge=1.0, le=4.0)]] = Field(
        default_factory=lambda: {"claude": 1.4, "anthropic": 1.4}
    )
    token_ratio_margin: Annotated[float, Field(ge=0, le=1)] = 0.05
    idempotency_seconds: PositiveFloat = 300.0
    idempotency_window: PositiveInt = 100_000
    tombstone_seconds: Seconds = 7 * 86_400
    history_page_size: Annotated[int, Field(gt=0, le=10_000)] = 1_000
    index_interval: Annotated[float, Field(ge=0)] = 1.0
    offload_threshold_tokens: Annotated[int, Field(ge=0)] = 500
    offload_preview_tokens: PositiveInt = 150
    search_index: bool = True
    summary_trigger_tokens: Annotated[int, Field(ge=0)] = 32_000
    summary_keep_tokens: Annotated[int, Field(ge=0)] = 8_000
    summary_keep_share: Annotated[float, Field(ge=0, le=1)] = 0.25
    summary_chunk_tokens: Annotated[int, Field(ge=1_000)] = 60_000
    summary_max_tokens: Annotated[int, Field(ge=64, le=32_000)] = 6_000
    summary_ledger_tokens: Annotated[int, Field(ge=32, le=32_000)] = 1_200
    summary_pressure: Annotated[float, Field(gt=0, le=1)] = 0.3
    view_low_water: Annotated[float, Field(gt=0, lt=1)] = 0.8
    view_low_water_floor: Annotated[float, Field(gt=0, lt=1)] = 0.55
    view_step_calls: Annotated[float, Field(ge=0, le=1_000)] = 10.0
    view_summary_share: Annotated[float, Field(gt=0, lt=1)] = 0.4
    view_full_share: Annotated[float, Field(gt=0, le=1)] = 0.08
    view_max_anchors: Annotated[int, Field(ge=1, le=64)] = 4
    view_cache_bytes: Annotated[int, Field(ge=0, le=1 << 40)] = 64 << 20
    summary_role: Literal["user", "system"] = "user"
    summary_retry_seconds: Annotated[float, Field(ge=0)] = 600.0
    summarizer: Literal["auto", "anthropic", "openai", "local"] = "auto"
    anthropic_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("CTXSTORE_ANTHROPIC_API_KEY", "ANTHROPIC_API_KEY"),
    )
    openai_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("CTXSTORE_OPENAI_API_KEY", "OPENAI_API_KEY"),
    )
    openai_base_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("CTXSTORE_OPENAI_BASE_URL", "OPENAI_BASE_URL"),
    )
    summary_model: str | None = None
    summary_timeout: PositiveFloat = 60.0
    queue_url: str | None = None
    queue_name: str = "ctxstore:summaries"
    worker_name: str = Field(default_factory=socket.gethostname)
    session_bytes: PositiveInt | None = None
    session_tokens: PositiveInt | None = None
    max_sessions: PositiveInt | None = None
    max_checkpoints: PositiveInt | None = 100
    max_branches: Annotated[int, Field(ge=1, le=1_000)] = 16
    bridge_tokens: Annotated[int, Field(ge=1_000, le=10_000_000)] = 48_000
    bridge_entries: Annotated[int, Field(ge=10, le=10_000)] = 2_000
    appends_per_second: PositiveFloat | None = None
    append_burst: PositiveInt = 100
    encryption_keys: dict[str, SecretStr] = Field(default_factory=dict)
    encryption_active_key: str | None = None
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["text", "json"] = "text"
    metrics: bool = True
    metrics_tenant_labels: bool = False

    def __init__(self, **values: Any) -> None:
        """Read the settings: the environment, overridden by ``values``.

        Raises:
            ConfigurationError: A value cannot work; the error names the
                variable to fix (``CTXSTORE_<NAME>``), never the value.
        """
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise ConfigurationError(f"invalid settings: {describe_errors(exc)}") from exc

    @field_validator("key_prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        return validate_prefix(value)

    @field_validator("tenant")
    @classmethod
    def _check_tenant(cls, value: str) -> str:
        return validate_id(value, "tenant")

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        check_redis_url(value)
        # redis-py lets a URL's options override the client's: the store reads RESP2 replies.
        protocol = parse_qs(urlsplit(value).query).get("protocol")
        if protocol and protocol != ["2"]:
            raise ConfigurationError(
                "the store speaks RESP2: drop protocol= from the URL (or make it 2)"
            )
        return value

    @field_validator("queue_url")
    @classmethod
    def _check_queue_url(cls, value: str | None) -> str | None:
        if value is not None and sentinel_address(value) is None:
            check_redis_url(value, also="or redis+sentinel://")
        return value

    @field_validator("anthropic_api_key", "openai_api_key")
    @classmethod
    def _empty_key_is_no_key(cls, value: SecretStr | None) -> SecretStr | None:
        # An empty ANTHROPIC_API_KEY (a blank line in a Secret) means: no key.
        return value if value is not None and value.get_secret_value().strip() else None

    @field_validator("openai_base_url", "summary_model")
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        # An empty variable (a blank line in a ConfigMap) means: not set.
        return value if value is not None and value.strip() else None

    @field_validator("openai_base_url")
    @classmethod
    def _check_openai_base_url(cls, value: str | None) -> str | None:
        if value is not None and (
            urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).netloc
        ):
            raise ConfigurationError(
                "openai_base_url must be an http:// or https:// URL (http://localhost:8000/v1)"
            )
        return value

    @model_validator(mode="after")
    def _check_encryption(self) -> Settings:
        if (self.encryption_active_key is None) != (not self.encryption_keys):
            raise ValueError("encryption_keys and encryption_active_key go together")
        if self.encryption_active_key is not None and (
            self.encryption_active_key not in self.encryption_keys
        ):
            raise ValueError("encryption_active_key must name one of encryption_keys")
        return self

    @model_validator(mode="after")
    def _check_summary_window(self) -> Settings:
        if 0 < self.summary_trigger_tokens <= self.summary_keep_tokens:
            raise ValueError(
                "summary_trigger_tokens must be larger than summary_keep_tokens: "
                "a summary must find something to cover once it is due"
            )
        return self

    def store_url(self) -> str:
        """``redis_url``, or when it is unset the user's embedded Redis in ``data_dir``.

        The embedded Redis is started if none runs there, and keeps running
        (and keeping its data) for the user's next process.
        """
        if self.redis_url is not None:
            return self.redis_url
        from ctxstore.embedded import shared_embedded_url

        return shared_embedded_url(self.data_dir)

    @classmethod
    def from_url(cls, url: str, **overrides: object) -> Settings:
        """Settings for the Redis at ``url``; other fields from the environment.

        Args:
            url: A ``redis://``, ``rediss://`` or ``unix://`` URL.
            **overrides: Any other field, by name.
        """
        return cls(redis_url=url, **overrides)


REDIS_SCHEMES = ("redis", "rediss", "unix")
"""The schemes of a Redis URL (the queue's may also be ``redis+sentinel``)."""


def check_redis_url(url: str, *, also: str = "") -> None:
    """Refuse a Redis URL that redis-py would misread, or refuse with a traceback.

    redis-py reads ``redis:/10.0.0.5:6379/0`` (one slash) as a URL with no
    host, and connects to localhost; ``unix://run/redis.sock`` as the socket
    ``/redis.sock``. Each reason names the part to fix, never its value (a
    URL may carry a password).

    Args:
        url: A ``redis://``, ``rediss://`` or ``unix://`` URL.
        also: Other schemes the setting takes, for the message.

    Raises:
        ConfigurationError: The scheme is not a Redis one; a ``redis://`` URL
            names no host, its port or database is not a number; a
            ``unix://`` URL names no socket path, or a host.
    """
    schemes = f"a redis://, rediss:// or unix:// URL{' ' + also if also else ''}"
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # a bracketed host that is no IPv6 address
        raise ConfigurationError(f"is not a valid URL: {exc}") from None
    if parts.scheme not in REDIS_SCHEMES:
        given = f"{parts.scheme}://" if parts.scheme else "a URL without a scheme"
        raise ConfigurationError(f"must be {schemes}, not {given}")
    if parts.scheme == "unix":
        if parts.hostname:
            raise ConfigurationError(
                "is not a valid URL: a unix:// URL has no host, and its socket's path "
                "follows three slashes (unix:///run/redis.sock)"
            )
        if parts.path in ("", "/"):
            raise ConfigurationError(
                "is not a valid URL: it names no socket path (unix:///run/redis.sock)"
            )
    else:
        if not parts.hostname:
            raise ConfigurationError(
                f"is not a valid URL: it names no host ({parts.scheme}://HOST:PORT/DB, "
                "two slashes after the scheme)"
            )
        try:
            port = parts.port
        except ValueError:
            port = 0
        if port == 0:
            raise ConfigurationError(
                "is not a valid URL: its port must be a number from 1 to 65535 "
                f"({parts.scheme}://host:6379/0)"
            )
        database = parts.path.removeprefix("/")
        if database and not (database.isdigit() and database.isascii()):
            raise ConfigurationError(
                "is not a valid URL: the database, after the host and a slash, must be a "
                f"number ({parts.scheme}://host:6379/0)"
            )
    for database in parse_qs(parts.query).get("db", []):
        if not (database.isdigit() and database.isascii()):
            raise ConfigurationError("is not a valid URL: its db= must be a number")


def describe_errors(exc: ValidationError) -> str:
    """A settings validation error in words: each variable to fix and why (no values)."""
    parts = []
    for error in exc.errors(include_url=False, include_input=False):
        loc = error["loc"]
        reason = str(error["msg"]).removeprefix("Value error, ")
        if loc:
            name = str(loc[0])
            variable = "ANTHROPIC_API_KEY" if name == "anthropic_api_key" else f"CTXSTORE_{name}"
            parts.append(f"{variable.upper()} ({name}): {reason}")
        else:
            parts.append(reason)
    return "; ".join(parts)


SENTINEL_SCHEME = "redis+sentinel"
SENTINEL_PORT = 26379


@dataclass(frozen=True, slots=True)
class SentinelAddress:
    """Where Redis Sentinel tells the queue's primary: a ``redis+sentinel://`` URL's parts.

    Attributes:
        sentinels: (host, port) of each sentinel.
        master: The name the sentinels monitor the primary under.
        db: The database number on the primary.
        username: The primary's user (the sentinels are asked without one).
        password: That user's password.
    """

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None


def sentinel_address(url: str) -> SentinelAddress | None:
    """The parts of a ``redis+sentinel://`` URL; ``None`` for a URL of another scheme.

    The form is
    ``redis+sentinel://[user[:password]@]host[:port][,host[:port]...]/master[/db]``;
    user and password are percent-decoded, IPv6 hosts go in brackets.

    Raises:
        ConfigurationError: The URL has the scheme but not the form.
    """
    scheme, found, rest = url.partition("://")
    if not found or scheme.lower() != SENTINEL_SCHEME:
        return None
    where, _, path = rest.partition("/")
    userinfo, at, hosts = where.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    sentinels = []
    for host in hosts.split(","):
        try:
            parts = urlsplit(f"//{host}")
            address = (parts.hostname, parts.port or SENTINEL_PORT)
        except ValueError as exc:
            raise ConfigurationError(f"sentinel URL: bad sentinel address {host!r}: {exc}") from exc
        if not address[0] or parts.username is not None or parts.path:
            raise ConfigurationError(f"sentinel URL: bad sentinel address {host!r}")
        sentinels.append((address[0], address[1]))
    master, _, db = path.partition("/")
    if not master:
        raise ConfigurationError("sentinel URL: no master name (redis+sentinel://host:port/master)")
    if db and not (db.isdigit() and db.isascii()):
        raise ConfigurationError(f"sentinel URL: the database must be a number, not {db!r}")
    return SentinelAddress(tuple(sentinels), unquote(master), int(db or 0), username, password)
