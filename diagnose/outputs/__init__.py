"""A diagnosis for people and machines: calm rich text, JSON (schema 1) and Markdown, one
registry; a renderer is imported only when chosen.

In: `Diagnosis`. Out: text on a stream.
"""
