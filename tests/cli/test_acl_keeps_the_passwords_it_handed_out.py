"""`ctxstore acl` run again keeps the passwords it handed out, unless `--rotate`, and says so.

The passwords are in the pods' and workers' URLs once deployed: a second run
that made new ones would lock every process out at the next ``ACL LOAD``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import one_line, run_cli

from ctxstore._tenant.acl import POD_USER, WORKER_USER


def acl(tmp_path: Path, *flags: str) -> list[str]:
    """The command line writing users.acl and creds.json in ``tmp_path``."""
    out, credentials = tmp_path / "users.acl", tmp_path / "creds.json"
    return ["acl", "--out", str(out), "--credentials", str(credentials), *flags]


def passwords(tmp_path: Path) -> dict[str, str]:
    """The credentials file's passwords, by user."""
    found: dict[str, str] = json.loads((tmp_path / "creds.json").read_text())
    return found


async def test_a_second_run_keeps_every_password_and_the_acl_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run twice with the same users: the same passwords, the same ACL file, and it says so."""
    assert await run_cli(acl(tmp_path, "--tenant", "acme")) == 0
    first, rendered = passwords(tmp_path), (tmp_path / "users.acl").read_text()
    capsys.readouterr()
    assert await run_cli(acl(tmp_path, "--tenant", "acme")) == 0
    assert passwords(tmp_path) == first
    assert (tmp_path / "users.acl").read_text() == rendered
    said = capsys.readouterr().err.strip()
    assert said == (
        f"wrote 3 users to {tmp_path / 'users.acl'} and their passwords to "
        f"{tmp_path / 'creds.json'}: every password kept from {tmp_path / 'creds.json'}"
    )


async def test_a_new_user_gets_a_new_password_and_the_others_keep_theirs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tenant added on the second run is the only new password, and is named."""
    assert await run_cli(acl(tmp_path)) == 0
    first = passwords(tmp_path)
    capsys.readouterr()
    assert await run_cli(acl(tmp_path, "--tenant", "acme")) == 0
    second = passwords(tmp_path)
    assert {user: second[user] for user in (POD_USER, WORKER_USER)} == first
    assert set(second) == {POD_USER, WORKER_USER, "ctxstore-t-acme"}
    assert capsys.readouterr().err.strip().endswith("2 kept, 1 new (ctxstore-t-acme)")


async def test_rotate_makes_every_password_new(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--rotate: no password is the one the file held, and it says so."""
    assert await run_cli(acl(tmp_path)) == 0
    first = passwords(tmp_path)
    capsys.readouterr()
    assert await run_cli(acl(tmp_path, "--rotate")) == 0
    second = passwords(tmp_path)
    assert set(second) == set(first)
    assert all(second[user] != first[user] for user in first)
    assert capsys.readouterr().err.strip().endswith(": 2 new passwords (--rotate)")


async def test_a_user_no_longer_rendered_is_dropped_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tenant left out of the second run loses its password, and the report names it."""
    assert await run_cli(acl(tmp_path, "--tenant", "acme")) == 0
    capsys.readouterr()
    assert await run_cli(acl(tmp_path)) == 0
    assert set(passwords(tmp_path)) == {POD_USER, WORKER_USER}
    said = capsys.readouterr().err.strip()
    assert said.endswith("; dropped ctxstore-t-acme (not rendered this time)")


@pytest.mark.parametrize(
    "content", [b"{not json", b'["a list"]', b'{"ctxstore-pod": 7}', b"\xff\xfe"]
)
async def test_a_credentials_file_that_is_not_one_exits_2_and_is_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    """A malformed credentials file: one line naming it and --rotate, status 2, nothing written."""
    (tmp_path / "creds.json").write_bytes(content)
    assert await run_cli(acl(tmp_path)) == 2
    line = one_line(capsys.readouterr().err)
    assert str(tmp_path / "creds.json") in line and "--rotate" in line
    assert (tmp_path / "creds.json").read_bytes() == content
    assert not (tmp_path / "users.acl").exists()


async def test_rotate_replaces_a_credentials_file_that_is_not_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--rotate does not read the old file: a malformed one is replaced, status 0."""
    (tmp_path / "creds.json").write_text("{not json")
    assert await run_cli(acl(tmp_path, "--rotate")) == 0
    assert set(passwords(tmp_path)) == {POD_USER, WORKER_USER}
    capsys.readouterr()
