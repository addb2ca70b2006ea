"""`plan` and `check`: the budget and the advice applied to a launch before it runs.

In: a launch command or a config, the GPUs. Out: problems with their changes, a plan.
"""
