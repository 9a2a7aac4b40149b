"""What a `bench cluster` link does to a transfer after an idle spell: tbf's token bucket and TCP
in both directions at once, measured (the schedule's pricing of them: ddlbench/estimate/schedule.py).

    .venv/bin/python benchmarks/tbf_probe.py OUT_DIR [--link 100mbit] [--sizes 131072,262144,393216]
        [--gaps 0,5,20] [--inside-node]

A 2-node cluster (one rank a node, gloo; --inside-node: 2 nodes x 2 devices, the two ranks on one
node's two devices, their links into its switch at --link, sharing the node's one core), then for each pattern, bytes per direction and idle
spell ("gap", a busy loop of matmuls, as a training step's compute, no barrier between iterations:
the steady state of a repeated step), the median of the transfer's time (the iteration less the gap):
- `all_reduce`, `all_gather`: the collective of that many bytes each way (all-reduce: of a tensor
  that size, gloo's ring sending half of it each way in each of its two phases);
- `send`: rank 0 to rank 1 only, rank 1 answering with a 4-byte message once it has it (gloo's send
  returns once the socket has the data, so rank 0 times the round);
- `exchange`: an isend and an irecv of that many bytes each way at once (a pipeline's two
  directions busy together).
Prints and writes OUT_DIR/tbf_probe.{json,md}, with the link's line (the payload's share of the rate)
and bucket (ddlbench/cluster/plan.py) in milliseconds for comparison. Root, as `bench cluster` needs.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from layout_check import cluster  # `bench cluster ARGS`, captured

NAME = "ddlbtbf"
WORKER = r'''
from ddlbench.cluster.device_task import enter
enter()      # a cluster with device namespaces: into this task's device first (a no-op otherwise)
import json, os, statistics, sys, time
import torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo", rank=int(os.environ["SLURM_PROCID"]), world_size=int(os.environ["SLURM_NTASKS"]))
rank, sizes, gaps, out_file = dist.get_rank(), json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
a = torch.randn(256, 256)

def busy(ms):
    t = time.perf_counter()
    while time.perf_counter() - t < ms / 1e3:
        a @ a

rows = []
for per_dir in sizes:
    full, shard, x, y = (torch.ones(per_dir * 2 // 4), torch.ones(per_dir // 4), torch.ones(per_dir // 4),
                         torch.ones(per_dir // 4))
    ack = torch.ones(1)

    def one_way():
        if rank == 0:
            dist.send(x, 1)
            dist.recv(ack, 1)
        else:
            dist.recv(x, 0)
            dist.send(ack, 0)
    ops = {"all_reduce": lambda: dist.all_reduce(x),
           "all_gather": lambda: dist.all_gather_into_tensor(full, shard),
           "send": one_way,
           "exchange": lambda: [w.wait() for w in (dist.isend(x, 1 - rank), dist.irecv(y, 1 - rank))]}
    for pattern, op in ops.items():
        for gap in gaps:
            dist.barrier()
            marks = []
            for _ in range(12):
                if pattern != "send" or rank == 0:     # the receiver waits in recv
                    busy(gap)
                op()
                marks.append(time.perf_counter())
            steps = [b - a for a, b in zip(marks, marks[1:])][2:]
            rows.append({"pattern": pattern, "bytes_per_direction": per_dir, "gap_ms": gap, "rank": rank,
                         "transfer_ms": statistics.median(steps) * 1e3 - gap})
got = [None] * dist.get_world_size()
dist.all_gather_object(got, rows)
if rank == 0:
    by = {}
    for r in got[0]:
        key = (r["pattern"], r["bytes_per_direction"], r["gap_ms"])
        other = next(o for o in got[1] if (o["pattern"], o["bytes_per_direction"], o["gap_ms"]) == key)
        # send: the sender's round; the others: the slower rank
        t = r["transfer_ms"] if r["pattern"] == "send" else max(r["transfer_ms"], other["transfer_ms"])
        by[key] = {"pattern": key[0], "bytes_per_direction": key[1], "gap_ms": key[2], "transfer_ms": round(t, 2)}
    open(out_file, "w").write(json.dumps(list(by.values())))
dist.destroy_process_group()
'''


def markdown(doc: dict) -> str:
    where = ("one node's 2 devices (one core), their links into its switch" if doc.get("inside_node")
             else "2 nodes x 1 rank, link")
    lines = [f"{where} {doc['link']} (tbf): line {doc['line_MBps']:.3f} MB/s of data, bucket "
             f"{doc['bucket_ms']:.1f} ms of it; transfer ms (iteration less the idle spell), median", "",
             "| pattern | bytes each way | at the line ms | " + " | ".join(f"after {g} ms idle" for g in doc["gaps_ms"])
             + " |", "|" + "---|" * (3 + len(doc["gaps_ms"]))]
    for pattern in ("all_reduce", "all_gather", "send", "exchange"):
        for size in doc["sizes"]:
            row = {r["gap_ms"]: r["transfer_ms"] for r in doc["rows"]
                   if r["pattern"] == pattern and r["bytes_per_direction"] == size}
            lines.append(f"| {pattern} | {size:,} | {size / doc['line_MBps'] / 1e3:.1f} | "
                         + " | ".join(f"{row[g]:.1f}" for g in doc["gaps_ms"]) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--link", default="100mbit")
    ap.add_argument("--sizes", default="131072,262144,393216")
    ap.add_argument("--gaps", default="0,5,20")
    ap.add_argument("--inside-node", action="store_true",
                    help="the two ranks on one node's two devices (their links into its switch at --link; "
                         "sharing the node's one core, as a tensor-parallel pair of the layout check)")
    a = ap.parse_args()
    from ddlbench.cluster.plan import payload_share, rate_bits, tbf_burst_bytes
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in a.sizes.split(",")]
    gaps = [float(g) for g in a.gaps.split(",")]
    (out / "worker.py").write_text(WORKER)
    cluster("down", f"name={NAME}")
    shape = ["devices_per_node=2", f"dev_link={a.link}", "link=100mbit"] if a.inside_node else [f"link={a.link}"]
    up = cluster("up", "nodes=2", *shape, f"name={NAME}")
    if up.returncode:
        raise SystemExit(f"bench cluster up failed: {up.stderr[-1500:]}")
    place = (["-N1", "--ntasks-per-node=2", "--overcommit", "--export=ALL,MASTER_ADDR=10.88.1.1,MASTER_PORT=29555"]
             if a.inside_node else ["-N2", "--ntasks-per-node=1", "--export=ALL,MASTER_ADDR=10.88.0.1,MASTER_PORT=29555"])
    try:
        proc = cluster("exec", f"name={NAME}", "--", "srun", *place, sys.executable, str(out / "worker.py"),
                       json.dumps(sizes), json.dumps(gaps), str(out / "rows.json"))
        if proc.returncode:
            raise SystemExit(f"probe failed: {proc.stderr[-1500:]}")
    finally:
        cluster("down", f"name={NAME}")
    bits = rate_bits(a.link)
    line = bits / 8 * payload_share(1500)
    doc = {"link": a.link, "inside_node": a.inside_node, "line_MBps": line / 1e6, "bucket_ms": tbf_burst_bytes(bits) * payload_share(1500) / line * 1e3,
           "sizes": sizes, "gaps_ms": gaps, "rows": json.loads((out / "rows.json").read_text())}
    (out / "tbf_probe.json").write_text(json.dumps(doc, indent=1))
    (out / "tbf_probe.md").write_text(markdown(doc) + "\n")
    (out / "rows.json").unlink()
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
