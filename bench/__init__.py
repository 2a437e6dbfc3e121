"""Benchmarks of ctxstore against raw redis-py; run ``python -m bench.bench``."""
