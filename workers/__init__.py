"""arq workers that precompute summaries for ctxstore sessions.

Start one with ``ctxstore worker``; ``ctxstore worker --check`` exits 0 while
it is healthy. See :mod:`workers.worker`.
"""

from workers.worker import build_worker, health_check_key, worker_options

__all__ = ["build_worker", "health_check_key", "worker_options"]
