"""Searching text fast and safely: many literals in one pass (Aho-Corasick), the literals a
pattern needs (the prefilter), and patterns compiled with a timeout.

In: literals and patterns. Out: needle indexes, `Prefilter`, compiled patterns.
"""
