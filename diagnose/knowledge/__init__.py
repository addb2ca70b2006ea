"""What a scan knows before it reads a line: rules, engine profiles, the mined templates of the
engines' sources, their schemas, and the value of a setting in force.

In: the YAML/JSON under rules/ (shipped, --rules, DIAGNOSE_RULES). Out: `RuleSet`, `Profiles`,
`Knowledge`, mined templates, `value_in_force`.
"""
