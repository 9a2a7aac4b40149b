"""The predictor, pure: below `bench advise`, `bench project` and run.micro_batch=auto. A model's
meta-device profile (profile.py), memory per rank (memory.py, held against torch's MemTracker by
memcheck.py), step time from a calibration and the cost models (step.py), the step as a schedule of
tasks (rules.py, schedule.py) at any world size (scale.py). It imports nothing above it (the layers
test, tests/test_layers.py); what runs code to measure or trace lives in ddlbench/project/."""
