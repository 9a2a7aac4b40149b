"""The record a run leaves: result.json's schema, atomic write and load (results.py), the names of every
file in a run directory (rundir.py), the one reader of damaged files (readers.py), and the terminal
table of runs (table.py)."""
