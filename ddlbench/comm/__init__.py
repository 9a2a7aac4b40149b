"""Communication on a rank: the profiled step that splits each collective into overlapped and exposed time
(exposed.py), the probe that counts collectives and bytes (probe.py), communication threads first
(threads.py) and the node layout the groups follow (topology.py)."""
