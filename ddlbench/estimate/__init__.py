"""The predictor, below `bench advise`, `bench project` and run.micro_batch=auto (issue 50, in
progress): a model's meta-device profile (profile.py), memory per rank (memory.py, held against
torch's MemTracker by memcheck.py), step time from a calibration and the cost models (step.py),
and what a framework sends at a world size it did not run at, recorded from its own code over
torch's fake process group (collectives.py)."""
