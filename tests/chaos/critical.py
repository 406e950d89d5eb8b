"""The critical section every chaos run executes under `runlock run`.

It appends an enter line to the ledger (one write() on an O_APPEND file),
increments its key's counter in the store (CHAOS_COUNTER, plain keys only;
counter.py) between an intent line and an outcome line, holds for
CHAOS_HOLD_MS, and appends a leave line. SIGTERM (what --on-lost sends
first) ends the hold at once with a leave line, so the only critical sections
without one are those the harness SIGKILLed itself, which it records. Times are
CLOCK_MONOTONIC, which every process on the machine shares. Standard library
only, and as little of it as possible: this starts once per run.

With CHAOS_LATE=1 it is a run's write arriving late, after the run it belongs
to was forced out (the harness starts it, without a lock, with that run's
token): the counter's increment alone, which the fence must refuse.
CHAOS_UNFENCED=1 leaves out the token check (the checker's own test).
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


def fenced_write(role):
    """The increment, between an intent line and an outcome line: a run killed
    between them may or may not have written, which the checker tells from
    the counter's later states (each names the run that wrote it)."""
    sys.dont_write_bytecode = True  # no __pycache__ left in the checkout
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import counter

    os.write(fd, f"I\t{now()}\t{RUN}\t{KEY}\t{TOKEN}\t{role}\n".encode())
    try:
        outcome, value, read, conflicts = counter.increment(
            counter.open_store(), KEY, TOKEN, RUN, fenced=env.get("CHAOS_UNFENCED") != "1")
        fields = [outcome, value, *(read or ("-", "-", "-")), conflicts]
    except (counter.Unavailable, OSError, ValueError, KeyError, IndexError) as e:
        fields = ["error", "-", "-", "-", "-", "-", str(e).replace("\t", " ")[:200]]
    line = "\t".join(["W", str(now()), RUN, KEY, TOKEN] + [str(f) for f in fields]) + "\n"
    os.write(fd, line.encode())
    notify(line)


if env.get("CHAOS_LATE") == "1":
    fenced_write("late")
    sys.exit(0)

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
start = time.monotonic()
if "CHAOS_COUNTER" in env and env.get("CHAOS_SLOTS", "0") == "0" and TOKEN != "none":
    fenced_write("section")
time.sleep(max(0, int(env["CHAOS_HOLD_MS"]) / 1000 - (time.monotonic() - start)))
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
leave("done")
sys.exit(0)
