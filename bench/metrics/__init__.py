"""Pure functions for every number ddlbench reports (DESIGN §5). No torch imports here."""
