"""One module per model family, each exporting FAMILY (ddlbench/models/family.py: the contract;
docs/adding-a-model.md: the checklist). A module here is a family: no helpers in this package."""
