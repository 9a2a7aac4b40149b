"""Settings read before anything runs: the config schema (schema.py), the parallel dimensions
(dims.py), dataset checks (datacheck.py) and key=value arguments (keyvalue.py)."""
