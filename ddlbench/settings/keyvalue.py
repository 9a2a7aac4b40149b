"""The `key=value` arguments of the commands that are not Hydra runs (bench advise, commbench,
project, cluster), read one way: unknown keys and values of the wrong type are errors a user can
act on (ConfigError: the command, the key, what is known or valid)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from ddlbench.errors import ConfigError


@dataclass(frozen=True)
class KeyValues:
    command: str                                          # for messages: "bench advise"
    values: dict[str, str] = field(default_factory=dict)  # known key -> its text
    positional: tuple[str, ...] = ()                      # arguments without '='
    passed: tuple[str, ...] = ()                          # key=value handed on as they are (Hydra overrides)

    def text(self, key: str, default: Optional[str] = None) -> Optional[str]:
        return self.values.get(key, default)

    def integer(self, key: str, default=None, low: int = 1):
        if key not in self.values:
            return default
        try:
            value = int(self.values[key])
        except ValueError:
            raise ConfigError(f"{self.command}: {key} must be an integer, got {self.values[key]!r}") from None
        if value < low:
            raise ConfigError(f"{self.command}: {key} must be >= {low}, got {value}")
        return value

    def number(self, key: str, default=None, *, low: Optional[float] = None, high: Optional[float] = None,
               positive: bool = False) -> Optional[float]:
        """A finite number (nan and inf are refused), within [low, high], > 0 where `positive`."""
        if key not in self.values:
            return default
        text = self.values[key].strip()
        try:
            # YAML's spellings (.nan, .inf) are non-finite numbers too, not typos
            value = float(text[:-4] + "inf" if text.lower().endswith(".inf") else "nan" if text.lower() == ".nan" else text)
        except ValueError:
            raise ConfigError(f"{self.command}: {key} must be a number, got {self.values[key]!r}") from None
        if not math.isfinite(value):
            raise ConfigError(f"{self.command}: {key} must be a finite number, got {self.values[key]!r}")
        if positive and value <= 0:
            raise ConfigError(f"{self.command}: {key} must be > 0, got {value:g}")
        if (low is not None and value < low) or (high is not None and value > high):
            span = f"within [{low:g}, {high:g}]" if low is not None and high is not None else (
                f">= {low:g}" if low is not None else f"<= {high:g}")
            raise ConfigError(f"{self.command}: {key} must be {span}, got {value:g}")
        return value

    def integers(self, key: str, default=None, low: int = 1) -> Optional[list[int]]:
        """`[a,b,c]` of whole numbers >= low (3.5, nan, 'x' are refused, not rounded)."""
        if key not in self.values:
            return default
        out = []
        for text in (x.strip() for x in self.values[key].strip("[]").split(",")):
            if not text:
                continue
            try:
                value = int(text)
            except ValueError:
                raise ConfigError(f"{self.command}: {key} must be a list of integers >= {low}, "
                                  f"got {text!r} in {self.values[key]!r}") from None
            if value < low:
                raise ConfigError(f"{self.command}: {key} must be a list of integers >= {low}, got {value}")
            out.append(value)
        if not out:
            raise ConfigError(f"{self.command}: {key} must list at least one integer >= {low}")
        return out

    def items(self, key: str, convert: Callable[[str], object] = str, default=None) -> Optional[list]:
        """`[a,b,c]` or `a,b,c` -> [convert(a), ...]."""
        if key not in self.values:
            return default
        try:
            return [convert(x.strip()) for x in self.values[key].strip("[]").split(",") if x.strip()]
        except ValueError:
            raise ConfigError(f"{self.command}: {key} must be a list, got {self.values[key]!r}") from None

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        value = self.values.get(key, default)
        if value not in choices:
            raise ConfigError(f"{self.command}: {key} must be {' or '.join(choices)}, got {value!r}")
        return value


def parse_key_values(args: Iterable[str], command: str, known: Iterable[str], *, aliases: Optional[dict] = None,
                     passes: Callable[[str], bool] = lambda key: False, positional: bool = False,
                     required: Iterable[str] = (), usage: str = "", passes_hint: str = "") -> KeyValues:
    """Split `args` into known key=value pairs, pass-through overrides (`passes(key)`) and, where
    `positional`, arguments without '='. `aliases` maps a spelling users type to its key."""
    known, aliases = set(known), aliases or {}
    values, pos, passed = {}, [], []
    tail = f"\n{usage}" if usage else ""
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep:
            if positional:
                pos.append(arg)
                continue
            raise ConfigError(f"{command}: '{arg}' is not key=value{tail}")
        key = aliases.get(key, key)
        if key in known:
            values[key] = value
        elif passes(key):
            passed.append(arg)
        else:
            spelt = sorted(known | set(aliases)) if aliases else sorted(known)
            raise ConfigError(f"{command}: unknown option '{key}' (known: {', '.join(spelt) or 'none'}"
                              f"{'; ' + passes_hint if passes_hint else ''}){tail}")
    for key in required:
        if key not in values:
            raise ConfigError(f"{command}: {key}= is required{tail}")
    return KeyValues(command, values, tuple(pos), tuple(passed))
