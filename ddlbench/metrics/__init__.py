"""Pure functions for every number ddlbench reports (docs/design.md §5). No torch imports here."""
