"""`watch` and `run`: a log followed as it grows (or a server started as a child), phases as
they pass and a verdict on the first fatal line, ready, or a hang.

In: a file or a command. Out: a `Verdict` and the live view.
"""
