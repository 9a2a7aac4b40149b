"""Framework adapters: one file per framework; the only place that imports deepspeed, horovod,
fairscale. The contract is in base.py (DESIGN §3)."""
