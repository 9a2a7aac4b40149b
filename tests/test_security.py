"""Secrets and hostile strings (issue 8): planted canary tokens never reach a result, log, W&B
file or report; override values with shell metacharacters reach the run literally and execute
nothing; sweep folders are private."""
from __future__ import annotations

import os
import stat
import subprocess

import pytest
from conftest import REPO, bench

CANARIES = {"WANDB_API_KEY": "canaryWANDB7f3a9", "HF_TOKEN": "canaryHF51c2e",
            "MY_SERVICE_TOKEN": "canaryTOKENd81b", "DB_SECRET": "canarySECRET0c4f"}


def _leaks(root, texts=()) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path.relative_to(root)}: {k}" for k, v in CANARIES.items() if v.encode() in data]
    for name, text in texts:
        found += [f"{name}: {k}" for k, v in CANARIES.items() if v in text]
    return found


@pytest.mark.slow
def test_secrets_in_the_environment_reach_no_file(tmp_path):
    env = {**os.environ, **CANARIES, "WANDB_MODE": "offline"}
    run_dir = tmp_path / "run"
    proc = subprocess.run([str(REPO / ".venv/bin/bench"), "run", "debug=fast", "launcher.nproc=2", "logger=wandb",
                           f"run.dir={run_dir}"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=270, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list(run_dir.rglob("wandb-summary.json")) or list(run_dir.rglob("*.wandb")), "W&B wrote nothing"
    rep = subprocess.run([str(REPO / ".venv/bin/bench"), "report", str(run_dir), "-o", str(tmp_path / "report"),
                          "--wandb"], cwd=REPO, env=env, capture_output=True, text=True, timeout=270,
                         stdin=subprocess.DEVNULL)
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert _leaks(tmp_path, [("stdout", proc.stdout + rep.stdout), ("stderr", proc.stderr + rep.stderr)]) == []


def test_a_secret_in_an_unknown_override_is_refused_without_echo(tmp_path):
    proc = bench("run", f"+api_token={CANARIES['MY_SERVICE_TOKEN']}", f"run.dir={tmp_path}/r")
    assert proc.returncode == 2
    assert CANARIES["MY_SERVICE_TOKEN"] not in proc.stdout + proc.stderr
    assert not (tmp_path / "r").exists()


def test_shell_metacharacters_reach_the_run_literally(tmp_path):
    value = "x;touch PWNED && echo $(id) `id` | cat > PWNED2"
    sweep = tmp_path / "sweep"
    proc = subprocess.run([str(REPO / ".venv/bin/bench"), "sweep", "--dir", str(sweep), "debug=fast",
                           f"logger.project='{value}'", "logger=none"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=270, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = list(sweep.rglob("result.json"))
    assert len(results) == 1
    import json
    assert json.loads(results[0].read_text())["config"]["logger"]["project"] == value
    assert not list(tmp_path.rglob("PWNED*")) and not list(REPO.glob("PWNED*"))
    assert stat.S_IMODE(sweep.stat().st_mode) == 0o700


# ---- static audit: no unsafe deserialisation, no shell, no eval in the code we ship ----------
SHIPPED = ("ddlbench", "benchmarks", "scripts", "slurm", "docker")


def _unsafe_calls(tree) -> list[tuple[int, str]]:
    """Calls that could run code from data or through a shell."""
    import ast

    def name(f) -> str:
        parts = []
        while isinstance(f, ast.Attribute):
            parts.append(f.attr)
            f = f.value
        if isinstance(f, ast.Name):
            parts.append(f.id)
        return ".".join(reversed(parts))

    def kw(call, key):
        return next((k.value for k in call.keywords if k.arg == key), None)

    # what each imported name stands for: `from pickle import loads as l` -> l = pickle.loads
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"

    def resolved(f) -> str:
        head, _, rest = name(f).partition(".")
        full = aliases.get(head, head)
        return f"{full}.{rest}" if rest else full

    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        n = resolved(node.func)
        if n in ("eval", "exec", "os.system", "os.popen", "pickle.load", "pickle.loads", "marshal.loads",
                 "yaml.unsafe_load", "yaml.full_load", "yaml.load_all", "dill.load", "shelve.open"):
            bad.append((node.lineno, n))
        elif n == "yaml.load":
            loader = kw(node, "Loader")
            if not (loader is not None and "Safe" in resolved(loader)):
                bad.append((node.lineno, "yaml.load without a SafeLoader"))
        elif n == "torch.load":
            wo = kw(node, "weights_only")
            if not (isinstance(wo, ast.Constant) and wo.value is True):
                bad.append((node.lineno, "torch.load without weights_only=True"))
        elif n.startswith("subprocess.") or n.split(".")[-1] in ("Popen", "run", "check_output", "check_call"):
            sh = kw(node, "shell")
            if isinstance(sh, ast.Constant) and sh.value is True or sh is not None and not isinstance(sh, ast.Constant):
                bad.append((node.lineno, f"{n}(shell=...)"))
    return bad


def test_the_audit_catches_what_it_looks_for():
    import ast
    src = ("import yaml, torch, os, subprocess, pickle\n"
           "yaml.load(s)\nyaml.load(s, Loader=yaml.SafeLoader)\nyaml.safe_load(s)\n"
           "torch.load(p)\ntorch.load(p, weights_only=True)\nos.system('x')\n"
           "subprocess.run('x', shell=True)\nsubprocess.run(['x'])\npickle.loads(b)\neval('1')\nm.eval()\n"
           "from pickle import loads\nfrom os import system as sh\nimport pickle as pk\nfrom subprocess import run\n"
           "loads(b)\nsh('x')\npk.load(f)\nrun('x', shell=True)\nrun(['x'])\nfrom yaml import load, SafeLoader\n"
           "load(s, Loader=SafeLoader)\nload(s)\n")
    assert [line for line, _ in _unsafe_calls(ast.parse(src))] == [2, 5, 7, 8, 10, 11, 17, 18, 19, 20, 24]


def test_shipped_code_never_deserialises_unsafely_or_uses_a_shell():
    """YAML only through safe loaders (Hydra/OmegaConf load configs safely), torch.load only with
    weights_only=True, no pickle of files, no eval/exec, no shell=True or os.system. (Ranks
    exchange Python objects with dist.all_gather_object, which pickles: only between the run's
    own processes, never from a file.)"""
    import ast
    found = []
    for top in SHIPPED:
        for path in sorted((REPO / top).rglob("*.py")):
            for line, what in _unsafe_calls(ast.parse(path.read_text(), str(path))):
                found.append(f"{path.relative_to(REPO)}:{line}: {what}")
    assert found == []
