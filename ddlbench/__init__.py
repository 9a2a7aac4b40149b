"""ddlbench: measure distributed deep-learning training frameworks fairly and reproducibly."""

import os

__version__ = "0.1.0"

# torch.cuda.is_available() asks NVML instead of initialising the CUDA driver (cuInit), so a process
# that later forks (the sweep's cells, the elastic agent's ranks, advise's calibration) stays
# fork-safe whoever asks: transformers imports torchao when it is installed, and torchao asks at
# import. torch reads it at each call; set to 0 to restore the driver's answer.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
