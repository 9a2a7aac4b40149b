"""`bench project` and `bench context`: a measured run or a specification priced at other world sizes
and networks (command.py, spec_command.py, spec.py, projection.py, allocate.py, workload.py), the
framework's own collectives traced at any world size over a fake process group (collectives.py,
trace_server.py), compute per piece measured here (piece_timer.py), the longest context a layout fits
(context.py), and the projection held against the runs it came from (validate.py)."""
