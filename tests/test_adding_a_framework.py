"""docs/adding-a-framework.md's checklist, checked for every conf/framework variant (no process
group, nothing trained): a new framework that skips an item fails here with the item's number."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ddlbench.adapters.base import Strategy
from ddlbench.adapters.variant import Variant
from ddlbench.planning.config import compose_raw, group_options, load_variant_class

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "adding-a-framework.md"
FRAMEWORK_PACKAGES = ("deepspeed", "horovod", "fairscale")


def test_the_guide_names_files_that_exist():
    text = GUIDE.read_text()
    paths = set(re.findall(r"`((?:ddlbench|tests|docs|conf)/[\w/.]+\.(?:py|md))`", text))
    assert {"ddlbench/adapters/variant.py", "ddlbench/adapters/base.py", "ddlbench/adapters/parallelize.py",
            "docs/frameworks.md", "tests/test_cost_model.py"} <= paths
    assert not [p for p in paths if not (ROOT / p).exists()]
    assert [int(n) for n in re.findall(r"^(\d)\. \*\*", text, re.M)] == list(range(1, 8))


@pytest.mark.parametrize("name", group_options("framework"))
def test_every_variant_follows_the_checklist(name):
    fw = compose_raw([f"framework={name}"])["framework"]
    # 4: the YAML
    assert {"name", "variant", "adapter", "equivalent_to_ddp", "options"} <= set(fw), f"item 4: {sorted(fw)}"
    module, _, cls_name = fw["adapter"].partition(":")
    path = ROOT / Path(*module.split(".")).with_suffix(".py")
    assert path.parent == ROOT / "ddlbench" / "adapters" and path.exists(), f"item 4: {fw['adapter']}"
    # 1 and 2: the options and the variant
    cls = load_variant_class(fw["adapter"])
    assert issubclass(cls, Variant) and cls.name not in ("", "base"), f"item 2: {cls}"
    config = cls.Options.model_config
    assert config.get("extra") == "forbid" and config.get("frozen") is True, f"item 1: {cls.Options}"
    tree = ast.parse(path.read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    imported = {a.name.split(".")[0] for n in top if isinstance(n, ast.Import) for a in n.names} | {
        (n.module or "").split(".")[0] for n in top if isinstance(n, ast.ImportFrom)}
    assert not imported & set(FRAMEWORK_PACKAGES), f"item 2: {path.name} imports {imported & set(FRAMEWORK_PACKAGES)}"
    # 3: the strategy, in the same file, with its own setup, train_step and describe
    assert cls.strategy.partition(":")[0] == module, f"item 3: {cls.strategy}"
    strategy = cls(cls.Options(**fw["options"])).strategy_class()
    assert issubclass(strategy, Strategy), f"item 3: {strategy}"
    missing = [m for m in ("setup", "train_step", "describe") if getattr(strategy, m) is getattr(Strategy, m)]
    assert not missing, f"item 3: {strategy.__name__} does not implement {missing}"
    # 5: the frameworks page names the variant
    assert f"`{name}`" in (ROOT / "docs" / "frameworks.md").read_text(), f"item 5: docs/frameworks.md lacks `{name}`"
