"""ddlbench: measure distributed deep-learning training frameworks fairly and reproducibly."""

import os
import sys

__version__ = "0.1.0"

# torch.cuda.is_available() asks NVML instead of initialising the CUDA driver (cuInit), so a process
# that later forks (the sweep's cells, the elastic agent's ranks, advise's calibration) stays
# fork-safe whoever asks: transformers imports torchao when it is installed, and torchao asks at
# import. torch reads it at each call; set to 0 to restore the driver's answer.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

# DeepSpeed JIT-builds its CPU ops (CPU Adam, the shared-memory communication op) into
# TORCH_EXTENSIONS_DIR, by default ~/.cache/torch_extensions: one directory for every virtual
# environment on the machine, so two checkouts' venvs rebuild each other's ops (minutes each,
# inside a run). In a venv they go into the venv's own directory, unless the variable is set.
if sys.prefix != sys.base_prefix:
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
