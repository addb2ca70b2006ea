"""A diagnosis end to end: sources through the scanner, then the stages (find, triage,
cross-check, advise, conclude, redact), once, for every command and the library.

In: paths or lines, --gpus, --config. Out: `Diagnosis`.
"""
