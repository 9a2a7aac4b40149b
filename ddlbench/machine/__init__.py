"""The machine a command runs on: the device a rank trains on (device.py), GPUs seen without a CUDA
context (gpus.py), GPU telemetry (nvml.py), peak figures and the CPU probe (hardware.py), and the
environment recorded beside every result (envinfo.py)."""
