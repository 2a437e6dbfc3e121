"""The worker's log: one line per event, as text or JSON, each with its time and zone.

:func:`configure` points the ``ctxstore``, ``workers`` and ``arq`` loggers at
one handler on stderr (``ctxstore worker`` calls it through
:func:`workers.build_worker`, from ``Settings.log_level`` and
``Settings.log_format``):

- ``text``: ``2025-06-01T09:30:00.120+00:00 INFO    ctxstore.worker  job committed
  tenant=acme session=s1 entries=42 ...``, one line a person reads;
- ``json``: ``{"ts": ..., "level": ..., "logger": ..., "message": ..., "event": ...,
  "tenant": ...}``, one object per line for log shippers.

An event's fields are passed as ``extra=``: JSON has them as keys, the text
line as ``key=value``. Values may be untrusted (a tenant id read from Redis):
the text line escapes control characters, so no value can start a forged
line. Callers never pass a secret, a message or a summary as a field or in a
message; URLs go through :func:`redacted` first.

Why the standard library: ``logging`` is what arq and redis-py log through
already, and two small formatters do the whole job; structlog or
python-json-logger would add a dependency to the worker install for the same
two formats. ``rich``'s handler, though installed, wraps lines and spreads a
traceback over many, which log shippers split into events of their own.

The handler keeps propagation on, so an application's own root handlers (and
pytest's ``caplog``) still see every record; a process that configures the
root logger itself gets each line there as well.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any, Final, TextIO
from urllib.parse import urlsplit, urlunsplit

from ctxstore import ConfigurationError
from ctxstore.settings import sentinel_address

__all__ = [
    "FORMATS",
    "LEVELS",
    "LOGGERS",
    "JsonFormatter",
    "TextFormatter",
    "configure",
    "error_text",
    "mark_logged",
    "redacted",
]

LOGGERS: Final = ("ctxstore", "workers", "arq")
"""The loggers :func:`configure` sets up."""
LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")
"""The levels a log may be set to."""
FORMATS: Final = ("text", "json")
"""The formats a log may be written in."""

# Every attribute a bare LogRecord has: what is left on a record is its `extra=`.
_RECORD_ATTRIBUTES: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")
_BARE: Final = re.compile(r"[^\s\"=\x00-\x1f\x7f\u2028\u2029]+")
_LOGGED: Final = "_ctxstore_logged"
# redis-py quotes a failed pipeline command whole, arguments (message JSON) and all.
_PIPELINE_COMMAND: Final = re.compile(r"Command # (\d+) \(.*\) of pipeline", re.DOTALL)


def configure(level: str = "INFO", fmt: str = "text", *, stream: TextIO | None = None) -> None:
    """Send the ``ctxstore``, ``workers`` and ``arq`` logs to one handler, at ``level``.

    Calling it again replaces the handler it installed before (never one of
    the application's). arq's own INFO lines (each job's start and end,
    without fields, next to the worker's one line per job) show from DEBUG
    on; its warnings always do.

    Args:
        level: ``DEBUG``, ``INFO``, ``WARNING`` or ``ERROR``.
        fmt: ``text`` or ``json``.
        stream: Where lines go; ``sys.stderr`` (looked up at each line) by default.

    Raises:
        ConfigurationError: An unknown level or format.
    """
    if level not in LEVELS:
        raise ConfigurationError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")
    if fmt not in FORMATS:
        raise ConfigurationError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    handler = _Handler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(_not_logged_twice)
    quiet_arq = max(logging.getLevelNamesMapping()[level], logging.WARNING)
    for name in LOGGERS:
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if isinstance(h, _Handler)]:
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.setLevel(level if name != "arq" or level == "DEBUG" else quiet_arq)


def mark_logged(exc: BaseException) -> BaseException:
    """Mark ``exc`` as logged by the job that raised it: arq's own report of it is dropped.

    arq logs every exception a job raises, with its traceback; the worker
    logs its jobs' failures itself, once, with the job's fields.
    """
    setattr(exc, _LOGGED, True)
    return exc


def error_text(exc: BaseException, limit: int = 300) -> str:
    """The text of ``exc`` for a log line: one line, at most ``limit`` characters.

    A command Redis refused inside a pipeline is named by its number only:
    redis-py quotes it with its arguments, which may be a message.
    """
    text = _PIPELINE_COMMAND.sub(r"Command # \1 of pipeline", str(exc))
    return " ".join(text.split())[:limit]


def redacted(url: str) -> str:
    """``url`` with no user, password or query (which may carry a password).

    ``redis://u:pw@host:6379/0?password=x`` becomes ``redis://host:6379/0``;
    a ``redis+sentinel://`` URL keeps its sentinels, master and database.
    """
    sentinel = sentinel_address(url)
    if sentinel is not None:
        hosts = ",".join(f"{_host(host)}:{port}" for host, port in sentinel.sentinels)
        return f"redis+sentinel://{hosts}/{sentinel.master}/{sentinel.db}"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "(a URL that does not parse)"
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    where = _host(parts.hostname or "") + (f":{port}" if port is not None else "")
    return urlunsplit((parts.scheme, where, parts.path, "", ""))


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class TextFormatter(logging.Formatter):
    """One line a person reads: time with zone, level, logger, message, ``key=value`` fields.

    A traceback, when there is one, follows on lines that start with spaces
    (a line-based shipper joins those to the line before, as for Java's).
    """

    def format(self, record: logging.LogRecord) -> str:
        """The record's line (and its traceback)."""
        message = _escape(record.getMessage())
        fields = " ".join(f"{key}={_text_value(value)}" for key, value in _fields(record).items())
        line = f"{_timestamp(record)} {record.levelname:<7} {record.name}  {message}"
        if fields:
            line += f"  {fields}"
        if record.exc_info:
            line += _continued(self.formatException(record.exc_info))
        if record.stack_info:
            line += _continued(self.formatStack(record.stack_info))
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``message``, then the fields.

    A traceback goes in ``exc`` (one string; JSON escapes its newlines).
    """

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        event: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in _fields(record).items():
            event.setdefault(key, value)  # a field never hides one of the four above
        if record.exc_info:
            event["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            event["stack"] = self.formatStack(record.stack_info)
        return json.dumps(event, ensure_ascii=False, default=str)


class _Handler(logging.StreamHandler[TextIO]):
    """A stream handler whose default stream is whatever ``sys.stderr`` is at each line.

    (A test framework swaps ``sys.stderr`` per test; a handler that kept the
    first one would write to a closed file.)
    """

    def __init__(self, stream: TextIO | None) -> None:
        logging.Handler.__init__(self)
        self._fixed = stream

    @property
    def stream(self) -> TextIO:
        return self._fixed if self._fixed is not None else sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        self._fixed = value


def _not_logged_twice(record: logging.LogRecord) -> bool:
    """Drop arq's report of an exception the job has logged itself."""
    exc = record.exc_info[1] if record.exc_info else None
    return not (record.name.startswith("arq") and getattr(exc, _LOGGED, False))


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {
        key: value
        for key, value in vars(record).items()
        if key not in _RECORD_ATTRIBUTES and not key.startswith("_")
    }


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, tz=UTC).astimezone()
    return moment.isoformat(timespec="milliseconds")


def _continued(text: str) -> str:
    return "".join(f"\n    {line}" for line in text.splitlines())


def _escape(text: str) -> str:
    """``text`` with control characters written as escapes: it stays one line."""
    return _CONTROL.sub(lambda found: found.group().encode("unicode_escape").decode(), text)


def _text_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str) and _BARE.fullmatch(value):
        return value
    # Quoted as JSON: spaces, quotes and control characters cannot run into the next field.
    return _escape(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str))
