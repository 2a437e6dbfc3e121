"""Messages as :mod:`ctxstore._local.ledger` reads them: texts, tool calls, and what results tell.

:func:`turn` reads a message in OpenAI Chat, Anthropic or OpenAI Responses form
(thinking and reasoning are skipped). Tool output is mostly data (logs, tables,
code, listings) that no later turn needs line by line, so little is read from
it: the line that says how a call failed (an exception ending a traceback, an
error line, a non-zero exit, an HTTP error's message, JSON with an error, or an
ERROR log line reporting a failure), a short outcome ("42 passed", "(3 rows)"),
and the lines written for a reader among the data: notes, commented or isolated
``key: value`` lines and short prose ("note: the next release is set for March 26").
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any, NamedTuple

from ctxstore._layout.formats import result_id
from ctxstore._local.entries import LedgerEntry
from ctxstore._local.fact_words import FactKind
from ctxstore._local.facts import Fact, clip, is_statement, key_of, prose_facts
from ctxstore._local.notes import Note, note
from ctxstore._local.shapes import shape


class Turn(NamedTuple):
    """A message, whatever its format, as what the ledger reads of it."""

    role: str
    text: str
    calls: list[tuple[str, str, str]]  # (call id, tool, short arguments)
    results: list[tuple[str, str, bool]]  # (call id, output, flagged as an error)


_EXCEPTION = re.compile(
    r"^(?:E\s+)?((?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure|Fault)\b(?::.*)?"
    r"|Exception in thread .*|panic: .*|error(?:\[\w+\])?: .*|Error: .*|fatal: .*|npm ERR! .*"
    r"|FAILED .*)$"
)
_FRAME = re.compile(r'^\s+(?:File "[^"]+", line \d+|at \S+\(.*\)$)')
_HTTP_ERROR = re.compile(r"^HTTP/\d(?:\.\d)? ([45]\d\d)\b")
_EXIT = re.compile(
    r"\b(?:exit(?:ed)?(?: with)?(?: code| status)?|returned non-zero exit status)[:= ]\s*"
    r"(?P<code>-?\d+)|command not found|No such file or directory|Permission denied"
    r"|Segmentation fault",
    re.I,
)
# An ERROR log line that reports a failure, not one that says it retries.
_LOGGED = re.compile(r"\b(?:ERROR|FATAL|CRITICAL)\b:?\s*(?:\[[^\]]*\]\s*)?(?P<m>.*\bfailed\b.*)$")
# A line that says how a call ended: "42 passed in 3.10s", "(3 rows)", "Successfully installed".
OUTCOME = re.compile(
    r"^[=\s(]*(?:\d[\d,]* (?:rows?|passed|failed|tests?|files?|items?|matches|errors?|warnings?"
    r"|changed|insertions?|deletions?)\b|(?:successfully|ok|done|created|updated|deleted|removed"
    r"|wrote|written|saved|installed|deployed|applied|merged|pushed|built|finished|completed"
    r"|no (?:changes|matches|errors|issues))\b)",
    re.I,
)
_LOG_PREFIX = re.compile(r"^\[?\d{4}-\d{2}-\d{2}[T ][\d:.,]+Z?\]?\s*(?:\[?[A-Z]+\]?\s+)?")

# Notes among data: what is stripped before a line is read, and what makes it data.
_LISTING = re.compile(r"^\s*\d+\s{2,}")  # a file shown with line numbers
_PREFIX = re.compile(
    r"^(?:(?:\[?\d{4}-\d\d-\d\d[T ][\d:.,]+Z?\]?|note:|settings:|decided:|[A-Z ]*NOTE:|#+|[-*>]"
    r"|(?:INFO|DEBUG|NOTE|WARN(?:ING)?)(?=\s))\s*)+",
    re.I,
)
_MARK = re.compile(
    r"^(?:[-*]\s+)?(?:[\[\]\d:.TZ -]*\b(?:INFO|DEBUG|NOTE)\b)?\s*"
    r"(?:note:|settings:|#|decided:|>|[A-Z ]*NOTE:)",
    re.I,
)
_HINT = re.compile(r"\s{2,}#\s*(?P<a>.+)$|\s+\((?P<b>the .+)\)$")  # "x=y  # the invoice"
_HINT_WAS = re.compile(r"(?:was|previously|formerly)\s+(?P<old>[^,;()]+?)\s*(?:[,;(]|$)", re.I)
_KEY_VALUE = re.compile(r"^(?P<key>[A-Za-z][\w'. -]{0,40}?)\s*[:=]\s*(?P<value>\S.*)$")
_PROSE = re.compile(
    r"^(?:the|our|a|an)\s.*\b(?:is|are|=|set for|stored at|resolved to|comes out at)\b"
    r"|\bchanged \S+ to\b|\bresolved to\b|\bwas \S+,? now\b",
    re.I,
)
_CODE = re.compile(
    r"\w\(|^\s*(?:def|class|import|from|return|raise|if|for|while|try|except|with|async|await|"
    r"File|at)\b|[{};]\s*$|^\s{6,}|://\S+:"
)
_GREP = re.compile(r"^\S+:\d+:")
_LONG = 30
"""Words past which a line of output is prose, read sentence by sentence."""
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_LOGGED_AT = re.compile(r"^\[?\d{4}-\d\d-\d\d[T ][\d:.,]+Z?\]?\s+(?:[A-Z]{3,}\s+)?(?:[\w.-]+:\s+)?")
_DIFF = re.compile(r"^[+~-]\s+")
_LOGGED_PAIR = re.compile(r"^(?P<k>[a-z][a-z0-9]*(?:_[a-z0-9]+)+)=(?P<v>\S.{0,120})$")
_LABEL = re.compile(r"(?:The|Our|Their|Your|Its|[A-Z][a-z]+)(?: [\w'\u2019().-]+){1,7}")
_FIELD = re.compile(r'^\s*"(?P<k>[A-Za-z][\w .-]{2,60})"\s*:\s*"?(?P<v>[^"{}\[\]]{1,120}?)"?,?\s*$')


def turn(message: dict[str, Any]) -> Turn | None:
    """A message in any of the formats, or None when it holds nothing to summarize."""
    kind = message.get("type")
    if "role" not in message and isinstance(kind, str):  # an OpenAI Responses item
        if kind.endswith("_call_output"):
            result = (str(message.get("call_id")), _flatten(message.get("output")), False)
            return Turn("tool", "", [], [result])
        if kind.endswith("_call"):
            call = (str(message.get("call_id")), str(message.get("name") or kind))
            return Turn("assistant", "", [(*call, _args(message.get("arguments")))], [])
        if kind != "message":
            return None  # reasoning, like thinking blocks, is the agent's private draft
    role = str(message.get("role", ""))
    if role in ("system", "developer"):
        return None  # a view sends these itself
    texts, calls, results = [], [], []
    listed = [c for c in message.get("tool_calls") or () if isinstance(c, dict)]
    content = message.get("content")
    if isinstance(content, str):
        texts.append(content)
    for block in content if isinstance(content, list) else ():
        btype = block.get("type") if isinstance(block, dict) else None
        if btype in ("text", "input_text", "output_text"):
            texts.append(str(block.get("text", "")))
        elif btype == "tool_use" or (
            # Amplifier writes a call of tool_calls again as a tool_call block.
            btype == "tool_call" and all(c.get("id") != block["id"] for c in listed)
        ):
            given = block.get("input", block.get("arguments"))
            calls.append((str(block["id"]), str(block.get("name")), _args(given)))
        elif btype == "tool_result":
            output = _flatten(block.get("content", block.get("output")))
            results.append((str(result_id(block)), output, bool(block.get("is_error"))))
    for made in listed:
        function = made.get("function")
        if isinstance(function, dict):
            name, arguments = function.get("name", "?"), function.get("arguments")
        else:  # Amplifier's form: {"id", "tool", "arguments"}
            name, arguments = made.get("tool", "?"), made.get("arguments")
        calls.append((str(made.get("id")), str(name), _args(arguments)))
    if role in ("tool", "function"):
        call_id = message.get("tool_call_id") or message.get("name")
        if call_id is None and results:  # a tool message of result blocks only
            return Turn("tool", "", [], results)
        return Turn("tool", "", [], [(str(call_id), "\n".join(texts), False)])
    return Turn(role, "\n".join(t for t in texts if t), calls, results)


def _flatten(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_flatten(b.get("text", "")) for b in content if isinstance(b, dict))
    return "" if content is None else json.dumps(content, ensure_ascii=False, sort_keys=True)


def _args(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return clip(arguments, 40)
    if isinstance(arguments, dict):
        return clip(", ".join(str(v) for v in arguments.values()), 40)
    return "" if arguments is None else clip(str(arguments), 40)


# -- results ------------------------------------------------------------------------


def failure(output: str, flagged: bool) -> str | None:
    """The line saying how a tool call failed, or None when it did not.

    A call failed when it was flagged (``is_error``), ended in a traceback or
    printed an exception or error line, answered an HTTP error, exited
    non-zero, or returned JSON with an error; a file or a log that merely
    contains the word "error" did not.
    """
    structured = _json_failure(output)
    if structured is not None:
        return structured or None
    lines = [line.rstrip() for line in output.splitlines() if line.strip()]
    framed = [i for i, line in enumerate(lines) if _FRAME.match(line)]
    after = [line for line in lines[framed[-1] + 1 :] if line[:1].strip()] if framed else []
    if after:
        return clip(after[0], 200)  # a traceback ends with what was raised, whatever its name
    for i, line in enumerate(lines):
        if _HTTP_ERROR.match(line):
            said = re.search(r'"(?:error|message)":\s*"([^"]+)"', "\n".join(lines[i : i + 3]))
            return clip(f"{line.strip()}: {said[1]}" if said else line.strip(), 200)
    raised = [m[1] for line in lines if (m := _EXCEPTION.match(line))]
    if raised:
        exceptions = [r for r in raised if re.match(r"[\w.]*(?:Error|Exception)\b", r)]
        return clip((exceptions or raised)[-1], 200)
    for line in lines:
        match = _EXIT.search(line)
        if match and match["code"] != "0":
            return clip(line.strip(), 200)
    if flagged:
        return clip(lines[0].strip(), 200) if lines else "(failed)"
    return None


@lru_cache(maxsize=16)  # one output is read for its failure, then for its replaced values
def _decoded(output: str) -> Any:
    """The JSON value an output starts with (other output may follow it), else ``None``.

    Callers only read it: the value is shared between them.
    """
    text = output.lstrip()
    if text[:1] not in "[{":
        return None
    try:
        return json.JSONDecoder().raw_decode(text)[0]
    except (ValueError, RecursionError):
        return None


def _json_failure(output: str) -> str | None:
    """A JSON result's failure: its error, or stderr with a non-zero exit; "" when it passed.

    The JSON may be followed by other output (a stack, a timing line).
    """
    data = _decoded(output)
    if not isinstance(data, dict):
        return None
    code = next((data[k] for k in ("exit_code", "returncode", "exitCode") if k in data), 0)
    status = str(data.get("status", "")).lower()
    failed = data.get("ok") is False or data.get("success") is False
    failed = failed or status in ("error", "failed", "failure", "fail")
    error = data.get("error")
    if isinstance(error, dict):  # {"error": {"code": ..., "message": ...}}
        error = error.get("message") or error.get("detail") or json.dumps(error)
    if error or failed or (isinstance(code, int) and code != 0):
        said = error or data.get("message") or data.get("detail") or data.get("stderr")
        said = str(said or f"exit code {code}")
        return failure(said, True) or said
    return ""


def reported(output: str) -> list[str]:
    """The failures an output reports, once each, though the call itself may have passed.

    That is what each traceback raised (its first unindented line after a frame), and
    what an ERROR log line says failed ("request failed: X").
    """
    found, framed = [], False
    for line in output.splitlines():
        if _FRAME.match(line):
            framed = True
        elif framed and line[:1].strip() and not line.startswith("Traceback"):
            found.append(line.strip())
            framed = False
        if match := _LOGGED.search(line):
            found.append(match["m"])
    return list(dict.fromkeys(clip(f, 200) for f in found))


def outcome(output: str) -> str:
    """How a call that did not fail ended, briefly: its summary line, else its size."""
    lines = [_LOG_PREFIX.sub("", line).strip() for line in output.splitlines()]
    lines = [line for line in lines if line]
    chosen = next((line for line in reversed(lines) if OUTCOME.search(line)), None)
    if chosen or len(lines) < 2:
        return clip(chosen or (lines[0] if lines else "(empty)"), 60)
    return f"{len(lines)} lines"


def notes(output: str) -> list[Fact | Note]:
    """The facts, and notes, stated by the lines of an output written for a reader.

    Those are short prose lines, lines marked as notes or settings, ``key: value``
    lines with a comment saying what they are, and ``key: value`` lines standing
    alone among other output (a run of them is a config or a header: data).
    """
    lines = output.splitlines()
    texts = [_plain(line) for line in lines]
    found: list[Fact | Note] = list(_replaced_fields(output))
    for i, text in enumerate(texts):
        if not text:
            found += _data_notes(lines[i])
            continue
        if len(text.split()) > _LONG:  # prose: each sentence on its own
            found += [f for sentence in _SENTENCE.split(text) for f in _noted(sentence, lines[i])]
            continue
        hint = _HINT.search(text)
        body = text[: hint.start()].strip() if hint else text
        subject = ((hint["a"] or hint["b"]) if hint else "").removeprefix("the ").strip()
        if was := _HINT_WAS.match(subject):  # "x: 5  # was 4, changed 2025-06-21"
            said = note(f"{body} (was {was['old']})", user=False, tool=True)
            if said is not None:  # kept as written: it replaces what it says it was
                said.entry.shape = shape(lines[i])
                found.append(said._replace(changed=True))
            continue
        marked = _MARK.match(_LISTING.sub("", lines[i]).lstrip()) is not None
        pair = _KEY_VALUE.match(body)
        facts: list[Fact] = []
        if _PROSE.search(body) or (marked and is_statement(body)):
            facts = prose_facts(body, subject)  # "note: the release is set for May 3", "> Never X"
        elif pair and (subject or _settinglike(pair["key"], body)):
            near = [texts[j] or "" for j in (i - 1, i + 1) if 0 <= j < len(texts)]
            if subject or marked or not any(_KEY_VALUE.match(t) for t in near):
                facts = _pair_facts(subject or pair["key"], pair["value"].strip())
        said = note(text, user=False, tool=True)
        if not facts and said is not None and (not pair or _described(pair["key"])):
            said.entry.shape = shape(lines[i])
            found.append(said)
            continue
        for fact in facts:
            fact.entry.shape = shape(lines[i])
            fact.entry.weight = max(fact.entry.weight, said.entry.weight if said else 0)
        found += facts
    return found


_PREVIOUS = re.compile(
    r"^(?:previous|prev|old|former|was|before)(?:[ _-]+(?P<a>.+))?$"
    r"|^(?P<b>.+?)[ _-]+(?:previous|prev|old|before|was)$",
    re.I,
)
_CURRENT = frozenset({"current", "new", "now", "value", "after"})
_PAIRS = (("from", "to"), ("old", "new"), ("before", "after"), ("old value", "new value"))
"""Fields that give a change's two values, old first."""
_RECORDS = 200
"""The most records (JSON objects, table rows) an output is read for replaced values."""


def _replaced_fields(output: str) -> list[Note]:
    """Notes for the values a structured output names as replaced.

    A JSON field beside its ``previous_`` twin (``{"owner": "Ana", "previous_owner":
    "Tom"}``) and a table or CSV column beside its "previous" one (``| service | owner
    | previous owner |``, ``key,current,previous``) give "owner: Ana (was Tom)",
    qualified by the record's first other field ("billing owner", "region").
    """
    found: list[Note] = []
    for record in _records(output):
        fields = {key_of(k): v for k, v in record.items()}
        for before, after in _PAIRS:  # {"field": "due_date", "from": "June 3", "to": "June 10"}
            if fields.get(before) and fields.get(after) and fields[before] != fields[after]:
                label = next((v for k, v in fields.items() if k not in (before, after)), "value")
                said = note(
                    f"{label}: {fields[after]} (was {fields[before]})", user=False, tool=True
                )
                if said is not None:
                    found.append(said._replace(changed=True))
        for name, old in record.items():
            matched = _PREVIOUS.match(name)
            if matched is None or not old:
                continue
            base = key_of(matched["a"] or matched["b"] or "")
            fields = {key_of(k): v for k, v in record.items() if k != name}
            new = fields.get(base) if base else None
            new = new or next((v for k, v in fields.items() if k in _CURRENT), None)
            if not new or new == old:
                continue
            label = next((v for k, v in fields.items() if k != base and k not in _CURRENT), "")
            subject = " ".join(part for part in (label, base) if part) or "value"
            said = note(f"{subject}: {new} (was {old})", user=False, tool=True)
            if said is not None:
                found.append(said._replace(changed=True))
    return found


def _records(output: str) -> list[dict[str, str]]:
    """The flat records of a JSON output, or the rows of its tables and CSV, by column."""
    text = output.strip()
    if text[:1] in "[{":
        data = _decoded(output)
        items = data if isinstance(data, list) else [data]
        return [
            {str(k): str(v) for k, v in item.items() if isinstance(v, str | int | float)}
            for item in items[:_RECORDS]
            if isinstance(item, dict)
        ]
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in text.splitlines()[: _RECORDS * 2]:
        mark = "|" if line.count("|") >= 2 else "," if line.count(",") >= 2 else ""
        if not mark:
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(mark)]
        if not "".join(cells).strip("-: "):
            continue  # a markdown table's rule
        if header is None:
            header = cells
        elif len(cells) == len(header):
            rows.append(dict(zip(header, cells, strict=True)))
    names = {key_of(name) for row in rows[:1] for name in row}
    if not any(_PREVIOUS.match(name) for name in names) and not any(
        set(pair) <= names for pair in _PAIRS
    ):
        return []
    return rows


def _noted(text: str, line: str) -> list[Note]:
    """The note ``text`` (a sentence of a line of output) makes, with that line's shape."""
    said = note(text, user=False, tool=True)
    if said is None:
        return []
    said.entry.shape = shape(line)
    return [said]


def _data_notes(line: str) -> list[Note]:
    """The note a line of data makes, when it says what a value is.

    A JSON field or a log line's ``key=value`` whose key is a phrase
    ("hotel_group_code"), a log line's prose ("resolved the batch size to 512"),
    a diff line, and a table row with a label cell ("| The payment run | PR-22 |").
    """
    body = _DIFF.sub("", _LOGGED_AT.sub("", line.strip()))
    field = _FIELD.match(body) or _LOGGED_PAIR.match(body)
    if field is not None:
        key = field["k"].replace("_", " ").strip()
        if _described(key):
            return _noted(f"{key}: {field['v']}", line)
        return _noted(field["v"], line) if len(field["v"].split()) >= 4 else []  # prose
    if body.count("|") >= 2:
        cells = [c.strip() for c in body.strip("|").split("|")]
        # "| Signing key | Ana | keys/new.pem | was keys/old.pem |": the value before the "was".
        at = next((k for k, c in enumerate(cells) if k >= 2 and _WAS_CELL.match(c)), None)
        if at is not None and _LABEL.fullmatch(cells[0]) and cells[at - 1] not in ("", "-"):
            return _noted(f"{cells[0]}: {cells[at - 1]} ({cells[at]})", line)
        for j, cell in enumerate(cells[:-1]):
            value = cells[j + 1]
            if _LABEL.fullmatch(cell) and value and value != "-" and not _LABEL.fullmatch(value):
                was = cells[j + 2] if j + 2 < len(cells) and cells[j + 2].startswith("was ") else ""
                return _noted(f"{cell}: {value}" + (f" ({was})" if was else ""), line)
        return []
    if body != line.strip() and len(body.split()) >= 3 and not _CODE.search(body):
        return _noted(body, line)
    return []


_WAS_CELL = re.compile(r"(?:was|previously|formerly)\s+\S", re.I)


def _described(key: str) -> bool:
    """Whether a key names what its value is: a phrase ("hotel group code"), not "port"."""
    return len(re.findall(r"[A-Za-z]+", key)) >= 2


def _settinglike(key: str, body: str) -> bool:
    """Whether a ``key: value`` line is keyed like a setting, one pair to the line.

    "security_review: 7 February" is; "Acme Labs: $457.44" (a name) and
    "rootdir: /srv, configfile: x" (a header) are data.
    """
    return bool(re.fullmatch(r"[a-z][a-z0-9_' .-]*", key)) and body.count(": ") < 2


def _pair_facts(label: str, value: str) -> list[Fact]:
    """The facts of a ``label: value`` note; a value of no known form is kept if it is a name."""
    facts = prose_facts(f"{label}: {value}")
    if not facts and re.fullmatch(r"[\w.@/-]*[-_A-Z0-9][\w.@/-]*", value):  # "session-hot-relay"
        facts = [
            Fact(
                LedgerEntry(FactKind.IDENTIFIER, key_of(label), value, f"{label}: ", strong=True),
                None,
                False,
            )
        ]
    return facts


def _plain(line: str) -> str | None:
    """A line of output as a statement to read, or None when it is data (code, table, grep)."""
    if line.count("|") >= 2 or _GREP.match(line) or re.match(r'^\s*"[^"]*"\s*:', line):
        return None  # a table row, a grep hit, a JSON field
    quoted = re.fullmatch(r'\s*"([^"]*)",?\s*', line)  # a string in a JSON list: a note
    text = quoted[1] if quoted else _LISTING.sub("", line)
    if _CODE.search(text):
        return None
    text = _PREFIX.sub("", text.strip()).strip()
    return text if len(text.split()) >= 2 else None
