"""Model zoo and data for ddlbench.

`build(model_cfg)` returns a ModelSpec: a factory for the model (an nn.Module whose forward
takes a batch dict and returns the mean loss), the synthetic data shape, and FLOP counting.
"""
from ddlbench.models.data import SyntheticData  # noqa: F401
from ddlbench.models.registry import build, modules_for  # noqa: F401
from ddlbench.models.spec import ModelSpec, count_params  # noqa: F401
