"""The adapters' session ids: any string maps onto a valid store id, none shares one, and back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.config import examples

from ctxstore import InvalidIdError
from ctxstore._layout.keys import MAX_ID_LENGTH, validate_id
from ctxstore.integrations._ids import (
    ESCAPED,
    HASHED,
    RESERVED,
    decode_session_id,
    encode_session_id,
)

# Any code point, lone surrogates included (a Python string may hold them, UTF-8 may not).
ANY_TEXT = st.text(
    st.one_of(
        st.characters(exclude_categories=()),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=()),
    ),
    min_size=1,
)
VALID = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}", fullmatch=True).filter(
    lambda value: ".." not in value
)
# Strings near the encoded forms: the reserved prefix, escapes, and other strings' encodings.
TRICKY = st.one_of(
    st.builds(lambda tail: RESERVED + tail, st.text(max_size=40)),
    st.builds(lambda tail: ESCAPED + tail, st.from_regex(r"([A-Za-z0-9_\-]|\.[0-9A-Fa-f]{2})*")),
    st.builds(lambda tail: HASHED + tail, st.from_regex(r"[0-9a-f]{64}", fullmatch=True)),
    ANY_TEXT.map(encode_session_id),
    st.text(max_size=300, min_size=100),
)
STRINGS = st.one_of(ANY_TEXT, VALID, TRICKY).filter(bool)


@settings(max_examples=examples(1000))
@given(STRINGS)
def test_every_string_maps_onto_a_valid_session_id(value: str) -> None:
    """Whatever the string, its id is one the store takes, of at most 128 characters."""
    encoded = encode_session_id(value)
    assert validate_id(encoded, "session") == encoded
    assert len(encoded) <= MAX_ID_LENGTH


@settings(max_examples=examples(1000))
@given(STRINGS)
def test_an_id_that_is_not_hashed_decodes_to_its_string(value: str) -> None:
    """decode_session_id undoes encode_session_id for every id it did not hash."""
    encoded = encode_session_id(value)
    if encoded.startswith(HASHED):
        with pytest.raises(InvalidIdError, match="digest"):
            decode_session_id(encoded)
    else:
        assert decode_session_id(encoded) == value


@settings(max_examples=examples(500))
@given(st.lists(STRINGS, min_size=2, max_size=30, unique=True))
def test_no_two_strings_share_an_id(values: list[str]) -> None:
    """Different strings, valid ids, reserved prefixes and encodings alike, get different ids."""
    assert len({encode_session_id(value) for value in values}) == len(values)


@settings(max_examples=examples(500))
@given(STRINGS, STRINGS)
def test_two_strings_share_an_id_only_when_equal(one: str, other: str) -> None:
    """encode_session_id(a) == encode_session_id(b) exactly when a == b."""
    assert (encode_session_id(one) == encode_session_id(other)) == (one == other)


@settings(max_examples=examples(500))
@given(VALID.filter(lambda value: not value.startswith(RESERVED)))
def test_an_id_the_store_takes_maps_to_itself(value: str) -> None:
    """A valid session id outside the reserved prefix is stored under its own name."""
    assert encode_session_id(value) == value
    assert decode_session_id(value) == value


@settings(max_examples=examples(1000))
@given(st.one_of(ANY_TEXT, TRICKY))
def test_decode_accepts_only_what_encode_makes(session: str) -> None:
    """Any string decode_session_id accepts is the id of the string it returns."""
    try:
        value = decode_session_id(session)
    except InvalidIdError:
        return
    assert encode_session_id(value) == session


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        ("user-123", "user-123"),
        ("Ada Lovelace/1", "_.eAda.20Lovelace.2F1"),
        ("ünï", "_.e.C3.BCn.C3.AF"),
        ("a..b", "_.ea.2E.2Eb"),
        ("_.e", "_.e_.2Ee"),
        (".hidden", "_.e.2Ehidden"),
        ("\ud800", "_.e.ED.A0.80"),
    ],
)
def test_the_documented_forms(value: str, encoded: str) -> None:
    """Valid ids stay; others are escaped byte by byte, the reserved prefix included."""
    assert encode_session_id(value) == encoded
    assert decode_session_id(encoded) == value


def test_an_id_too_long_to_escape_is_hashed() -> None:
    """A string whose escaped form passes 128 characters is its SHA-256, which cannot decode."""
    encoded = encode_session_id("会話" * 30)
    assert encoded.startswith(HASHED)
    assert len(encoded) == len(HASHED) + 64
    assert encode_session_id("x" * 129).startswith(HASHED)
    assert encode_session_id("x" * 128) == "x" * 128


@pytest.mark.parametrize("bad", ["", None, 7, b"bytes"])
def test_an_empty_or_non_string_id_is_refused(bad: object) -> None:
    """An empty string or a non-string is InvalidIdError, never a shared session."""
    with pytest.raises(InvalidIdError):
        encode_session_id(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad", ["_.eabc", "_.e.41", "_.e.c3.bc", "_.e.C3", "_.x", "_.h" + "0" * 63, "a b", ""]
)
def test_a_string_encode_never_makes_is_refused_by_decode(bad: str) -> None:
    """Non-canonical escapes, bad UTF-8, other reserved forms and invalid ids do not decode."""
    with pytest.raises(InvalidIdError):
        decode_session_id(bad)


def test_a_str_subclass_maps_as_its_plain_string() -> None:
    """A str subclass's own methods take no part: it maps as the plain string it holds."""

    class Odd(str):
        def encode(self, *args: object, **kwargs: object) -> bytes:  # type: ignore[override]
            return b"abc"

        def startswith(self, *args: object, **kwargs: object) -> bool:  # type: ignore[override]
            return False

    for plain in ("x/y", "chat-9", "_.eabc"):
        assert encode_session_id(Odd(plain)) == encode_session_id(plain)
