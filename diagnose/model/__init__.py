"""The plain data the stages hand each other and the vocabulary that names it.

In: the taxonomy file (rules/taxonomy). Out: `Line`, `Hit`, `Finding`, `Change`, `Diagnosis`
(records), the classes, phases and OOM phases (taxonomy), typed facts and the canonical
parameter names.
"""
