"""The ledger: one O_APPEND file, one line per write(), tab-separated fields,
CLOCK_MONOTONIC nanoseconds in the second field.

Written by the runs themselves (critical.py):
  E  t run key token lease agent forced pid   entered the critical section
  L  t run key token reason                   left it (done, or term: SIGTERM)
  I  t run key token role                     about to increment the key's counter
                                               (role: section, or late: a forced-out
                                               run's write arriving late)
  W  t run key token outcome value V T R n    what came of it: written (value: the one
                                               made; V T R: the counter it replaced),
                                               refused (V T R: the counter found, with
                                               a higher token), error (- for the rest,
                                               then why); n: conditional writes retried
Written by the harness:
  C  t name=value ...                          the run's settings
  S  t run agent key role                      a shim started (role: work, force, final)
  X  t run agent key role code                 it exited (code < 0: killed by that signal)
  K  t run                                     the harness SIGKILLed the run (its end, at the latest)
  F  t seq kind phase agent key detail         a fault began (phase start) or ended (end)
  A  t agent state                             an agent went down or came up
  P  t name                                    a phase: faults_on, faults_off, final, done
  V  t key value token run                     a counter's final state, read at the end
"""

import os

from proc import now_ns


class Ledger:
    def __init__(self, path):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, kind, *fields, t=None):
        t = now_ns() if t is None else t
        line = "\t".join([kind, str(t)] + [str(f) for f in fields]) + "\n"
        os.write(self.fd, line.encode())

    def close(self):
        os.close(self.fd)


def read(path):
    """Every line as (kind, t, fields, line number, text)."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, text in enumerate(f, 1):
            parts = text.rstrip("\n").split("\t")
            if len(parts) < 2 or not parts[1].isdigit():
                out.append(("?", 0, parts, n, text.rstrip("\n")))
                continue
            out.append((parts[0], int(parts[1]), parts[2:], n, text.rstrip("\n")))
    return out
