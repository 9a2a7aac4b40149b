"""One gloo all-reduce of SIZE bytes between the tasks of an srun, timed: `srun -N2
--ntasks-per-node=1 python tests/cluster_allreduce.py MASTER SIZE ITERS`. Rank 0 prints
{"hosts", "median_s", "bytes"} as JSON (tests/test_cluster.py)."""
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist

master, size, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://{master}:29533", rank=rank, world_size=world)
t = torch.ones(size // 4)
times = []
for i in range(iters + 1):          # the first one connects and warms up
    dist.barrier()
    start = time.perf_counter()
    dist.all_reduce(t)
    if i:
        times.append(time.perf_counter() - start)
hosts = [None] * world
dist.all_gather_object(hosts, socket.gethostname())
if rank == 0:
    print(json.dumps({"hosts": hosts, "median_s": statistics.median(times), "bytes": t.numel() * 4}))
dist.destroy_process_group()
