"""DeepSpeed-MoE (`deepspeed.moe.layer.MoE`) with ZeRO stages 0-2, for Mixture-of-Experts models:
every MoE layer of the transformers model becomes DeepSpeed's, with the same weights (router ->
TopKGate.wg, each expert's SwiGLU -> one expert module), `ep_size` ranks sharing the experts
(the engine makes the expert-parallel and expert-data-parallel groups), DeepSpeed's gate and
its recommended settings (capacity factor 1.0, min capacity 4, dropped tokens over capacity,
random token selection, the second expert sampled), and its load-balancing loss (`l_aux`).

DeepSpeed's gate is not transformers' router: tokens over an expert's capacity are dropped
(recorded in `moe.dropped_tokens`), the second expert is drawn with Gumbel noise, and l_aux is
the Switch Transformer's loss over the top-1 assignment; so DeepSpeed-MoE is compared with itself
(ep_size=2 against ep_size=1: tests/test_moe.py), not with DDP (equivalent_to_ddp: false).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Literal, Optional

import torch
from pydantic import Field, PositiveInt
from torch import nn

from ddlbench.adapters.deepspeed import DeepSpeed, DeepSpeedOptions, DeepSpeedStrategy
from ddlbench.adapters.variant import taxonomy_labels
from ddlbench.errors import ConfigError


class DeepSpeedMoEOptions(DeepSpeedOptions):
    stage: Literal[0, 1, 2] = 2                 # DeepSpeed-MoE trains with ZeRO stages 0-2
    ep_size: PositiveInt = 2                    # ranks that share one layer's experts
    capacity_factor: float = Field(1.0, gt=0)   # DeepSpeed's defaults from here on
    eval_capacity_factor: float = Field(1.0, gt=0)
    min_capacity: int = Field(4, ge=0)
    drop_tokens: bool = True                    # false: capacity = the busiest expert's load
    use_rts: bool = True                        # random token selection when dropping
    top2_2nd_expert_sampling: bool = True       # the second expert drawn with Gumbel noise
    noisy_gate_policy: Optional[Literal["Jitter", "RSample"]] = None


class SwiGLUExpert(nn.Module):
    """One expert as transformers' experts compute it: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, width: int):
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * width, bias=False)
        self.down = nn.Linear(width, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(nn.functional.silu(gate) * up)


class DeepSpeedMoEBlock(nn.Module):
    """Stands in for a transformers MoE layer: DeepSpeed's MoE, its l_aux kept for the loss, its
    token counts (and the (token, expert) pairs over capacity) handed to the router statistics."""

    def __init__(self, moe, stats, layer: int, capacity: tuple[float, float, int], top_k: int):
        super().__init__()
        self.moe, self.stats, self.layer = moe, stats, layer
        self.capacity_factor, self.eval_capacity_factor, self.min_capacity = capacity
        self.top_k, self.l_aux = top_k, None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out, self.l_aux, counts = self.moe(hidden)
        if self.training and self.stats is not None:
            self.stats.add_counts(self.layer, counts, self.dropped(counts, hidden.shape[0] * hidden.shape[1]))
        return out

    def dropped(self, counts: torch.Tensor, tokens: int) -> Optional[torch.Tensor]:
        """Pairs over capacity: DeepSpeed's _capacity, ceil(tokens / experts x factor x k), at least
        min_capacity; counts are the gate's before it drops."""
        if not self.moe.deepspeed_moe.gate.drop_tokens:
            return torch.zeros((), dtype=torch.long, device=counts.device)
        import math
        capacity = max(math.ceil(tokens / counts.numel() * self.capacity_factor * self.top_k), self.min_capacity)
        return (counts.long() - capacity).clamp(min=0).sum()


def convert(model: nn.Module, options: DeepSpeedMoEOptions, ep_rank: int) -> list[DeepSpeedMoEBlock]:
    """Every MoE layer of `model` replaced by DeepSpeed's with the same weights; this rank keeps
    global experts ep_rank * E/ep_size ... (DeepSpeed's local experts, in order)."""
    from deepspeed.moe.layer import MoE

    from ddlbench.models.moe import RouterStats
    plan = model.family.experts
    stats = RouterStats(model, hook=False)
    model.router_stats = stats
    blocks, layer = [], 0
    for block in model.blocks():
        moe = plan.moe_block(block)
        if moe is None:
            continue
        router, experts = getattr(moe, plan.router_attr), getattr(moe, plan.experts_attr)
        total, hidden, width = experts.num_experts, experts.gate_up_proj.shape[2], experts.gate_up_proj.shape[1] // 2
        ds = MoE(hidden_size=hidden, expert=SwiGLUExpert(hidden, width).to(experts.gate_up_proj.device),
                 num_experts=total, ep_size=options.ep_size, k=router.top_k, capacity_factor=options.capacity_factor,
                 eval_capacity_factor=options.eval_capacity_factor, min_capacity=options.min_capacity,
                 noisy_gate_policy=options.noisy_gate_policy, drop_tokens=options.drop_tokens,
                 use_rts=options.use_rts, top2_2nd_expert_sampling=options.top2_2nd_expert_sampling)
        local = total // options.ep_size
        with torch.no_grad():
            ds.deepspeed_moe.gate.wg.weight.copy_(router.weight)
            for i, expert in enumerate(ds.deepspeed_moe.experts.deepspeed_experts):
                e = ep_rank * local + i
                expert.gate_up.weight.copy_(experts.gate_up_proj[e])
                expert.down.weight.copy_(experts.down_proj[e])
        wrapper = DeepSpeedMoEBlock(ds, stats, layer, (options.capacity_factor, options.eval_capacity_factor,
                                                       options.min_capacity), router.top_k)
        parent_name = next(n for n, m in block.named_modules() if m is moe)
        parent, _, leaf = parent_name.rpartition(".")
        setattr(block.get_submodule(parent) if parent else block, leaf, wrapper)
        blocks.append(wrapper)
        layer += 1
    model.aux_layers = blocks
    return blocks


class DeepSpeedMoE(DeepSpeed):
    name = "deepspeed_moe"
    Options = DeepSpeedMoEOptions
    strategy = "ddlbench.adapters.deepspeed_moe:DeepSpeedMoEStrategy"


    def abilities(self):       # compile and float8 not wired for its MoE layers; no schedule rules for them yet
        return replace(super().abilities(), compiles=False, float8=False, step=None)

    def taxonomy(self) -> dict:
        base = super().taxonomy()
        return taxonomy_labels("expert + " + base["parallelism"], "sync", "all-to-all (tokens) + " + base["communication"],
                               "experts by ep rank; " + base["sharding"], base["compression"])

    def cost_model(self, dims, model, precision, per_node=None):
        """Not modelled yet: DeepSpeed's capacity-padded all-to-all (experts x capacity x hidden per
        rank, whatever the routing) and its expert-data-parallel reductions."""
        return None

    def analytic_comm(self, dims, precision, params, per_node=None):
        return None

    def check_config(self, cfg, dims) -> None:
        from ddlbench.models.family import of_config
        super().check_config(cfg, dims)
        m, ep = getattr(cfg.model, "moe", None), self.options.ep_size
        if of_config(cfg.model).experts is None or m is None:
            raise ConfigError(f"framework deepspeed_moe needs a Mixture-of-Experts model (a family with experts and "
                              f"model.moe); {cfg.model.name} is dense")
        errors = []
        if m.num_experts % ep:
            errors.append(f"framework.options.ep_size {ep} does not divide model.moe.num_experts {m.num_experts}")
        if dims.world_size % ep:
            errors.append(f"framework.options.ep_size {ep} does not divide the world size {dims.world_size}")
        if m.top_k >= 2 and not m.norm_topk_prob:
            errors.append("DeepSpeed's gate renormalises the top-k weights: model.moe.norm_topk_prob must be true")
        if m.shared_intermediate_size:
            errors.append("DeepSpeed-MoE's layer has no shared expert (its use_residual mixes a dense MLP in by a "
                          "learned coefficient, not a sigmoid-gated shared expert): model.moe.shared_intermediate_size "
                          "must be null")
        if errors:
            raise ConfigError("; ".join(errors))


class DeepSpeedMoEStrategy(DeepSpeedStrategy):
    def prepare_model(self, model):
        from deepspeed.utils import groups  # noqa: F401 - the engine makes the groups
        ep_rank = self.ctx.rank % self.options.ep_size     # DeepSpeed's expert-parallel groups: consecutive ranks
        self.moe_blocks = convert(model, self.options, ep_rank)
        self.ep = self.options.ep_size
        self.seq_len = model.net.config.max_position_embeddings
        return model

    def setup(self, build_model, build_optimizer) -> None:
        super().setup(build_model, build_optimizer)
        from deepspeed.utils import groups
        name = self.moe_blocks[0].moe.expert_group_name if self.moe_blocks else None
        if name is not None and groups._get_expert_parallel_rank(name) != self.ctx.rank % self.ep:
            raise RuntimeError(f"DeepSpeed placed rank {self.ctx.rank} at expert-parallel rank "
                               f"{groups._get_expert_parallel_rank(name)}, not {self.ctx.rank % self.ep}: the experts "
                               "copied into it are another rank's")

    def optimizer_groups(self, groups: list[dict]) -> list[dict]:
        """DeepSpeed keeps the experts' parameters in optimizer groups of their own (`moe: true`),
        reduced over their expert-data-parallel group by ZeRO."""
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
        return split_params_into_different_moe_groups_for_optimizer(
            [{**g, "name": f"group{i}"} for i, g in enumerate(groups)])

    def moe_record(self) -> dict:
        import math
        o, d = self.options, self.dims
        rows = None
        if o.drop_tokens and self.moe_blocks:     # capacity-padded: experts x capacity rows, whatever the routing
            experts, k = self.moe_blocks[0].moe.num_experts, self.moe_blocks[0].top_k
            tokens = d.micro_batch * (self.seq_len or 1)
            rows = experts * max(math.ceil(tokens / experts * o.capacity_factor * k), o.min_capacity)
        return {"ep": o.ep_size, "dispatch_rows_per_microbatch": rows,
                "experts_implementation": "DeepSpeed Experts (a loop over the local expert modules)", "experts_per_rank": self.moe_blocks[0].moe.num_local_experts if self.moe_blocks else None,
                "dispatch": "DeepSpeed-MoE _AllToAll of capacity-padded [experts, capacity, hidden] buffers",
                "gate": {"capacity_factor": o.capacity_factor, "eval_capacity_factor": o.eval_capacity_factor,
                         "min_capacity": o.min_capacity, "drop_tokens": o.drop_tokens, "use_rts": o.use_rts,
                         "top2_2nd_expert_sampling": o.top2_2nd_expert_sampling,
                         "noisy_gate_policy": o.noisy_gate_policy},
                "routing": ("DeepSpeed TopKGate: softmax, top-k, renormalised, tokens over capacity dropped"
                            if o.drop_tokens else "DeepSpeed TopKGate: softmax, top-k, renormalised; capacity = "
                                                  "the busiest expert's load (max over the ep group): no drops")}

    def describe(self) -> dict:
        out = super().describe()
        native = out.get("native_config")
        if isinstance(native, dict):
            native["moe"] = {"api": "deepspeed.moe.layer.MoE", **self.moe_record(),
                             "layers": len(self.moe_blocks)}
        return out
