"""Key formatting and id validation: the one place keys are made."""

from __future__ import annotations

import pytest

from ctxstore import ConfigurationError, InvalidIdError
from ctxstore._layout.keys import (
    session_keys,
    tenant_index_pattern,
    tenant_key_pattern,
    tenant_sessions_key,
    validate_id,
    validate_prefix,
)


def test_session_keys_share_one_hash_tag() -> None:
    """Every key of a session carries the hash tag {tenant:session}."""
    keys = session_keys("ctx", "acme", "s-1")
    for key in keys.all():
        assert key.startswith("ctx:{acme:s-1}:")
        assert key.count("{") == key.count("}") == 1
    assert len(set(keys.all())) == len(keys.all())


def test_tenant_keys_are_in_the_tenant_slot() -> None:
    """The tenant's index uses the tag {tenant}, and the ACL patterns cover only it."""
    assert tenant_sessions_key("ctx", "acme") == "ctx:{acme}:sessions"
    assert tenant_key_pattern("ctx", "acme") == "ctx:{acme:*"
    assert tenant_index_pattern("ctx", "acme") == "ctx:{acme}:*"
    # "acme" must not cover "acme2"'s keys.
    other = session_keys("ctx", "acme2", "s").log
    assert not other.startswith("ctx:{acme:")


@pytest.mark.parametrize("good", ["a", "A9", "_x", "user.42", "sess-1_b.c", "x" * 128, "0"])
def test_valid_ids(good: str) -> None:
    """Letters, digits, '_', '.', '-' up to 128 characters are accepted."""
    assert validate_id(good, "session") == good


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "x" * 129,
        "a{b",
        "a}b",
        "a:b",
        "a*",
        "a?",
        "a[b]",
        "a b",
        "a\x00",
        "a\x7f",
        "a\r",
        "..",
        "a..b",
        ".a",
        "-a",
        "é",
        "ａ",
        "tеnant",
        "a/b",
        "a\\b",
        7,
        None,
        b"bytes",
    ],
)
def test_invalid_ids(bad: object) -> None:
    """Anything that could escape a key, or look like another id, is refused."""
    with pytest.raises(InvalidIdError):
        validate_id(bad, "tenant")


@pytest.mark.parametrize("bad", ["", "a{", "a:b", "a b", "x" * 65])
def test_invalid_prefixes(bad: str) -> None:
    """Key prefixes are checked the same way."""
    with pytest.raises(ConfigurationError):
        validate_prefix(bad)
