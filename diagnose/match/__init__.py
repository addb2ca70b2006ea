"""One pass over the log: live needles, candidate lines, rule and marker matches, tracebacks,
the server's state (engine, runs, phases, launch, reported numbers) and the serving series.

In: blocks of lines and the knowledge. Out: `ScanResult`.
"""
