"""ddlbench: measure distributed deep-learning training frameworks fairly and reproducibly."""

__version__ = "0.1.0"
