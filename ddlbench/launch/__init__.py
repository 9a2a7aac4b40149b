"""How ranks are started, and `bench run` below the command line (run_entry.py; Hydra's own multirun:
hydra_app.py). local.py: torch's elastic agent on this machine; slurm.py: srun started them;
starters.py: how a variant's ranks start; worker.py: what each rank does first."""
