"""Per-rank entry points. `rank_main` is started by the elastic agent (torchrun environment);
`ddlbench.launch.hvd_worker` by Horovod's starter (ddlbench/launch/horovod.py). Both run `run_rank`."""
from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import time
from datetime import timedelta
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from ddlbench.launch.records import CHOICES
from ddlbench.lifecycle import events
from ddlbench.rank.faults import before_process_group
from ddlbench.record.rundir import RunDir


def pick_device(requested: str):
    import torch

    from ddlbench.machine.device import cuda_index, harness_backend, resolve_device
    if resolve_device(requested, torch.cuda.is_available(), torch_cuda=torch.version.cuda) == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        return torch.device("cuda", cuda_index(local_rank, torch.cuda.device_count())), harness_backend("cuda")
    return torch.device("cpu"), "gloo"


def run_rank(run_dir: str, threads: int, plan=None) -> None:
    """Validate the saved config, join the process group (env:// from RANK, WORLD_SIZE,
    MASTER_ADDR/PORT), run the runner."""
    import torch
    import torch.distributed as dist

    from ddlbench.adapters.base import RankContext
    from ddlbench.adapters.common import peak_rss_bytes
    from ddlbench.lifecycle import quiet
    from ddlbench.planning.config import validate
    from ddlbench.rank import runner
    quiet.install()      # a spawned rank imports the model's libraries itself
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)   # the agent ignores it; a rank must not
    # a forked rank inherits the launcher's stop handlers (ddlbench.lifecycle.signals: raise) and torch
    # elastic's agent's (raise SignalException): a rank its launcher kills on the way out would print
    # that exception's traceback on the user's terminal (rank 0 keeps it) before it died. It just ends.
    from ddlbench.lifecycle.signals import STOP_SIGNALS
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    from ddlbench.lifecycle.stop import block_stop_signal
    block_stop_signal()      # before any thread exists: only install_rank_handler's thread takes it
    # a run past run.timeout_s: the launcher asks every rank for its Python stacks
    faulthandler.register(signal.SIGUSR2, file=_stack_file(run_dir), all_threads=True)
    run_dir_p = Path(run_dir)
    events.mark(run_dir_p, "rank_start", int(os.environ.get("RANK", 0)))
    if plan is None:
        from ddlbench.lifecycle.ownership import check_token
        check_token(run_dir_p)     # the config.json here is this rank's launcher's, not a neighbour's
        choices = run_dir_p / CHOICES
        chosen = json.loads(choices.read_text()).get("micro_batch_auto") if choices.exists() else None
        plan = validate(json.loads(RunDir(run_dir_p).config_json.read_text()), chosen)
    torch.set_num_threads(threads)
    device, backend = pick_device(plan.cfg.run.device)
    if device.type == "cpu":     # before the model exists: its buffers are reused from the first step
        from ddlbench.rank import malloc
        malloc.steady()
    if device.type == "cuda":
        from ddlbench.machine.device import cudnn_benchmark
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = cudnn_benchmark(plan.cfg.model.kind, device.type)
        if plan.cfg.run.device_memory_gb is not None:    # emulate a smaller GPU: cap the allocator
            from ddlbench.planning.microbatch import GiB, memory_fraction
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(
                memory_fraction(int(plan.cfg.run.device_memory_gb * GiB), total), device)
    baseline_rss = peak_rss_bytes()
    before_process_group(plan.cfg.fault, int(os.environ.get("RANK", 0)))   # fault injection only
    timeout = timedelta(seconds=plan.cfg.run.pg_timeout_s)
    dist.init_process_group(backend, timeout=timeout, **_restart_store(timeout))
    events.mark(run_dir_p, "process_group", dist.get_rank())
    if dist.get_world_size() > 1:
        from ddlbench.launch import liveness
        hosts = liveness.start(dist.get_rank())    # so a failure can tell which node was lost
    else:
        hosts = [socket.gethostname()]
    from ddlbench.lifecycle.stop import install_rank_handler
    install_rank_handler(run_dir, dist.get_rank(), _srun_stop(plan, run_dir_p, dist.get_rank()))
    # SIGUSR1: save the series so far, exit
    try:
        ctx = RankContext(rank=dist.get_rank(), local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                          world_size=dist.get_world_size(), device=device, backend=backend,
                          precision=plan.cfg.run.precision, hosts=tuple(hosts), compile=plan.cfg.run.compile,
                          float8=plan.cfg.run.float8)
        runner.run(plan, ctx, run_dir_p, baseline_rss, threads)
    finally:
        dist.destroy_process_group()
        quiet.write_kept(RunDir(run_dir_p).third_party_log)


def _restart_store(timeout: timedelta) -> dict:
    """A rank of a restarted attempt (TORCHELASTIC_RESTART_COUNT > 0): the agent's store, under a
    prefix of the attempt's own. The static rendezvous keeps one store across restarts, so a new
    attempt's ranks would otherwise read the dead attempt's addresses (seen: gloo's connectFullMesh
    refused by a rank 1 that no longer exists)."""
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
    if not restart:
        return {}
    import torch.distributed as dist
    client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
    return {"store": dist.PrefixStore(f"attempt_{restart}/", client), "rank": int(os.environ["RANK"]),
            "world_size": int(os.environ["WORLD_SIZE"])}


_stack_files: list = []     # open for the process's life: faulthandler writes to the descriptor


def _stack_file(run_dir: str):
    path = RunDir(run_dir).rank_stacks(int(os.environ.get("RANK", 0)))
    path.parent.mkdir(parents=True, exist_ok=True)
    _stack_files.append(open(path, "w"))
    return _stack_files[-1]


def _srun_stop(plan, run_dir: Path, rank: int):
    """launcher=slurm has no launcher process above the ranks: on SIGUSR1 rank 0 gathers the
    ranks' saved series itself (bounded wait) and writes the `timeout` result. The other ranks
    wait (bounded) for that result before they exit: srun --kill-on-bad-exit would otherwise
    kill rank 0 as soon as another rank exits with 128+SIGUSR1, before it has written it."""
    if plan.cfg.launcher.name != "slurm":
        return None
    started = time.monotonic()

    def write_timeout_result():
        from ddlbench.launch.records import stopped_result
        from ddlbench.lifecycle.stop import wait_for_partials
        wait_for_partials(run_dir, plan.dims.world_size)
        stopped_result(run_dir, run_dir.name, plan, time.monotonic() - started)

    def wait_for_result():
        from ddlbench.lifecycle.stop import wait_until
        wait_until(RunDir(run_dir).result.exists, bound_s=45.0)
    return write_timeout_result if rank == 0 else wait_for_result


LOST_PEER_GRACE_S = 1.0


@record
def rank_main(run_dir: str, threads: int) -> None:
    from ddlbench.launch.forked import await_siblings, inherited_heap
    if inherited_heap():     # forked by the agent: connect once it forks no more (forked.py's hazards)
        await_siblings(int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    try:
        run_rank(run_dir, threads)
    except Exception as exc:
        from ddlbench.launch.failures import is_lost_peer
        if is_lost_peer(str(exc)):
            # a consequence of another rank's death: exit after it, so the agent (which reports
            # the first dead process it polls) names the rank that caused it
            time.sleep(LOST_PEER_GRACE_S)
        raise
