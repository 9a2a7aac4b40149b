"""What every command owes the processes and files it starts: one owner per directory (ownership.py),
signals that unwind a command (signals.py), library log lines kept off the terminal (quiet.py), a
run's event stream (events.py) and how a stopped run still leaves a record (stop.py)."""
