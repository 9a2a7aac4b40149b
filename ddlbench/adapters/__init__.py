"""Framework adapters: one file per framework; the only place that imports deepspeed, horovod,
fairscale. The contract is in base.py (docs/design.md §3)."""
