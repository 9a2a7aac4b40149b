"""Projection validation on the machine the runs were measured on: each run's step time
predicted from a 1-rank run of the same configuration (its compute) and the run's own
collectives priced on the calibrated local network, next to the measured step time.

On a CPU host, ranks share cores: the 1-rank compute is scaled by the oversubscription
max(1, ranks x threads_per_rank / usable_cores) — this machine's effect, stated in the output.
"""
from __future__ import annotations

from ddlbench.network.model import Network, backend_algorithm
from ddlbench.project.projection import compute_seconds, step_comm
from ddlbench.project.workload import from_record


def oversubscription(rec: dict) -> float:
    """Threads per usable core on a node: ranks per node x threads per rank / the cores each
    rank could use (on one host all ranks share its cores; in `bench cluster` each node has its own)."""
    env, par = rec.get("env") or {}, rec.get("parallel") or {}
    hosts = env.get("rank_hosts")
    per_node = (hosts.count(hosts[0]) if hosts else
                (par.get("world_size") or 1) / max(1, par.get("nodes") or 1))
    cores, threads = env.get("usable_cores"), env.get("threads_per_rank")
    return max(1.0, per_node * threads / cores) if cores and threads else 1.0


def predict(rec: dict, single: dict, network: Network, algorithm: str | None = None) -> dict:
    """Predicted vs measured step of `rec` (ok, world >= 1) from the 1-rank run `single`; its
    collectives priced by the algorithm its backend runs (ddlbench.network.model.backend_algorithm)."""
    algorithm = algorithm or backend_algorithm((rec.get("env") or {}).get("backend"))
    work, one = from_record(rec), from_record(single)
    if one.world != 1:
        raise ValueError("the reference must be a 1-rank run")
    compute = compute_seconds(work, compute_from=one)[0] * oversubscription(rec) / oversubscription(single)
    comm, parts, exposed = step_comm(work, network, work.world, algorithm, measured_groups=True)
    predicted = compute + exposed
    return {"strategy": work.label, "world": work.world, "measured_step_s": work.step_s,
            "predicted_step_s": predicted, "compute_s": compute, "comm_s": comm, "exposed_comm_s": exposed,
            "comm_parts_s": parts,
            "oversubscription": oversubscription(rec), "algorithm": algorithm,
            "relative_error": (predicted - work.step_s) / work.step_s}
