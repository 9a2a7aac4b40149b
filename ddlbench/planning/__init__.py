"""From a command line to a validated Plan (config.py: Hydra compose, the Variant, its checks), the sweep's
key=value overrides (overrides.py) and run.micro_batch=auto (microbatch.py), before any process starts."""
