"""The next concrete change for a finding, by domain: memory, parallelism, port, weights,
environment, hang and request, each a module of value functions per canonical parameter and
handlers per failure class; `registry` lists them and runs them (`registry.advise`)."""
