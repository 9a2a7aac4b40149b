"""A run's precision as one object per recipe (after Lightning Fabric's precision plugins): how
forward is wrapped, how the loss goes backward, how the optimizer steps, and what to record.

- Autocast: torch.autocast around forward over fp32 parameters; at fp16 a GradScaler (torch's
  AMP recipe). DDP, its hooks, DASO, Horovod, FairScale, pipeline and pure tensor parallelism.
- FrameworkCast: the framework casts itself (FSDP2's MixedPrecisionPolicy, DeepSpeed's bf16/fp16
  engine): nothing around forward, the framework's own words in the record.
The run's precision itself (ctx.precision) is never rewritten: it is what ran.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Optional

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class Autocast:
    device: torch.device
    precision: str                       # fp32 | bf16 | fp16
    scaler: Optional[torch.amp.GradScaler] = field(default=None, init=False)

    def __post_init__(self):
        if self.precision == "fp16":     # fp16 needs loss scaling; bf16 and fp32 do not
            self.scaler = torch.amp.GradScaler(self.device.type)

    def forward_context(self):
        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=DTYPES[self.precision])

    def inputs(self, batch: dict) -> dict:
        return batch

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, optimizer) -> None:
        """optimizer.step (through the GradScaler where there is one), then drop the gradients."""
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def describe(self) -> str:
        if self.precision == "fp32":
            return "none (fp32)"
        scaler = " + torch GradScaler" if self.scaler is not None else ""
        return f"torch.autocast({self.device.type}, {self.precision}) around forward, fp32 parameters{scaler}"

    def recipe(self) -> dict:
        """Parameter, compute and master-weight dtypes and loss scaling (the reduction dtype is the
        variant's grad_reduce_dtype)."""
        return {"params": "fp32", "compute": self.precision, "master_weights": None,
                "loss_scaling": "torch GradScaler (dynamic)" if self.scaler is not None else None}


@dataclass
class FrameworkCast:
    """The framework applies the precision (its parameters are already in the compute dtype)."""
    device: torch.device
    precision: str
    summary: str                          # the framework's recipe, as recorded
    input_dtype: Optional[torch.dtype] = None   # floating inputs cast to it (DeepSpeed's 2-byte engine)
    master_weights: Optional[str] = None  # where fp32 weights live beside the low-precision ones
    loss_scaling: Optional[str] = None
    scaler: None = None

    def forward_context(self):
        return contextlib.nullcontext()

    def inputs(self, batch: dict) -> dict:
        if self.input_dtype is None:
            return batch
        return {k: v.to(self.input_dtype) if v.is_floating_point() else v for k, v in batch.items()}

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, optimizer) -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def describe(self) -> str:
        return "none (fp32)" if self.precision == "fp32" else self.summary

    def recipe(self) -> dict:
        return {"params": self.precision, "compute": self.precision, "master_weights": self.master_weights,
                "loss_scaling": self.loss_scaling}


Precision = Autocast | FrameworkCast
