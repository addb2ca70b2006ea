"""Searching text fast and safely: many literals in one pass (Aho-Corasick while the needle set
changes, Hyperscan for a long log's blocks), the literals a pattern needs (the prefilter), what
a pattern's parse tree says of its matches, and patterns compiled with a timeout.

In: literals and patterns. Out: needle indexes, `Prefilter`, compiled patterns.
"""
