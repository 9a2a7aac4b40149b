"""A task srun started on a node of a two-dimensional `bench cluster` moves into its device.

slurmd runs in the node's network namespace; the cluster's devices are namespaces of their own,
each linked to the node's switch at dev_link (ddlbench/cluster/plan.py). `bench cluster exec`
names the cluster's state file in $DDLBENCH_CLUSTER_DEVICES; a `bench` process started by srun
there (a rank of `bench run launcher=slurm`, of `bench commbench`) re-executes itself, first
thing, inside the namespace of device SLURM_LOCALID of its node, pinned to that device's cores,
with gloo on the device's link (GLOO_SOCKET_IFNAME=eth0). The rendezvous host is then the first
node's device 0 (`master_host`). Pure lookups here; `enter` is the one call with effects.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

from ddlbench.errors import ConfigError

ENV = "DDLBENCH_CLUSTER_DEVICES"     # the cluster's cluster.json, where it has device namespaces
INSIDE = "DDLBENCH_DEVICE"           # set once the task is in its device (the device's name)


def device_of(plan: dict, node: str, local_id: int) -> dict:
    """The plan's device `local_id` of `node` (cluster.json's form)."""
    found = next((n for n in plan["nodes"] if n["name"] == node), None)
    if found is None:
        raise ConfigError(f"node {node!r} is not a node of cluster {plan['name']}")
    devices = found.get("devices") or []
    if local_id >= len(devices):
        raise ConfigError(f"task {local_id} on {node}: the node has {len(devices)} devices (one task per device: "
                          f"srun --ntasks-per-node <= {len(devices)})")
    return devices[local_id]


def master_host(first_node: str, environ=os.environ) -> str:
    """The rendezvous host: the first node, or in a cluster with device namespaces its device 0
    (rank 0 listens there, not in the node's namespace)."""
    return f"{first_node}d0" if environ.get(INSIDE) else first_node


def nsenter_argv(device: dict, argv: list[str]) -> list[str]:
    return ["nsenter", f"--net=/run/netns/{device['name']}", "--", *argv]


def enter(environ=os.environ) -> Optional[dict]:
    """Re-execute this process inside its device when it is a task of such a cluster not yet in
    one; returns None otherwise (nothing to do). Called first thing by `bench`."""
    path = environ.get(ENV)
    if not path or environ.get(INSIDE) or "SLURM_LOCALID" not in environ or "SLURMD_NODENAME" not in environ:
        return None
    plan = json.loads(Path(path).read_text())["plan"]
    device = device_of(plan, environ["SLURMD_NODENAME"], int(environ["SLURM_LOCALID"]))
    os.environ[INSIDE] = device["name"]
    os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
    os.sched_setaffinity(0, device["cores"])
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp("nsenter", nsenter_argv(device, list(sys.orig_argv)))
    return device    # not reached
