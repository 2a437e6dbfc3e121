"""The run's own names and shapes: its key prefix, the backends, the summary window, the repo.

``tests/conftest.py`` builds its fixtures from these; test modules import them from here
(never from conftest).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ctxstore.testing import LocalCluster as Cluster

REPO = Path(__file__).resolve().parents[2]
"""The repository's root (where pyproject.toml, README.md, bench/ and deploy/ are)."""

RUN_PREFIX = f"ctxtest-{uuid.uuid4().hex[:10]}"
"""The key prefix of this run: every key it writes starts with it, and only those are removed."""

BACKENDS = ["single", "cluster"]
"""The ``backend`` fixture's values: contract test modules run every test on both."""

SUMMARY_TRIGGER = 400
"""Tokens past the watermark that make a summary due, in ``summary_settings``."""
SUMMARY_KEEP = 150
"""Tokens a summary leaves raw, in ``summary_settings``."""


THOROUGH = os.environ.get("CTXSTORE_TESTS", "thorough" if os.environ.get("CI") else "quick") == (
    "thorough"
)
"""Property tests draw every example they ask for (CI, or ``CTXSTORE_TESTS=thorough``);
otherwise (``quick``, a developer's default) a fifth of them."""


def examples(wanted: int) -> int:
    """How many examples a property test draws: ``wanted`` when thorough, else a fifth (>= 10)."""
    return wanted if THOROUGH else max(10, wanted // 5)


@contextmanager
def cluster_or_skip(**shape: int) -> Iterator[Cluster]:
    """A Redis Cluster of one's own (3 primaries, 3 replicas), stopped on exit.

    The test (or fixture) is skipped when none can start here. ``shape``: another
    ``primaries=`` or ``replicas=``.
    """
    try:
        running = Cluster.start(**shape)
    except RuntimeError as exc:
        pytest.skip(f"no Redis Cluster here: {exc}")
    try:
        yield running
    finally:
        running.stop()
