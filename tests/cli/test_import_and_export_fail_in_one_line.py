"""`ctxstore import` and `export` on hostile input or paths: one line, exit 2, no traceback.

What the file holds is the import's to judge (bytes that are not UTF-8, a lone
surrogate, a boolean counter: refused naming the line); where the command
reads or writes is the command's (a file it cannot open, read or create).
An export file holds what the sessions hold: only the user who wrote it may read it (mode 0600).
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import one_line, run_cli, use_settings
from support.helpers import turn

from ctxstore import ContextStore, Settings

CTXSTORE = str(Path(sys.executable).with_name("ctxstore"))


@pytest.fixture(autouse=True)
def _store_env(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> None:
    """The commands read the test Redis, with this run's prefix."""
    use_settings(monkeypatch, settings)


async def exported(store: ContextStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """Session ``s`` (five turns and a checkpoint) exported by the command to a file."""
    await store.append_many("s", [turn(i) for i in range(5)])
    await store.checkpoint("s", name="five")
    out = tmp_path / "s.jsonl"
    assert await run_cli(["export", "s", "--tenant", store.tenant, "--out", str(out)]) == 0
    capsys.readouterr()
    return out


def edited(path: Path, number: int, line: bytes) -> Path:
    """The file with line ``number`` replaced (and its end line's digest left out)."""
    lines = path.read_bytes().splitlines()
    lines[number - 1] = line
    end = json.loads(lines[-1])
    end.pop("digest", None)
    lines[-1] = json.dumps(end).encode()
    out = path.with_name(f"edited-{number}.jsonl")
    out.write_bytes(b"\n".join(lines) + b"\n")
    return out


async def test_what_the_file_holds_is_refused_naming_its_line(
    store: ContextStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bytes that are not UTF-8, a lone surrogate, a boolean counter: exit 2, the line named."""
    out = await exported(store, tmp_path, capsys)
    lines = out.read_bytes().splitlines()
    message = json.loads(lines[2])
    point = json.loads(lines[-2])
    cases = [
        (3, lines[2].replace(b"turn 1", b"turn \xff\xfe"), "not UTF-8"),
        (3, lines[2].replace(b"turn 1", b"turn \xed\xa0\x80"), "not UTF-8"),  # a surrogate's bytes
        (3, json.dumps({**message, "message": {"role": "user", "content": "\ud800"}}).encode(), ""),
        (len(lines) - 1, json.dumps({**point, "seq": True}).encode(), "seq"),
        (len(lines) - 1, json.dumps({**point, "created_ms": 2**63}).encode(), "created_ms"),
    ]
    for number, line, said in cases:
        path = edited(out, number, line)
        code = await run_cli(["import", str(path), "--tenant", store.tenant, "--session", "t"])
        err = one_line(capsys.readouterr().err)
        assert code == 2, err
        assert f"line {number}: " in err and said in err, err
        assert not (await store.info("t")).exists


async def test_junk_on_stdin_is_one_line(
    store: ContextStore, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Binary junk, a bare JSON value, a byte-order mark, random bytes: exit 2 and one line."""
    rng = random.Random(11)
    junk = [
        b"\xff\xfe\x00garbage\n",
        b"\x00\x01\x02\x03",
        b"[1, 2]\n",
        b"{}\n",
        b'\xef\xbb\xbf{"ctxstore": "session"}\n',
        b'{"ctxstore": "session", "version": true}\n',
        *(bytes(rng.randrange(256) for _ in range(200)) for _ in range(5)),
    ]
    for data in junk:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
        code = await run_cli(["import", "-", "--tenant", store.tenant])
        err = one_line(capsys.readouterr().err)
        assert code == 2 and re.search(r"line \d+: ", err), (data, err)
    assert await store.list_sessions() == []


def test_junk_on_stdin_of_the_process_is_one_line(settings: Settings) -> None:
    """As a process, with bytes that are not UTF-8 on its stdin: exit 2, one line on stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXSTORE_")}
    assert settings.redis_url is not None
    env |= {"CTXSTORE_REDIS_URL": settings.redis_url, "CTXSTORE_KEY_PREFIX": settings.key_prefix}
    done = subprocess.run(
        [CTXSTORE, "import", "-", "--tenant", "nobody"],
        input=b'{"ctxstore": "session"\xff}\n\x00',
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "line 1: not UTF-8" in one_line(done.stderr.decode())


async def test_a_path_it_cannot_use_is_one_line(
    store: ContextStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An --out it cannot create, an input it cannot read: exit 2, one line naming the path."""
    await store.append("s", turn(0))
    for where in ("/proc/nope/x", str(tmp_path), str(tmp_path / "missing" / "x.jsonl")):
        code = await run_cli(["export", "s", "--tenant", store.tenant, "--out", where])
        err = one_line(capsys.readouterr().err)
        assert code == 2 and f"cannot write {where}" in err, err
    for where in (str(tmp_path), str(tmp_path / "none.jsonl")):
        code = await run_cli(["import", where, "--tenant", store.tenant])
        err = one_line(capsys.readouterr().err)
        assert code == 2 and f"cannot read {where}" in err, err


async def test_an_export_file_is_readable_by_its_writer_alone(
    store: ContextStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new export file is mode 0600, and an existing one is made so before it is written."""
    await store.append("s", turn(0))
    fresh, existing = tmp_path / "new.jsonl", tmp_path / "old.jsonl"
    existing.write_text("old contents\n")
    existing.chmod(0o644)
    for out in (fresh, existing):
        assert await run_cli(["export", "s", "--tenant", store.tenant, "--out", str(out)]) == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o600
        assert "old contents" not in out.read_text()
    capsys.readouterr()


async def test_a_session_with_ids_past_any_date_shows(
    store: ContextStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """Entry ids at 2**63 ms (no date can show): status, view and checkpoint --list answer."""
    header = {"ctxstore": "session", "version": 1, "tenant": store.tenant, "session": "far"}
    records = [
        header,
        {"ctxstore": "message", "id": f"{2**63}-0", "message": turn(0)},
        {"ctxstore": "end", "session": "far", "count": 1},
    ]
    await store.import_sessions([json.dumps(r) for r in records])
    await store.append("far", turn(1))
    await store.checkpoint("far", name="far away")
    for argv in (["status", "far"], ["view", "far"], ["checkpoint", "far", "--list"]):
        code = await run_cli([*argv, "--tenant", store.tenant])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        assert "Traceback" not in captured.err


def test_an_export_to_stdout_is_utf8_whatever_the_terminal(settings: Settings, tenant: str) -> None:
    """With an ASCII stdout, the lines still go out as UTF-8 and import back equal."""
    message = {"role": "user", "content": "naïve 日本語 🚀"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXSTORE_")}
    assert settings.redis_url is not None
    env |= {
        "CTXSTORE_REDIS_URL": settings.redis_url,
        "CTXSTORE_KEY_PREFIX": settings.key_prefix,
        "PYTHONIOENCODING": "ascii",
    }
    setup = (
        "import asyncio, sys\n"
        "from ctxstore import ContextStore, Settings\n"
        "async def main():\n"
        f"    async with ContextStore.from_settings(Settings(), tenant={tenant!r}) as store:\n"
        f"        await store.append('s', {message!r})\n"
        "asyncio.run(main())\n"
    )
    subprocess.run([sys.executable, "-c", setup], env=env, check=True, timeout=60)
    done = subprocess.run(
        [CTXSTORE, "export", "s", "--tenant", tenant], env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode("utf-8").splitlines()
    assert json.loads(lines[1])["message"] == message


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
async def test_a_full_disk_is_one_line(
    store: ContextStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """Writing to a device with no space left: exit 2, one line; the device keeps its mode."""
    await store.append("s", turn(0))
    mode = os.stat("/dev/full").st_mode
    code = await run_cli(["export", "s", "--tenant", store.tenant, "--out", "/dev/full"])
    err = one_line(capsys.readouterr().err)
    assert code == 2 and "cannot write /dev/full" in err, err
    assert os.stat("/dev/full").st_mode == mode


def test_a_closed_stdin_is_one_line(settings: Settings) -> None:
    """`ctxstore import - <&-`: exit 2, one line saying stdin is closed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXSTORE_")}
    assert settings.redis_url is not None
    env |= {"CTXSTORE_REDIS_URL": settings.redis_url, "CTXSTORE_KEY_PREFIX": settings.key_prefix}
    done = subprocess.run(
        ["sh", "-c", f"exec {CTXSTORE} import - --tenant nobody <&-"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "cannot read stdin" in one_line(done.stderr.decode())
