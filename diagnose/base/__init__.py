"""What every part stands on: errors said as one line, atomic writes, the user's directories,
where the shipped data lies, the validated-data cache and the redaction of secrets.

In: nothing of the package. Out: `InputError`/`RuleError`, `atomic_write`, `data_cache`,
`redact`, the data directories.
"""
