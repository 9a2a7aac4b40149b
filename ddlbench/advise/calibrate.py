"""`bench advise`, phase 1: the calibration runs (1-rank DDP at the grid's smallest and largest
micro-batch, and one 1-rank run of every other framework) and the overrides every run gets."""
from __future__ import annotations

import math

from ddlbench.advise.grid import Candidate
from ddlbench.advise.options import GiB
from ddlbench.errors import ConfigError


def spread_overrides(devices: int, per_node: int, backend: str) -> list[str]:
    """What a measured candidate adds to run on the nodes its devices fill: with backend=slurm and
    more devices than a node has (inside `bench cluster`: one core per node), one Slurm task per
    rank over ceil(devices / per_node) nodes (the sweep's Slurm back end sizes the job from them);
    on one node nothing (the local launcher)."""
    nodes = math.ceil(devices / per_node)
    return ["launcher=slurm", f"launcher.nodes={nodes}"] if backend == "slurm" and nodes > 1 else []


def calibration_overrides(framework: str, model: str, micro_batch: int, extra: list[str],
                          threads: int | None, ranks: int = 1) -> list[str]:
    """One rank (or `ranks`: the sharded calibration), no accumulation; on CPU with the threads
    each candidate's rank gets (the cores divided among the devices), so its compute is a
    device's compute."""
    return [f"framework={framework}", f"model={model}", f"launcher.nproc={ranks}",
            f"run.global_batch={micro_batch * ranks}",
            *([f"launcher.threads_per_rank={threads}"] if threads else []), *extra]


# advise's method names two configurations (conf/framework) once, here: the compute line is measured
# with DDP (one device: no communication, its step the model's compute) and, where the model does not
# fit one device, with FSDP2 full shard over every device (its priced communication taken off)
BASELINE = "ddp"
SHARDED_CALIBRATION = "fsdp_full"


def calibration_plan(cell: dict, opts: dict, extra: list[str], threads: int | None, prof, per_node: int,
                     limit: int, device: str):
    """(overrides, plan, cost) of a calibration cell that fits one device by the estimate. A 1-rank
    DDP cell that does not fit (a model too big for one device: where sharding advice matters
    most) becomes FSDP2 full shard over every device, whose compute is the step it measures less
    the communication the network model prices (rank_candidates); any other 1-rank cell that does
    not fit is skipped. Raises ConfigError with the reason."""
    from ddlbench.estimate.memcheck import cost_of_plan, estimate_plan
    from ddlbench.planning.config import plan_from_overrides

    if cell.get("own_collectives"):      # fixed size: the framework's collectives at `ranks`
        over = calibration_overrides(cell["framework"], opts["model"], cell["micro_batch"], extra, threads,
                                     cell["ranks"])
        over += spread_overrides(cell["ranks"], per_node, opts["backend"])
        plan = plan_from_overrides(over)
        return over, plan, cost_of_plan(plan, prof, per_node)
    for ranks in ([1, opts["devices"]] if cell["framework"] == BASELINE and opts["devices"] > 1 else [1]):
        fw = cell["framework"] if ranks == 1 else SHARDED_CALIBRATION
        over = calibration_overrides(fw, opts["model"], cell["micro_batch"], extra, threads, ranks)
        plan = plan_from_overrides(over)
        cost = cost_of_plan(plan, prof, per_node)
        if cost is None:
            return over, plan, cost
        est = estimate_plan(plan, prof, cost, device)["total"]
        if est <= limit:
            if ranks > 1:
                cell.update(framework=fw, ranks=ranks, stands_in_for=BASELINE)
            return over, plan, cost
    raise ConfigError(f"does not fit one device: estimated {est / GiB:.2f} GiB > {limit / GiB:.2f} GiB"
                      + (f", and {SHARDED_CALIBRATION} over {opts['devices']} devices neither" if ranks > 1 else ""))


def own_collectives_ranks(devices: int, per_node: int) -> int:
    """The world of the run that measures a framework's own collectives: the advice's devices, at
    most one node's (the most a calibration should hold), never fewer than 2 (a collective needs a
    peer); 0 when the advice is for one device (no collective to price)."""
    return 0 if devices < 2 else min(devices, max(per_node, 2))


def calibration_cells(survivors: list[Candidate], calibrate: str, devices: int = 1, per_node: int = 1) -> list[dict]:
    """DDP at the smallest and largest micro-batch (the compute line); with calibrate=frameworks
    also every other framework at 1 rank at its largest micro-batch (its own overhead on one
    device: hooks, DTensor, engine, library memory), and a framework whose collectives bypass c10d
    (its Variant's own_collectives: Horovod) once more at the same micro-batch over
    own_collectives_ranks devices: what its communication costs beyond the network model's price
    of torch's (rank.comm_factor)."""
    mbs = sorted({c.layout.micro_batch for c in survivors}) or [1]
    cells = [{"framework": BASELINE, "micro_batch": m} for m in sorted({mbs[0], mbs[-1]})]
    if calibrate == "frameworks":
        ranks = own_collectives_ranks(devices, per_node)
        for fw in dict.fromkeys(c.framework for c in survivors):
            if fw != BASELINE:
                m = max(c.layout.micro_batch for c in survivors if c.framework == fw)
                cells.append({"framework": fw, "micro_batch": m})
                own = next(c.plan.variant.abilities().own_collectives for c in survivors if c.framework == fw)
                if ranks and own:
                    cells.append({"framework": fw, "micro_batch": m, "ranks": ranks, "own_collectives": True})
    return cells
