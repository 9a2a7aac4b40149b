"""Theoretical model-state memory per rank (ZeRO paper, Rajbhandari et al. 2020, §3)."""
from __future__ import annotations


def optimizer_state_bytes_per_param(optimizer: str, momentum: float = 0.0,
                                    fp32_master_copy: bool = False) -> int:
    """Adam(W): exp_avg + exp_avg_sq in fp32 = 8; SGD with momentum: 4; plain SGD: 0.
    Mixed-precision trainers that keep fp32 master weights add 4 (ZeRO's K = 12 for Adam)."""
    if optimizer == "adamw":
        states = 8
    elif optimizer == "sgd":
        states = 4 if momentum > 0 else 0
    else:
        raise ValueError(f"unknown optimizer {optimizer!r}")
    return states + (4 if fp32_master_copy else 0)


def model_state_bytes_per_rank(params: int, world: int, *, param_bytes: int, grad_bytes: int,
                               optim_bytes: int, shard_optim: bool = False,
                               shard_grads: bool = False, shard_params: bool = False) -> int:
    """params*(param_bytes + grad_bytes + optim_bytes), with the sharded parts divided by world.
    ZeRO-1 shards optimizer states, ZeRO-2 also gradients, ZeRO-3/FSDP also parameters."""
    if world < 1 or params < 0:
        raise ValueError("world must be >= 1 and params >= 0")

    def part(nbytes: int, sharded: bool) -> float:
        return params * nbytes / (world if sharded else 1)

    total = (part(param_bytes, shard_params) + part(grad_bytes, shard_grads)
             + part(optim_bytes, shard_optim))
    return int(round(total))
