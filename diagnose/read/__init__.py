"""From bytes to lines: files, stdin, `.gz`, UTF-16 as blocks of whole lines (flat memory),
their prefix layers peeled, the log's clock, and the launch arguments a line or command carries.

In: paths or streams. Out: `Source`, blocks, `Layout`, times, launch parameters.
"""
