"""The context-quality eval on the held-out corpus (:mod:`bench.conversations_alt`).

The same replay, policies, budgets, metrics and tables as :mod:`bench.eval`
(its :func:`~bench.eval.evaluate` does the work), on conversations of six
other domains (incident response, contract review, travel planning, ML
experiments, finance reconciliation, IT helpdesk), written by an independent
generator with its own phrasing and correction styles. A summarizer tuned on
the first corpus should score about the same here; a large gap means it fits
that generator's wording rather than the facts.

Run it from the repository root::

    .venv/bin/python -m bench.eval_alt                # 2 seeds x 6 domains
    .venv/bin/python -m bench.eval_alt --quick        # 1 conversation per domain
    .venv/bin/python -m bench.eval_alt --seeds 2,3 --domains legal,mlops --budgets 8000

It prints the tables and writes the report to ``bench/results/eval_alt.json``
(with ``run.corpus`` naming this corpus). The Redis is found as
:mod:`bench.eval` finds it; every key goes under a prefix of the run's own
(``ctxevalalt-<hex>``) and is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from bench.conversations_alt import DOMAINS, corpus
from bench.eval import DEFAULT_BUDGETS, POLICIES, evaluate
from bench.eval import _print as print_tables  # the same tables, rich when installed
from ctxstore.testing import redis_under_test

__all__ = ["RESULTS", "main"]

RESULTS = Path(__file__).resolve().parent / "results" / "eval_alt.json"
DEFAULT_SEEDS = (0, 1)
QUICK_SEEDS = (0,)


def _ints(text: str) -> list[int]:
    try:
        return [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {text!r}") from exc


def _domains(text: str) -> list[str]:
    chosen = [d.strip() for d in text.split(",") if d.strip()]
    unknown = [d for d in chosen if d not in DOMAINS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown domains {unknown}; from {', '.join(DOMAINS)}")
    return chosen


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the arguments, run the eval on the held-out corpus, print and write the report.

    Args:
        argv: The command-line arguments (``sys.argv[1:]`` when ``None``).
    """
    parser = argparse.ArgumentParser(
        prog="python -m bench.eval_alt",
        description="Context quality on the held-out corpus: same policies, budgets, tables.",
    )
    parser.add_argument("--quick", action="store_true", help="one conversation per domain (seed 0)")
    parser.add_argument(
        "--budgets",
        type=_ints,
        default=list(DEFAULT_BUDGETS),
        help="comma-separated token budgets (default: 4000,16000,64000)",
    )
    parser.add_argument(
        "--seeds", type=_ints, default=None, help="comma-separated seeds (default: 0,1)"
    )
    parser.add_argument(
        "--domains", type=_domains, default=list(DOMAINS), help="comma-separated domains"
    )
    parser.add_argument(
        "--json", type=Path, default=RESULTS, help=f"where to write the report ({RESULTS})"
    )
    args = parser.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else QUICK_SEEDS if args.quick else DEFAULT_SEEDS
    if any(b <= 0 for b in args.budgets):
        parser.error("budgets must be positive")
    started = time.perf_counter()
    conversations = corpus(seeds, args.domains)
    generated = time.perf_counter() - started
    with redis_under_test() as (url, source):
        print(f"Redis: {source}; {len(conversations)} held-out conversations", file=sys.stderr)
        report = asyncio.run(
            evaluate(
                url,
                conversations,
                args.budgets,
                prefix=f"ctxevalalt-{uuid.uuid4().hex[:10]}",
                progress=lambda line: print(line, file=sys.stderr, flush=True),
            )
        )
    report["run"] = {
        "corpus": "bench.conversations_alt",
        "seeds": list(seeds),
        "domains": list(args.domains),
        "quick": args.quick,
        "redis": source,
        "generation_seconds": round(generated, 2),
        "total_seconds": round(time.perf_counter() - started, 2),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    print_tables(report)
    print(
        f"\n{len(conversations)} held-out conversations x {len(args.budgets)} budgets x "
        f"{len(POLICIES)} policies in {report['run']['total_seconds']:.1f}s "
        f"(generation {generated:.1f}s); report: {args.json}"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
