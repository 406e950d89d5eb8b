"""The fault schedule: made up front from the seed alone, so one seed always
gives the same faults at the same offsets with the same parameters.

What a fault hits at run time (which run is inside its critical section, which
key is held) depends on the runs; each fault carries a `pick`, a number from
the seed that chooses among the candidates of the moment in a fixed order.
"""

import hashlib
import json
import random

# kind: (weight, what it does). Weights are relative, per backend kind.
PROCESS_FAULTS = {
    "run_kill": 3.0,    # SIGKILL the run: the shim and the command's process group
    "shim_kill": 2.0,   # SIGKILL the shim alone; the command goes on holding the lock
    "agent_kill": 0.8,  # SIGKILL an agent, restart it after a pause
    "agent_term": 0.8,  # SIGTERM an agent (it hands over), restart it after a pause
    "force": 1.5,       # `runlock run --force` on a held key, from another agent
}
NETWORK_FAULTS = {
    "backend_pause": 0.6,  # SIGSTOP every process of the store, SIGCONT after a while
    "net_latency": 0.8,    # delay each request between one agent and the store
    "net_drop": 1.0,       # drop every connection between one agent and the store
    "net_blackhole": 0.5,  # nothing gets through between one agent and the store
    "net_lost": 1.2,       # an answer lost after its request reached the store
    "net_reset": 1.2,      # an RST in the middle of a response
}
# file:// only: a cleanup job (tmpfiles ageing the directory) removes every
# key's `KEY.run`, held or not (issue 45).
FILE_FAULTS = {
    "run_file_removed": 0.6,
}

KINDS = list(PROCESS_FAULTS) + list(NETWORK_FAULTS) + list(FILE_FAULTS)


def make(seed, seconds, agents, network, interval):
    """Faults as dicts {at, kind, agent, pick, ...}, `at` in seconds from the start."""
    rng = random.Random(f"runlock-chaos-{seed}")
    weights = dict(PROCESS_FAULTS)
    weights.update(NETWORK_FAULTS if network else FILE_FAULTS)
    kinds, w = list(weights), list(weights.values())
    faults, at, seq = [], 0.0, 0
    while True:
        at += rng.uniform(0.5, 1.5) * interval
        if at >= seconds:
            return faults
        kind = rng.choices(kinds, w)[0]
        fault = {
            "seq": seq, "at": round(at, 3), "kind": kind,
            "agent": rng.randrange(agents), "pick": rng.randrange(1 << 30),
        }
        if kind in ("agent_kill", "agent_term"):
            fault["down"] = round(rng.uniform(0.1, 1.5), 3)  # seconds before the restart
        elif kind == "backend_pause":
            fault["duration"] = round(rng.uniform(0.5, 3.0), 3)
        elif kind == "net_latency":
            fault["latency"] = round(rng.choice([0.05, 0.2, 0.5, 1.0, 2.0]), 3)
            fault["duration"] = round(rng.uniform(1.0, 6.0), 3)
        elif kind == "net_blackhole":
            fault["duration"] = round(rng.uniform(1.0, 4.0), 3)
        faults.append(fault)
        seq += 1


def digest(faults):
    """A short fingerprint: equal schedules give equal digests."""
    text = json.dumps(faults, sort_keys=True).encode()
    return hashlib.sha256(text).hexdigest()[:16]
