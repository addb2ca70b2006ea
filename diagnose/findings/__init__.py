"""From what the scan matched to findings: class, OOM phase, merging across ranks, order and
status; the engine's own numbers; the cross-check against a GPU snapshot.

In: `ScanResult`, the knowledge, a snapshot. Out: ordered `Finding`s, the status, a hang.
"""
