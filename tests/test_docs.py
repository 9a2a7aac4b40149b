"""Documents that stay true: docs/design.md names files and contract members that exist, and the
docs and reports' pages say where things stand, not which session found them."""
from __future__ import annotations

import re
from pathlib import Path

from ddlbench.adapters import base
from ddlbench.adapters.variant import Variant

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"


def test_no_notebook_numbering_in_docs_and_report_pages():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("reports/*/README.md"))]
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in pages
             for m in re.finditer(r"(?i)session \d+", p.read_text())]
    assert not found, found


def test_design_cites_paths_that_exist():
    text = DESIGN.read_text()
    paths = set(re.findall(r"`?(ddlbench/[\w/]+\.py)`?", text))
    assert {"ddlbench/adapters/variant.py", "ddlbench/adapters/base.py", "ddlbench/adapters/precision.py",
            "ddlbench/adapters/parallelize.py"} <= paths
    assert not [p for p in paths if not (ROOT / p).exists()]


def test_design_contract_names_exist():
    """Every name in §3's contract block is a member of the class (or interface) it is listed under."""
    block = DESIGN.read_text().split("## 3.")[1].split("```")[1]
    owners = {"Variant": [Variant], "Strategy": [base.Strategy], "Optional": [], "Periodic": [base.Periodic],
              "CountsOwnCollectives": [base.CountsOwnCollectives], "ModelParallel": [base.ModelParallel]}
    assigned = set(base.Strategy.__init__.__code__.co_names)   # the attributes Strategy.__init__ sets
    from test_contract import declared
    current, missing, seen, named = [], [], 0, {}
    for line in block.splitlines():
        code = line.split("#")[0]
        head = re.match(r"\s*(" + "|".join(owners) + r")\b(\([^)]*\))?:?", code)
        if head:
            current, code = owners[head.group(1)], code[head.end():]
        code = re.sub(r"\([^)]*\)", "", code.split("->")[0])
        for name in re.findall(r"\b[a-z_A-Z][a-z_A-Z]*\b", code):
            seen += 1
            for c in current:
                named.setdefault(c, set()).add(name)
            if not any(hasattr(c, name) or name in declared(c) for c in current) \
                    and not (current == [base.Strategy] and name in assigned):
                missing.append(name)
    assert seen > 30 and not missing, missing
    # and the other way: every public member the Variant declares is in the block
    undocumented = {m for m in declared(Variant) if not m.startswith("_")} - named[Variant]
    assert not undocumented, undocumented
