"""The Redis edge: the only part of the store that imports redis-py.

(Besides it: ``summary_queue``'s Sentinel lookup, ``testing``'s servers and the arq worker.)
"""
