"""bench cluster: an emulated multi-node cluster on one machine (network namespaces, shaped links, a real Slurm)."""
