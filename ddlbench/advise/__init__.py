"""`bench advise`: which framework and parallel layout trains this model fastest on these devices?

grid.py enumerates the candidates (framework x layout x micro-batch x activation checkpointing at
one global batch) and prunes the invalid ones with the run's own validation; memory.py estimates
each candidate's peak memory per rank and prunes what does not fit; predict.py ranks the rest by
predicted step time (a calibration run's compute x the network model of `bench project`);
command.py measures the top-k as a resumable sweep and writes advice.json with predicted vs
measured step time and estimated vs measured memory for every run it made.
"""
