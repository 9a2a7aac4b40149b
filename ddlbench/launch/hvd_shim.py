"""The command horovodrun starts per slot when ranks are forked (CPU): `python -m ddlbench.launch.hvd_shim
ADDRESS RUN_DIR THREADS` (what follows the address is the rank's argv). Hands this process's
environment, directory and standard streams to the launcher's rank server (ddlbench/launch/rankserver.py), which forks the rank; passes on the signals
it gets; exits as the rank did. Imports nothing beyond the standard library's sockets, so it starts
in a few tens of milliseconds (ddlbench/__init__.py imports only os and sys)."""
from __future__ import annotations

import os
import signal
import socket
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def main(argv: list[str]) -> int:
    from ddlbench.launch.rankserver import send_request

    name, *rest = argv
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect("\0" + name)
    send_request(sock, dict(os.environ), os.getcwd(), rest)
    lines = sock.makefile("r")
    first = lines.readline().split()
    if len(first) != 2 or first[0] != "pid":
        print(f"bench: the rank server did not start this rank ({' '.join(first) or 'no answer'})", file=sys.stderr)
        return 1
    pid = int(first[1])

    def forward(sig, _frame):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    for sig in FORWARDED:
        signal.signal(sig, forward)
    last = lines.readline().split()
    if len(last) != 2 or last[0] != "exit":     # the server died before telling: the rank is gone
        print("bench: the rank server ended before its rank did", file=sys.stderr)
        return 1
    code = int(last[1])
    if code < 0:                                # killed by a signal: so is this process
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
