"""The critical section every chaos run executes under `runlock run`.

It appends an enter line to the ledger (one write() on an O_APPEND file), holds
for CHAOS_HOLD_MS, and appends a leave line. SIGTERM (what --on-lost sends
first) ends the hold at once with a leave line, so the only critical sections
without one are those the harness SIGKILLed itself, which it records. Times are
CLOCK_MONOTONIC, which every process on the machine shares. Standard library
only, and as little of it as possible: this starts once per run.
"""

import os
import signal
import socket
import sys
import time

env = os.environ
LEDGER = env["CHAOS_LEDGER"]
RUN = env["CHAOS_RUN"]
KEY = env.get("RUNLOCK_KEY", "-")
# No token means the run was started without a lock: the checker reports it.
TOKEN = env.get("RUNLOCK_TOKEN", "none")
LEASE = env.get("RUNLOCK_LEASE_ID", "none")

fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND)
entered = False


def now():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def notify(line):
    """Tells the harness at once (best effort; the ledger is what counts)."""
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.setblocking(False)
        s.sendto(line.encode(), env["CHAOS_NOTIFY"])
        s.close()
    except OSError:
        pass


def leave(reason):
    line = f"L\t{now()}\t{RUN}\t{KEY}\t{TOKEN}\t{reason}\n"
    os.write(fd, line.encode())
    notify(line)


def on_term(signum, frame):
    if entered:
        leave("term")
    os._exit(128 + signum)


signal.signal(signal.SIGTERM, on_term)
# The enter line and the flag change together: a SIGTERM waits until both are done.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
line = (
    f"E\t{now()}\t{RUN}\t{KEY}\t{TOKEN}\t{LEASE}\t{env['CHAOS_AGENT']}"
    f"\t{env['CHAOS_FORCED']}\t{os.getpid()}\t{env.get('CHAOS_SLOTS', '0')}\n"
)
os.write(fd, line.encode())
entered = True
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
notify(line)
time.sleep(int(env["CHAOS_HOLD_MS"]) / 1000)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
leave("done")
sys.exit(0)
