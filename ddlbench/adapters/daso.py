"""DASO — Distributed Asynchronous and Selective Optimization (Coquelin et al. 2021), written on
torch.distributed subgroups after Heat's reference implementation (heat.optim.DASO).

Hierarchical data parallelism. Ranks form nodes: the ranks of each host (ddlbench/comm/topology.py),
or blocks of `ranks_per_node` to emulate nodes on one machine. Every step, gradients are all-reduced inside the node (DDP over the node's
process group) and every rank steps its own optimizer. Across nodes the *parameters* are
averaged only every `global_skip` steps, by one rank per node (round-robin over the node's local
ranks: the "selective" part), in a reduced precision (`downcast`), without blocking: the sum
arrives `batches_to_wait` steps later and is merged with the parameters trained meanwhile,
    p <- (2·w·p + sum_over_nodes) / (nodes + 2·w),   w = batches_to_wait,
then broadcast from that rank to the rest of its node. During the first `warmup_steps` and the
last `cooldown_steps` every step ends with a blocking global average (p <- sum / nodes). In
between, every `adapt_every` steps the world-averaged training loss is tested for a plateau
(no relative improvement above `stability_level` for `patience` windows): on a plateau the skips
halve (global_skip //= 2, batches_to_wait -= 1, at least 1), and at global_skip 1 they reset to
`max_global_skips` (batches_to_wait = max_global_skips // 4), as Heat does per epoch.

Differences from Heat's DASO: phases and plateau windows are counted in steps (Heat: epochs);
local synchronisation runs every step (Heat's `local_skip` > 1 is not implemented); the global
payload is cast to `downcast` in every phase (Heat casts only during the blocking phases);
the non-blocking sum is one flat buffer (Heat splits it into chunks of `sending_chunk_size`);
collectives are torch.distributed (gloo/NCCL) subgroups, not MPI communicators.

With `warmup_steps` covering the run and downcast fp32, DASO is exactly DDP for SGD (with or
without momentum: averaging parameters after a linear update equals averaging gradients); that
is a test. With Adam it is not (the update is not linear in the gradient).
"""
from __future__ import annotations

from typing import Literal, Optional

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt

from ddlbench.adapters.base import Periodic, StepOut, Strategy
from ddlbench.adapters.checkpoint import DCP
from ddlbench.adapters.common import build_on, forward_backward
from ddlbench.adapters.cost import DTYPE_BYTES, CostModel, MiB, autocast_copies, buckets, split
from ddlbench.adapters.precision import DTYPES
from ddlbench.adapters.variant import Abilities, Variant, taxonomy_labels
from ddlbench.comm.topology import cross_groups, hosts_of, node_groups, node_of
from ddlbench.errors import ConfigError


class DASOOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    ranks_per_node: Optional[PositiveInt] = None   # null = the ranks of each host (the real node)
    warmup_steps: NonNegativeInt = 4               # blocking global average every step
    cooldown_steps: NonNegativeInt = 4
    max_global_skips: PositiveInt = 8
    downcast: Literal["bf16", "fp16", "fp32"] = "bf16"
    adapt_every: Optional[PositiveInt] = None      # plateau test window; null = an epoch (quality mode) or 20
    stability_level: float = Field(0.05, ge=0, lt=1)
    patience: PositiveInt = 2


# ---- the schedule (pure functions, hand-checked in tests/test_daso.py) ------------------------
INITIAL_SKIPS = (4, 1)       # Heat's values when the warm-up ends: global_skip, batches_to_wait


def phase(step: int, total: int, warmup: int, cooldown: int) -> str:
    """'blocking' during warm-up and cool-down, else 'cycling'."""
    return "blocking" if step < warmup or step >= total - cooldown else "cycling"


def next_skips(global_skip: int, batches_to_wait: int, plateau: bool, max_global_skips: int) -> tuple[int, int]:
    """Heat's rule: on a plateau halve the skips (wait at least 1); at 1, reset to the maximum."""
    if not plateau:
        return global_skip, batches_to_wait
    if global_skip > 1:
        return global_skip // 2, max(1, batches_to_wait - 1)
    return max_global_skips, max(1, min(max_global_skips, max_global_skips // 4))


def merge(params: torch.Tensor, received_sum: torch.Tensor, nodes: int, batches_waited: int) -> torch.Tensor:
    """Parameters trained while the sum travelled, merged with it (weight 2·w for the local ones)."""
    w = 2.0 * batches_waited
    return (params * w + received_sum) / (nodes + w)


class Plateau:
    """Loss plateau: `patience` windows in a row without a relative improvement > threshold."""

    def __init__(self, threshold: float, patience: int):
        self.threshold, self.patience = threshold, patience
        self.best, self.bad = float("inf"), 0

    def update(self, loss: float) -> bool:
        if loss < self.best * (1.0 - self.threshold):
            self.best, self.bad = loss, 0
            return False
        self.bad += 1
        if self.bad >= self.patience:
            self.bad = 0
            return True
        return False


# ---- the adapter ------------------------------------------------------------------------------
class DASO(Variant):
    name = "daso"
    Options = DASOOptions
    strategy = "ddlbench.adapters.daso:DASOStrategy"

    def abilities(self):
        return Abilities(fake_group="DASO decides its phases from losses across steps; one step says little",
                         checkpoints=DCP)

    def taxonomy(self) -> dict:
        return taxonomy_labels("data (hierarchical)", "stale (global average every k steps, non-blocking)",
                               "all-reduce inside nodes + all-reduce of parameters across nodes + broadcast",
                               compression=f"{self.options.downcast} (global parameters)")

    def grad_reduce_dtype(self, precision: str) -> str:
        downcast = self.options.downcast
        return "fp32" if downcast == "fp32" else f"fp32 in nodes, {downcast} parameters across"

    def cost_model(self, dims, model, precision, per_node=None):
        """Between warm-up and cool-down, at the skips the cycle starts with (INITIAL_SKIPS; the
        plateau rule changes them later): every step DDP all-reduces gradients inside the node;
        every global_skip steps one rank per node all-reduces its flat parameters in `downcast`
        across the nodes (non-blocking) and then broadcasts them inside its node (per parameter:
        here per unit). The node's DDP holds its gradient buckets as copies."""
        options, world, psi = self.options, dims.world_size, 4.0 * model.params
        node = min(options.ranks_per_node or per_node or world, world)
        if world % node:
            raise ConfigError(f"ranks per node {node} does not divide the world size {world}")
        nodes, skip = world // node, INITIAL_SKIPS[0]
        traffic = (split("all_reduce", psi, buckets(psi, 25 * MiB), node, what="gradients (in the node)")
                   + split("all_reduce", DTYPE_BYTES[options.downcast] * model.params, 1, nodes, stride=node,
                           per_step=1 / skip, what=f"parameters ({options.downcast}, across nodes)")
                   + (split("broadcast", psi, model.units, node, per_step=1 / skip, what="parameters (in the node)")
                      if nodes > 1 else []))
        buffers = autocast_copies(model.params, precision)
        if node > 1:      # its DDP keeps torch's default gradient_as_bucket_view=False
            buffers["DDP gradient buckets (copies)"] = psi
        if nodes > 1:
            buffers["flat parameters in flight"] = DTYPE_BYTES[options.downcast] * model.params
        return CostModel(f"DASO cycling phase, global_skip {skip}, {node} ranks per node", model.params,
                         shard_ranks=world, buffers=buffers, traffic=tuple(traffic))

    def check_config(self, cfg, dims) -> None:
        per_node = self.options.ranks_per_node
        if per_node is not None and dims.world_size % per_node:
            raise ConfigError(f"framework.options.ranks_per_node={per_node} must divide the world size {dims.world_size}")


class DASOStrategy(Periodic, Strategy):
    total: int = 10**12          # steps in the run (plan_steps); cool-down counts back from it
    window: Optional[int] = None

    def plan_steps(self, total: int, steps_per_epoch: Optional[int]) -> None:
        self.total = total
        self.window = self.options.adapt_every or steps_per_epoch or 20

    def setup(self, build_model, build_optimizer) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        o, rank = self.options, self.ctx.rank
        # the nodes: ranks grouped by their host (whatever order the launcher numbered them in),
        # or that one host's ranks cut into blocks of ranks_per_node to emulate nodes
        self.node_groups = node_groups(hosts_of(self.ctx), o.ranks_per_node)
        self.per_node, self.nodes = len(self.node_groups[0]), len(self.node_groups)
        node = node_of(self.node_groups)[rank]
        self.node_ranks = self.node_groups[node]
        self.local = self.node_ranks.index(rank)
        # every rank creates every group, in the same order (torch.distributed requires it)
        groups = [dist.new_group(g) for g in self.node_groups]
        self.global_groups = [dist.new_group(g) for g in cross_groups(self.node_groups)]
        self.node_group = groups[node]
        model = build_on(build_model, self.ctx.device)
        self.params = sum(p.numel() for p in model.parameters())
        self.model = DDP(model, process_group=self.node_group,
                         device_ids=[self.ctx.device.index] if self.ctx.device.type == "cuda" else None)
        self.optimizer = build_optimizer(self.model.parameters())
        self.step_no, self.sender = 0, 0
        self.global_skip, self.batches_to_wait = INITIAL_SKIPS
        self.cycle_start = None
        self.pending = None          # (work, buffer, sender, receive_at_step, waited)
        self.plateau = Plateau(o.stability_level, o.patience)
        self.window_loss = [0.0, 0]
        self.history: list[dict] = []
        self.window = self.window or o.adapt_every or 20

    # -- communication --
    def _flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.model.parameters()])

    def _assign(self, flat: torch.Tensor) -> None:
        with torch.no_grad():
            i = 0
            for p in self.model.parameters():
                p.copy_(flat[i:i + p.numel()].view_as(p).to(p.dtype))
                i += p.numel()

    def _send(self) -> tuple:
        """The sending local rank of every node starts the global sum of its parameters."""
        sender = self.sender
        self.sender = (self.sender + 1) % self.per_node
        if self.local != sender or self.nodes == 1:
            return None, None, sender
        buf = self._flat().to(DTYPES[self.options.downcast])
        return dist.all_reduce(buf, group=self.global_groups[sender], async_op=True), buf, sender

    def _receive(self, work, buf, sender: int, waited: int) -> None:
        """Merge the global sum on the sender, then broadcast its parameters inside the node."""
        if work is not None:
            work.wait()
            total = buf.to(torch.float32)
            flat = self._flat().float()
            self._assign(total / self.nodes if waited == 0 else merge(flat, total, self.nodes, waited))
        if self.per_node > 1 and self.nodes > 1:
            src = self.node_ranks[sender]
            for p in self.model.parameters():
                dist.broadcast(p.data, src=src, group=self.node_group)

    def _global_sync(self, step: int) -> None:
        o = self.options
        if self.pending is not None and (phase(step, self.total, o.warmup_steps, o.cooldown_steps) == "blocking"
                                         or step >= self.pending[3]):
            work, buf, sender, _, waited = self.pending
            self.pending = None
            self._receive(work, buf, sender, waited)
        if phase(step, self.total, o.warmup_steps, o.cooldown_steps) == "blocking":
            work, buf, sender = self._send()
            self._receive(work, buf, sender, 0)
            return
        if self.cycle_start is None:
            self.cycle_start = step
        if (step - self.cycle_start) % self.global_skip == 0 and self.pending is None:
            work, buf, sender = self._send()
            if self.batches_to_wait == 0:
                self._receive(work, buf, sender, 0)
            else:
                self.pending = (work, buf, sender, step + self.batches_to_wait, self.batches_to_wait)

    def _adapt(self, step: int, loss: Optional[torch.Tensor]) -> None:
        """The window's losses summed on the device (no host sync inside a step); at the window's
        end one all-reduce, the only point where the host reads them."""
        o = self.options
        if loss is not None:
            self.window_loss[0] = self.window_loss[0] + loss.detach().to(torch.float64)
            self.window_loss[1] += 1
        if (step + 1) % self.window or phase(step, self.total, o.warmup_steps, o.cooldown_steps) == "blocking":
            return
        # on the run's device: an NCCL group all-reduces only CUDA tensors
        t = torch.stack([torch.as_tensor(self.window_loss[0], dtype=torch.float64, device=self.ctx.device),
                         torch.tensor(float(self.window_loss[1]), dtype=torch.float64, device=self.ctx.device)])
        dist.all_reduce(t)             # one world-averaged loss, so every rank takes the same decision
        self.window_loss = [0.0, 0]
        mean = float(t[0] / max(t[1], 1.0))
        new = next_skips(self.global_skip, self.batches_to_wait, self.plateau.update(mean), o.max_global_skips)
        if new != (self.global_skip, self.batches_to_wait):
            self.global_skip, self.batches_to_wait = new
            self.cycle_start = step + 1
            self.history.append({"step": step + 1, "global_skip": new[0], "batches_to_wait": new[1],
                                 "window_loss": mean})

    def train_step(self, batch: dict) -> StepOut:
        loss = forward_backward(self.model, batch, self.dims.grad_accum, self.precision, self.model.no_sync)
        self.precision.step(self.optimizer)
        self._global_sync(self.step_no)
        self._adapt(self.step_no, loss)
        self.step_no += 1
        return StepOut(loss=loss)

    def comm_probe_steps(self) -> int:
        """Measure one cycle of the steady (cycling) phase, not the blocking cool-down — unless
        the run was blocking throughout (warm-up + cool-down cover it)."""
        o = self.options
        if o.warmup_steps + o.cooldown_steps >= self.total:
            return 1
        self.total, self.cycle_start = 10**12, None
        self.window = 10**12                       # and the skips stay as the run left them
        self.options = self.options.model_copy(update={"warmup_steps": 0})
        return self.global_skip

    def describe(self) -> dict:
        o = self.options
        return {"version": torch.__version__, "native_config": {
            "implementation": "ddlbench DASO on torch.distributed subgroups (after heat.optim.DASO)",
            "ranks_per_node": self.per_node, "nodes": self.nodes, "node_groups": self.node_groups,
            "local_sync": "torch DDP over the node's process group, every step",
            "global_sync": f"all-reduce of parameters in {o.downcast} among one rank per node (round-robin)",
            "warmup_steps": o.warmup_steps, "cooldown_steps": o.cooldown_steps,
            "initial_skips": {"global_skip": INITIAL_SKIPS[0], "batches_to_wait": INITIAL_SKIPS[1]},
            "max_global_skips": o.max_global_skips, "adapt_every_steps": self.window,
            "stability_level": o.stability_level, "patience": o.patience,
            "skip_changes": self.history,
            "final_skips": {"global_skip": self.global_skip, "batches_to_wait": self.batches_to_wait},
        }}
