"""`probe`: the minimal completion that proves a server serves, and the concurrency sweep.

In: a URL. Out: `ProbeResult`, `Sweep`.
"""
