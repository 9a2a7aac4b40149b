"""Sweeps: a manifest of cells (stable ids), back ends that run them (local, Slurm job array),
status and resume. Results live at <sweep_dir>/<cell_id>/result.json; the manifest is the list
of what is expected, so a report can show every cell, finished or not."""
