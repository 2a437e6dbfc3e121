"""A Redis URL redis-py would misread (connecting elsewhere) or refuse is refused, with why.

``redis:/10.9.9.9:1/5`` (one slash) has no host: redis-py connects to
localhost, so the command answered from the wrong server.
"""

from __future__ import annotations

import pytest

from ctxstore import ConfigurationError, Settings

NO_DATABASE = "the database, after the host and a slash, must be a number"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis:/10.9.9.9:1/5", "names no host (redis://HOST:PORT/DB, two slashes"),
        ("rediss:///0", "names no host (rediss://HOST:PORT/DB"),
        ("redis://10.9.9.9:sixty/0", "its port must be a number from 1 to 65535"),
        ("redis://10.9.9.9:0/0", "its port must be a number from 1 to 65535"),
        ("redis://10.9.9.9:70000/0", "its port must be a number from 1 to 65535"),
        (
            "redis://10.9.9.9:6379/five",
            "the database, after the host and a slash, must be a number",
        ),
        ("redis://10.9.9.9:6379/0/1", "the database, after the host and a slash, must be a number"),
        ("redis://10.9.9.9:6379?db=x", "its db= must be a number"),
        (
            "unix://run/redis.sock",
            "its socket's path follows three slashes (unix:///run/redis.sock)",
        ),
        ("unix://", "names no socket path"),
        ("http://10.9.9.9:6379", "must be a redis://, rediss:// or unix:// URL, not http://"),
        ("10.9.9.9:6379", "not a URL without a scheme"),
        ("", "not a URL without a scheme"),
    ],
)
def test_a_malformed_store_url_is_refused_naming_the_part_to_fix(url: str, reason: str) -> None:
    """Each malformed URL: a ConfigurationError naming CTXSTORE_REDIS_URL and what is wrong."""
    with pytest.raises(ConfigurationError) as refused:
        Settings(redis_url=url)
    assert "CTXSTORE_REDIS_URL (redis_url)" in str(refused.value)
    assert reason in str(refused.value)


def test_the_reason_never_quotes_the_password() -> None:
    """A URL with a password and a bad part: refused without the password in the message."""
    with pytest.raises(ConfigurationError) as refused:
        Settings(redis_url="redis://ops:s3cret-pw@10.9.9.9:6379/zero")
    assert "s3cret-pw" not in str(refused.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis://10.9.9.9:6379/0",
        "redis://10.9.9.9",
        "redis://10.9.9.9/",
        "redis://ops:pw@redis.internal:6380/2?protocol=2",
        "rediss://[::1]:7000/1",
        "redis://10.9.9.9:6379?db=3",
        "unix:///run/redis.sock",
        "unix://ops:pw@/run/redis.sock?db=1",
    ],
)
def test_a_well_formed_store_url_is_taken_as_given(url: str) -> None:
    """The forms redis-py reads as written are accepted unchanged."""
    assert Settings(redis_url=url).redis_url == url


NO_DATABASE = "the database, after the host and a slash, must be a number"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis:/10.9.9.9:1/5", "names no host"),
        ("http://10.9.9.9:6379", "or redis+sentinel://, not http://"),
    ],
)
def test_a_malformed_queue_url_is_refused_naming_its_variable(url: str, reason: str) -> None:
    """The queue's URL is held to the same forms (or a sentinel one), naming CTXSTORE_QUEUE_URL."""
    with pytest.raises(ConfigurationError) as refused:
        Settings(queue_url=url)
    assert "CTXSTORE_QUEUE_URL (queue_url)" in str(refused.value) and reason in str(refused.value)
    assert Settings(queue_url="redis+sentinel://s1:26379,s2/queue/1").queue_url is not None
