"""Installs the stand-in CUDA (standin_cuda.py) in every interpreter started with this folder on
PYTHONPATH and DDLBENCH_STANDIN_CUDA=<event log>; does nothing otherwise."""
import os

if os.environ.get("DDLBENCH_STANDIN_CUDA"):
    import standin_cuda
    standin_cuda.install(os.environ["DDLBENCH_STANDIN_CUDA"])
