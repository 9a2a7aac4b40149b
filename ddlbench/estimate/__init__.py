"""The predictor's parts (issue 50, in progress): what a framework sends at a world size it did not
run at, recorded from its own code over torch's fake process group (collectives.py)."""
