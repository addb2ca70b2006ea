"""The command line: a module per command group, each command a thin wrapper over a function
its part exports; `scan` without a CLI framework (it must start fast).

In: argv. Out: an exit code.
"""
