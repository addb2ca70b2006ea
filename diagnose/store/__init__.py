"""The knowledge base of past incidents: layered stores, atomic writes, similarity.

In: diagnoses and incident files. Out: matching incidents, stored incidents.
"""
