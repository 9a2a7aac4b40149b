"""The rank side: the only timed training loop (runner.py), the record rank 0 builds from the gathered
series (collect.py) and their services: evaluation (quality.py), injected faults (faults.py), the
garbage collector and host allocator in the loop (gcpolicy.py, malloc.py, hostevents.py), torch's
MemTracker (memtrack.py) and the progress bar (progress.py)."""
