"""`bench cluster up [nodes=2] [link=1gbit] [name=box] [comm_threads=fifo]`, `bench cluster status [name=box]`,
`bench cluster exec [name=box] -- CMD ...`, `bench cluster down [name=box]`.

`up` builds the cluster (ddlbench/cluster/world.py) from a plan (ddlbench/cluster/plan.py) and waits
until Slurm has every node idle; a failure at any step ends whatever was started (never a
half-built cluster). `exec` runs CMD on the login node: the head's network and hostname, the
cluster's hosts file and SLURM_CONF, so `srun`, `sbatch` and `sacct` work as on a real one.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from ddlbench.cluster import device_task, world
from ddlbench.cluster import plan as planning
from ddlbench.comm import threads as commthreads
from ddlbench.errors import ConfigError

USAGE = ("usage: bench cluster up [nodes=N] [link=RATE] [devices_per_node=D dev_link=RATE] [name=NAME] "
         "[comm_threads=fifo|fair] [mtu=BYTES]   |   bench cluster status [name=NAME]   |   "
         "bench cluster exec [name=NAME] -- CMD ...   |   bench cluster down [name=NAME]")
STATE_FILE = "cluster.json"


def parse(args: list[str], allowed: set[str]) -> dict:
    from ddlbench.settings.keyvalue import parse_key_values
    return parse_key_values(args, "bench cluster", allowed, usage=USAGE).values


def load_state(name: str) -> dict | None:
    path = planning.state_dir(name) / STATE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def login_pid(state: dict) -> int | None:
    """slurmctld's pid: its namespaces are the login node's."""
    return world.read_pid(Path(state["plan"]["state"]) / "pids" / "slurmctld.pid")


def enter(state: dict, cmd: list[str], **kw) -> subprocess.CompletedProcess:
    pid = login_pid(state)
    if pid is None:
        raise ConfigError(f"cluster {state['plan']['name']} is not up (no slurmctld); `bench cluster up` first")
    env = ["env", f"SLURM_CONF={state['plan']['state']}/slurm.conf",     # srun/sbatch pass these on
           f"DDLBENCH_NETWORK={state['plan']['state']}/network.yaml",
           f"{commthreads.ENV}={state['plan'].get('comm_threads', 'fair')}"]
    if state["plan"].get("dev_link"):      # tasks move into their device's namespace (cluster/device_task.py)
        env.append(f"{device_task.ENV}={state['plan']['state']}/{STATE_FILE}")
    return subprocess.run(["nsenter", "-t", str(pid), "-m", "-n", "-u", "--", *env, *cmd], **kw)


def _write_files(p: planning.Plan) -> None:
    s = Path(p.state)
    for sub in ("munge", "pids", "logs", "ctld", "spool"):
        (s / sub).mkdir(parents=True, exist_ok=True)
    (s / "hosts").write_text(planning.hosts_file(p))
    mem_mb = max(1000, int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 / len(p.nodes)) - 512)
    (s / "slurm.conf").write_text(planning.slurm_conf(p, mem_mb))
    (s / "slurmdbd.conf").write_text(planning.slurmdbd_conf(p))
    os.chmod(s / "slurmdbd.conf", 0o600)
    key = s / "munge" / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    os.chmod(s / "munge", 0o700)
    (s / "network.yaml").write_text(yaml.safe_dump(planning.network_description(p), sort_keys=False))
    script = world.build_script(p)
    # first of all, the world says which mount namespace it is (so a failure can end it)
    (s / "build.sh").write_text(f"readlink /proc/self/ns/mnt > {s}/world\n" + script)


def up(args: list[str]) -> int:
    opts = parse(args, {"nodes", "link", "name", "comm_threads", "devices_per_node", "dev_link", "mtu"})
    name = opts.get("name", "box")
    if not name.isidentifier():
        raise ConfigError(f"name={name!r}: letters, digits and '_' only")
    why = world.preflight()
    if why:
        raise ConfigError(why)
    old = load_state(name)
    if old and login_pid(old):
        raise ConfigError(f"cluster {name} is already up ({old['plan']['state']}); `bench cluster down name={name}` first")
    try:
        nodes, devices = int(opts.get("nodes", 2)), int(opts.get("devices_per_node", 1))
        mtu = int(opts.get("mtu", planning.DEFAULT_MTU))
    except ValueError:
        raise ConfigError(f"nodes, devices_per_node and mtu are integers, got {opts.get('nodes')!r}, "
                          f"{opts.get('devices_per_node')!r}, {opts.get('mtu')!r}") from None
    state_path = planning.state_dir(name)
    if old and old.get("world"):
        world.end_world(old["world"])  # what is left of a previous cluster whose controller died
    if state_path.exists():
        shutil.rmtree(state_path)      # a previous cluster's files: logs, database, spool
    p = planning.make_plan(nodes, opts.get("link", "1gbit"), sorted(os.sched_getaffinity(0)), str(state_path), name,
                           opts.get("comm_threads", "fifo"), devices, opts.get("dev_link"), mtu)
    _write_files(p)
    dims = f", {devices} devices a node on links of {p.dev_link} into its switch" if p.dev_link else ""
    print(f"cluster {name}: {nodes} nodes ({', '.join(f'{n.name} {n.addr} cores {list(n.cores)}' for n in p.nodes)}), "
          f"links {p.link} (tbf, both directions, MTU {p.mtu}){dims}, communication threads {p.comm_threads}; state in {p.state}",
          flush=True)
    try:
        proc = subprocess.run(["unshare", "-m", "-n", "--propagation", "private", "bash", f"{p.state}/build.sh"],
                              capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
        failure = proc.returncode and (proc.stderr.strip().splitlines() or ["?"])[-1]
    except subprocess.TimeoutExpired:
        failure = "it ran past 180 s"
    mnt = (Path(p.state) / "world").read_text().strip() if (Path(p.state) / "world").exists() else None
    state = {"plan": p.to_dict(), "world": mnt, "network": f"{p.state}/network.yaml"}
    if failure:
        _abort(mnt, f"building the cluster failed: {failure} (logs in {p.state}/logs)")
    (Path(p.state) / STATE_FILE).write_text(json.dumps(state, indent=1))
    try:
        _wait_idle(state, len(p.nodes))
    except ConfigError as exc:
        _abort(mnt, str(exc))
    print(f"cluster {name} is up: login with `bench cluster exec name={name} -- CMD` (srun, sbatch, sacct); "
          f"network description {state['network']}")
    return 0


def _abort(mnt: str | None, message: str) -> None:
    if mnt:
        world.end_world(mnt)
    raise ConfigError(message + "; everything started was stopped")


def _wait_idle(state: dict, nodes: int, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if login_pid(state):
            try:
                proc = enter(state, ["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=15)
            except subprocess.TimeoutExpired:
                last = "sinfo did not answer within 15 s"
                continue
            last = proc.stdout.strip() + proc.stderr.strip()
            idle = [line for line in proc.stdout.splitlines() if line.split()[-1:] == ["idle"]]
            if len(idle) == nodes:
                return
        time.sleep(1)
    raise ConfigError(f"Slurm did not report {nodes} idle nodes within {timeout_s:g} s (last: {last or 'no answer'})")


def status(args: list[str]) -> int:
    name = parse(args, {"name"}).get("name", "box")
    state = load_state(name)
    if not state or not login_pid(state):
        print(f"cluster {name}: down")
        return 1
    p = state["plan"]
    dims = f", {len(p['nodes'][0]['devices'])} devices a node, device links {p['dev_link']}" if p.get("dev_link") else ""
    print(f"cluster {name}: up; {len(p['nodes'])} nodes, links {p['link']}{dims}, MTU "
          f"{p.get('mtu', planning.DEFAULT_MTU)}, communication threads "
          f"{p.get('comm_threads', 'fair')}; {len(world.processes_in(state['world']))} "
          f"processes in its world; network description {state['network']}")
    enter(state, ["sinfo", "-N", "-o", "%N %T %c %C"], timeout=15)
    return 0


def exec_(args: list[str]) -> int:
    if "--" not in args:
        raise ConfigError(f"bench cluster exec: put the command after --\n{USAGE}")
    i = args.index("--")
    name = parse(args[:i], {"name"}).get("name", "box")
    cmd = args[i + 1:]
    if not cmd:
        raise ConfigError("bench cluster exec: no command after --")
    state = load_state(name)
    if not state:
        raise ConfigError(f"cluster {name} is not up; `bench cluster up name={name}` first")
    sys.stdout.flush()
    return enter(state, cmd).returncode


def down(args: list[str]) -> int:
    name = parse(args, {"name"}).get("name", "box")
    state = load_state(name)
    if not state:
        print(f"cluster {name}: not up; nothing to do")
        return 0
    if login_pid(state):
        try:
            enter(state, ["scancel", "--full", f"--user={os.getuid()}"], capture_output=True, timeout=15)
        except subprocess.TimeoutExpired:
            pass     # the processes are ended below either way
    left = world.end_world(state["world"]) if state.get("world") else []
    if left:
        print(f"cluster {name}: processes still alive after SIGKILL: {left}", file=sys.stderr)
        return 1
    (Path(state["plan"]["state"]) / STATE_FILE).unlink(missing_ok=True)
    print(f"cluster {name}: down (every process of its world ended; its namespaces, links and qdiscs went with "
          f"them; logs kept in {state['plan']['state']}/logs)")
    return 0


def run(args: list[str]) -> int:
    verbs = {"up": up, "status": status, "exec": exec_, "down": down}
    if not args or args[0] not in verbs:
        raise ConfigError(USAGE)
    return verbs[args[0]](args[1:])
