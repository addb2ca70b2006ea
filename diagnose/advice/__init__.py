"""The next concrete change for a finding, by domain: memory, parallelism, port, weights,
environment, hang and request, each a module of value functions per canonical parameter and
handlers per failure class; `registry` lists them and runs them (`registry.advise`).

In: a finding, its diagnosis so far, the launch and the budget. Out: `Change`s, the first the
one to make.
"""
