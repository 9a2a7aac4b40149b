"""What one full garbage collection costs a rank, with and without `run.gc=freeze`.

Builds a model preset as a rank holds it (transformers' module tree, FSDP2 per block and at the
root on a one-rank gloo group, parameters on the meta device: the objects a collection walks are
the same as with real storage), then times a full collection (the best of --repeats) before and
after `gc.freeze()`, and counts the objects the collector tracks. The object count is dominated by
what is imported (torch, transformers), not by the model's width.

    .venv/bin/python benchmarks/gc_pause.py [--model llama_1b] [--repeats 3]

On an H200's host a full collection inside FSDP2 windows took 0.19-0.25 s
(reports/gpu-h200/2026-11-27/: `timing.host_events` of C and CA); this prints the same mechanism on
the machine at hand, and what freezing set-up's objects leaves of it (ddlbench/rank/gcpolicy.py).
"""
from __future__ import annotations

import argparse
import gc
import os
import socket
import time


def full_collection_s(repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        gc.collect()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama_1b")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from ddlbench import models
    from ddlbench.machine.hardware import probe_cpu_matmul
    from ddlbench.planning.config import plan_from_overrides
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    cfg = plan_from_overrides([f"model={a.model}", "run.device=cpu"]).cfg
    with torch.device("meta"):
        net = models.build(cfg.model, "cpu").build()
    for block in net.blocks():
        fully_shard(block)
    fully_shard(net)
    gflops = probe_cpu_matmul(torch.get_num_threads(), torch.float32, seconds=1.0) / 1e9
    print(f"machine: CPU matmul probe {gflops:.0f} GFLOP/s ({torch.get_num_threads()} threads); "
          f"{a.model} under FSDP2 on meta, one rank")
    tracked, before = len(gc.get_objects()), full_collection_s(a.repeats)
    print(f"python policy: {tracked:,} objects tracked, a full collection {before * 1e3:.1f} ms")
    gc.freeze()
    frozen, after = gc.get_freeze_count(), full_collection_s(a.repeats)
    print(f"after gc.freeze(): {len(gc.get_objects()):,} tracked, {frozen:,} frozen, "
          f"a full collection {after * 1e3:.2f} ms")
    gc.unfreeze()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
