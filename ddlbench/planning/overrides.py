"""Sweep expansion of command-line overrides, shared by `bench run -m` and `bench sweep`:
Hydra's basic-sweeper semantics (cross product of comma lists, range()) plus glob(pattern)
over a config group's options."""
from __future__ import annotations

import fnmatch
import re

from ddlbench.errors import ConfigError


def expand_sweep(overrides: list[str]) -> list[list[str]]:
    """Hydra's basic-sweeper semantics: the cross product of comma lists / range(); plus
    glob(pattern) over a config group's options."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from ddlbench.planning.config import GROUPS, group_options

    expanded = []
    for ov in overrides:
        m = re.fullmatch(r"(\w+)=glob\((.+)\)", ov)
        if m and m.group(1) in GROUPS:
            names = [n for n in group_options(m.group(1)) if fnmatch.fnmatch(n, m.group(2))]
            if not names:
                raise ConfigError(f"{ov} matches no {m.group(1)} option")
            ov = f"{m.group(1)}={','.join(names)}"
        expanded.append(ov)
    try:
        parsed = OverridesParser.create().parse_overrides(expanded)
    except Exception as exc:  # hydra's parser errors are user input errors
        raise ConfigError(f"cannot parse overrides: {str(exc).splitlines()[0]}") from None
    return [cell for batch in BasicSweeper.split_arguments(parsed, None) for cell in batch]
