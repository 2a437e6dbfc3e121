"""How a benchmark with a verdict runs: ``--quick``, a Redis under test, an exit status."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from ctxstore.testing import redis_under_test

__all__ = ["run_bench"]


def run_bench(
    run: Callable[[str, bool], Coroutine[Any, Any, bool]],
    doc: str | None,
    argv: Sequence[str] | None,
    quick: str = "fewer samples: a smoke run",
) -> int:
    """Parse ``--quick``, run ``run(url, quick)`` on the Redis under test; 1 when it missed.

    Args:
        run: The benchmark: True when every target was met.
        doc: The module's docstring (its first line describes the command).
        argv: The arguments (``None``: the command line's).
        quick: What ``--quick`` does, for its help.
    """
    parser = argparse.ArgumentParser(description=doc.split("\n")[0] if doc else None)
    parser.add_argument("--quick", action="store_true", help=quick)
    args = parser.parse_args(argv)
    with redis_under_test() as (url, source):
        print(f"Redis: {source}")
        return 0 if asyncio.run(run(url, args.quick)) else 1
