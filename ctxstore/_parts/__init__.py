"""One tenant's I/O parts over a scope.

Writes and edits, reads, the view's snapshot and anchor, summaries, lineage,
checkpoints, branches, forks, archive, search; assembled for the store.
"""
