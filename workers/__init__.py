"""arq workers that precompute summaries for ctxstore sessions.

Start one with ``ctxstore worker``; ``ctxstore worker --check`` exits 0 while
it is healthy. See :mod:`workers.worker`; its log (text or JSON lines, every
one timestamped, never a secret or a message) is set up by :mod:`workers.logs`.

The worker needs ``ctxstore[worker]`` (arq); :mod:`workers.sweep` and
:mod:`workers.logs` do not, so a pod or the CLI can sweep without arq. The
names below are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.worker import SummaryWorker, build_worker, health_check_key, worker_options

__all__ = ["SummaryWorker", "build_worker", "health_check_key", "worker_options"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        value = getattr(importlib.import_module("workers.worker"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'workers' has no attribute {name!r}")
