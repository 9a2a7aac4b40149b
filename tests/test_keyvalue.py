"""The one key=value reader behind bench advise, commbench, project and cluster."""
from __future__ import annotations

import pytest

from ddlbench.errors import ConfigError
from ddlbench.settings.keyvalue import parse_key_values


def test_known_keys_aliases_pass_through_and_positionals():
    kv = parse_key_values(["RESULT", "launcher.nproc=4", "sizes=[4,8]", "run.seed=3", "gap_ms=1.5", "kinds=a,b"],
                          "x", {"nproc", "sizes", "gap_ms", "kinds", "mode"}, aliases={"launcher.nproc": "nproc"},
                          passes=lambda k: k.startswith("run."), positional=True)
    assert kv.positional == ("RESULT",) and kv.passed == ("run.seed=3",)
    assert (kv.integer("nproc"), kv.items("sizes", int), kv.number("gap_ms"), kv.items("kinds")) == (4, [4, 8], 1.5, ["a", "b"])
    assert kv.text("mode", "auto") == "auto" and kv.integer("iters", 5) == 5 and kv.choice("mode", ("auto", "x"), "auto") == "auto"


@pytest.mark.parametrize("args,kw,needle", [
    (["colour=blue"], {}, "x: unknown option 'colour' (known: a, n)"),
    (["a"], {}, "x: 'a' is not key=value"),
    ([], {"required": ("a",)}, "x: a= is required"),
])
def test_bad_arguments_say_what_and_which_key(args, kw, needle):
    with pytest.raises(ConfigError) as exc:
        parse_key_values(args, "x", {"a", "n"}, **kw)
    assert needle in str(exc.value)


@pytest.mark.parametrize("arg,read,needle", [
    ("n=two", lambda kv: kv.integer("n"), "n must be an integer, got 'two'"),
    ("n=0", lambda kv: kv.integer("n"), "n must be >= 1, got 0"),
    ("n=abc", lambda kv: kv.number("n"), "n must be a number"),
    ("n=[1,x]", lambda kv: kv.items("n", int), "n must be a list"),
    ("a=maybe", lambda kv: kv.choice("a", ("yes", "no"), "no"), "a must be yes or no, got 'maybe'"),
])
def test_values_of_the_wrong_type(arg, read, needle):
    kv = parse_key_values([arg], "x", {"a", "n"})
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[")):
        read(kv)
