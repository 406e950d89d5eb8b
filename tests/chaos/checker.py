"""Reads a chaos ledger and says whether the lock held.

- No two runs on one key inside their critical sections at once, a run
  forced out included: the forced run starts only once the run it displaced
  has stopped, or that run's deadline has passed (invariant 10).
- Fencing tokens strictly increase per key, in the order of entering.
- Every key is taken again in the final phase, after the faults stopped.
- Every exit 76 is explained by a fault that could cost that lease, shortly
  before it: a --force on its key; and, on a backend whose leases live in a
  store, a fault of its own agent (kill, SIGTERM, network) or a backend pause.
  (On file:// the run holds the kernel lock itself, so the book says no agent
  restart may stop it (docs/src/restarts.md): only a force, or its key's
  `KEY.run` removed under it, explains a 76 there.)

- The counter (where the store keeps one: counter.py): every increment that
  landed is known (a run's outcome line says so, or a later state of the
  counter names its run), each made one value, none was made twice or lost
  (the final value is the number of increments that landed), and their
  tokens strictly increase in the order they landed. A run holding the lock
  is never refused by the fence; a late write (the write of a forced-out run
  arriving after its forcer's) is always refused.

A forced-out run is the run of the token just below a forced run's, still
inside when that force began; they are counted, with their exits, for the
summary, and checked like every other run: no overlap, no token regression.

One overlap is the design's limit, not the lock's, and is counted apart
(`orphaned`), not failed: on a store whose leases outlive their agent, a run
whose shim was SIGKILLed (`shim_kill`) while its agent was down (or whose
agent then went down) has nobody left to stop it: the shim enforces the
lease's deadline while its agent is away, and the agent enforces `--on-lost`
once the shim is gone, but a restarted agent knows no run whose shim did not
reattach (docs/src/restarts.md). Its lease expires, and the next run, forced
or not, enters after TTL + grace beside the command, which goes on until it
ends by itself. Only an overlap whose earlier run was left so before the
later one entered is counted so; on file:// the run holds its lock itself,
and every overlap fails.

Run by itself: python3 tests/chaos/checker.py LEDGER
"""

import sys
from collections import defaultdict

import ledger as ledger_mod

NS = 1_000_000_000


class Run:
    def __init__(self, rid):
        self.id = rid
        self.spawn = None  # (t, agent, key, role, line)
        self.enter = None  # (t, key, token, lease, agent, forced, pid, line)
        self.leave = None  # (t, reason, line)
        self.kill = None  # (t, line)
        self.exit = None  # (t, code, line)
        self.end = None
        self.forced_at = None
        self.forced_by = None
        self.shim_killed = None  # t of a shim_kill of this run


def check(path):
    lines = ledger_mod.read(path)
    conf = {}
    runs = {}
    faults = {}  # seq -> {kind, agent, key, start, end, lines}
    downs = defaultdict(list)  # agent -> [(down t, up t)]
    down_since = {}
    phases = {}
    last_t = 0
    bad_lines = []
    intents = {}  # run -> (key, token, role, line)
    outcomes = {}  # run -> (key, token, outcome, value, read (value, token, writer), conflicts, line)
    counts = {}  # key -> the counter's final (value, token, writer, line)

    def run(rid):
        if rid not in runs:
            runs[rid] = Run(rid)
        return runs[rid]

    for kind, t, f, n, text in lines:
        last_t = max(last_t, t)
        where = f"{n}: {text}"
        try:
            if kind == "C":
                for item in f:
                    k, _, v = item.partition("=")
                    conf[k] = v
            elif kind == "E":
                # The count a run asked (0: a plain key of the plain keys; 1 to 3: a
                # slot key, 1 meaning plain) is last, after the ledger's older fields.
                slots = int(f[7]) if len(f) > 7 else 0
                run(f[0]).enter = (t, f[1], f[2], f[3], f[4], f[5] == "1", f[6], where, slots)
            elif kind == "L":
                run(f[0]).leave = (t, f[3], where)
            elif kind == "S":
                run(f[0]).spawn = (t, f[1], f[2], f[3], where)
            elif kind == "X":
                run(f[0]).exit = (t, int(f[4]), where)
            elif kind == "K":
                run(f[0]).kill = (t, where)
            elif kind == "F":
                seq, fkind, phase, agent, key = f[0], f[1], f[2], f[3], f[4]
                fault = faults.setdefault(seq, {"kind": fkind, "agent": agent, "key": key,
                                                "start": t, "end": None, "lines": []})
                if phase == "start":
                    fault["start"] = t
                    if fkind == "shim_kill" and len(f) > 5 and f[5].startswith("run="):
                        run(f[5][len("run="):]).shim_killed = t
                else:
                    fault["end"] = t
                fault["lines"].append(where)
            elif kind == "A":
                agent, state = f[0], f[1]
                if state == "down":
                    down_since.setdefault(agent, t)
                elif agent in down_since:
                    downs[agent].append((down_since.pop(agent), t))
            elif kind == "P":
                phases[f[0]] = t
            elif kind == "I":
                intents[f[0]] = (f[1], int(f[2]), f[3], where)
            elif kind == "W":
                read = None if f[5] == "-" else (int(f[5]), int(f[6]), f[7])
                outcomes[f[0]] = (f[1], int(f[2]), f[3], None if f[4] == "-" else int(f[4]),
                                  read, f[8], where)
            elif kind == "V":
                counts[f[0]] = (int(f[1]), int(f[2]), f[3], where)
            else:
                bad_lines.append(where)
        except (IndexError, ValueError):
            bad_lines.append(where)
    for agent, t in down_since.items():
        downs[agent].append((t, last_t))

    ttl = int(conf.get("ttl_ms", "5000")) * 1_000_000
    slack = int(conf.get("slack_ms", "1000")) * 1_000_000
    backend = conf.get("backend", "?")
    window = 2 * ttl + slack  # how far back a fault may explain a 76
    violations = []

    def violation(what, *where):
        violations.append((what, [w for w in where if w]))

    for where in bad_lines:
        violation("unreadable ledger line", where)

    # Critical sections and their ends.
    sections = defaultdict(list)
    slot_sections = defaultdict(list)  # --slots: keys several runs may hold at once
    for r in runs.values():
        if r.enter is None:
            continue
        t_enter = r.enter[0]
        if r.leave is not None:
            r.end = r.leave[0]
        elif r.kill is not None and r.kill[0] >= t_enter:
            r.end = r.kill[0]
        else:
            r.end = last_t
            violation(f"run {r.id} entered its critical section and no end was recorded "
                      "(no leave line, not killed by the harness)",
                      r.spawn and r.spawn[4], r.enter[7], r.exit and r.exit[2])
        if r.enter[2] == "none":
            violation(f"run {r.id} ran without a lock (no RUNLOCK_TOKEN)", r.enter[7])
        if r.enter[8]:
            slot_sections[r.enter[1]].append(r)
        else:
            sections[r.enter[1]].append(r)

    def orphaned_at(r):
        """When run `r` was left with neither its shim nor the agent that
        granted it (see the top), or None."""
        if backend == "file" or r.shim_killed is None or not r.spawn:
            return None
        killed = r.shim_killed
        for down, up in downs[r.spawn[1]]:
            # Down when its shim was killed (none reattached it), or down
            # afterwards (the next agent never heard of it), while it ran.
            if up > killed and down < r.end:
                return max(killed, down)
        return None

    overlaps = 0
    orphaned = []
    regressions = 0
    waits = []
    forced_out = []
    for key, rs in sections.items():
        rs.sort(key=lambda r: (r.enter[0], r.id))
        tokens = {}
        for r in rs:
            try:
                tokens[r.id] = int(r.enter[2])
            except ValueError:
                pass
        # A run is forced out by the first forced run granted after it (the next larger
        # token) if that force began (its shim started) before the run's section ended.
        forcers = sorted((tokens[r.id], r) for r in rs if r.enter[5] and r.id in tokens)
        for r in rs:
            if r.id not in tokens:
                continue
            for token, f in forcers:
                if token > tokens[r.id]:
                    began = f.spawn[0] if f.spawn else f.enter[0]
                    if began < r.end:
                        r.forced_at, r.forced_by = f.enter[0], f
                        forced_out.append(r)
                    break

        active = []
        for b in rs:
            active = [a for a in active if a.end > b.enter[0]]
            for a in active:
                ta, tb = tokens.get(a.id), tokens.get(b.id)
                p = a if ta is None or tb is None or ta < tb else b
                left = orphaned_at(a) if p is a else None
                if left is not None and left <= b.enter[0]:
                    orphaned.append((a, b, (min(a.end, b.end) - b.enter[0]) / 1e6))
                    continue
                overlaps += 1
                violation(f"overlap on key {key}: run {b.id} (token {b.enter[2]}) entered while "
                          f"run {a.id} (token {a.enter[2]}) was inside "
                          f"({(min(a.end, b.end) - b.enter[0]) / 1e6:.1f} ms together)"
                          + (f"; run {p.id} had been forced out by run {p.forced_by.id} "
                             f"(token {p.forced_by.enter[2]})" if p.forced_by else ""),
                          a.spawn and a.spawn[4], a.enter[7], a.leave and a.leave[2],
                          a.kill and a.kill[1], b.spawn and b.spawn[4], b.enter[7],
                          b.leave and b.leave[2],
                          p.forced_by and p.forced_by.spawn and p.forced_by.spawn[4],
                          p.forced_by and p.forced_by.enter[7])
            active.append(b)
        # Tokens, in the order of entering.
        best = None
        for r in rs:
            if r.id not in tokens:
                continue
            token = tokens[r.id]
            if best is not None and token <= best[0]:
                regressions += 1
                violation(f"token regression on key {key}: run {r.id} entered with token "
                          f"{token} after token {best[0]} (run {best[1].id})",
                          best[1].enter[7], r.enter[7])
            if best is None or token > best[0]:
                best = (token, r)

    # Invariant 10: a key with slots never has more runs inside than the
    # smallest count any of them asked (tokens are per slot, so only counts
    # are compared here).
    too_many = 0
    for key, rs in slot_sections.items():
        rs.sort(key=lambda r: (r.enter[0], r.id))
        active = []
        for b in rs:
            active = [a for a in active if a.end > b.enter[0]] + [b]
            smallest = min(a.enter[8] for a in active)
            if len(active) > smallest:
                too_many += 1
                violation(f"key {key}: run {b.id} (asking {b.enter[8]}) entered while "
                          f"{len(active) - 1} runs were inside, asking "
                          f"{sorted(a.enter[8] for a in active[:-1])}: more than {smallest}",
                          *[a.enter[7] for a in active])

    # What forcing cost: how long each forced run waited, from its shim's
    # start, for the run it displaced to stop.
    forced_exits = defaultdict(int)
    for r in forced_out:
        forced_exits[r.exit[1] if r.exit else "none"] += 1
        f = r.forced_by
        waits.append(max(0, f.enter[0] - (f.spawn[0] if f.spawn else f.enter[0])))

    # Every 76 explained.
    lost = 0
    by_code = defaultdict(int)
    explained_by = defaultdict(int)
    for r in runs.values():
        if r.exit is None:
            continue
        code = r.exit[1]
        by_code[code] += 1
        if code != 76:
            continue
        lost += 1
        x = r.exit[0]
        agent = r.spawn[1] if r.spawn else "?"
        key = r.spawn[2] if r.spawn else "?"
        why = None
        for seq, fault in sorted(faults.items(), key=lambda kv: kv[1]["start"]):
            start = fault["start"]
            end = fault["end"] if fault["end"] is not None else start
            if start > x or end < x - window:
                continue
            k = fault["kind"]
            if k == "force" and fault["key"] == key:
                why = fault
            elif k == "run_file_removed":  # every key's, held or not
                why = fault
            elif backend != "file" and (
                    k == "backend_pause"
                    or (fault["agent"] == agent
                        and (k in ("agent_kill", "agent_term") or k.startswith("net_")))):
                why = fault
            if why:
                break
        if why:
            explained_by[why["kind"]] += 1
        else:
            violation(f"run {r.id} (key {key}, agent {agent}) exited 76 and no fault within "
                      f"{window / 1e9:.0f} s before explains it",
                      r.spawn and r.spawn[4], r.enter and r.enter[7], r.exit[2])

    # The final phase: every key taken again.
    keys = [k for k in conf.get("keys", "").split(",") if k]
    finals = {}
    for r in runs.values():
        if r.spawn and r.spawn[3] == "final":
            finals[r.spawn[2]] = r
    if "final" not in phases:
        violation("the final phase never ran")
    else:
        for key in keys:
            r = finals.get(key)
            if r is None or r.exit is None or r.exit[1] != 0 or r.enter is None:
                violation(f"key {key} could not be taken again after the faults stopped "
                          f"(exit {r.exit[1] if r and r.exit else 'none'})",
                          r and r.spawn and r.spawn[4], r and r.exit and r.exit[2])

    counter = check_counter(keys, intents, outcomes, counts, violation) \
        if conf.get("counter") == "1" else None

    n_sections = sum(len(v) for v in sections.values())
    return {
        "counter": counter,
        "backend": backend,
        "sections": n_sections,
        "slot_sections": sum(len(v) for v in slot_sections.values()),
        "over_count": too_many,
        "overlaps": overlaps,
        # Overlaps with a run nobody was left to stop, as documented (see the top).
        "orphaned": [f"run {b.id} (token {b.enter[2]}) entered beside run {a.id} (token "
                     f"{a.enter[2]}), whose shim was killed while its agent was away "
                     f"({ms:.1f} ms together)" for a, b, ms in orphaned],
        "regressions": regressions,
        "forced_out": len(forced_out),
        "forced_out_exits": dict(forced_exits),
        "forced_wait_max_s": max(waits) / 1e9 if waits else 0.0,
        "exits": dict(sorted(by_code.items())),
        "lost": lost,
        "lost_explained_by": dict(explained_by),
        "violations": violations,
    }


def check_counter(keys, intents, outcomes, finals, violation):
    """The counter's history, per key, from what runs wrote and read (see the top)."""
    made = defaultdict(dict)  # key -> value -> (token, writer, line)

    def seen(key, value, token, writer, where):
        if value == 0:
            return
        was = made[key].setdefault(value, (token, writer, where))
        if was[:2] != (token, writer):
            violation(f"counter {key}: value {value} was made twice, by run {was[1]} (token "
                      f"{was[0]}) and by run {writer} (token {token}): an update was lost",
                      was[2], where)

    refused = defaultdict(int)
    for rid, (key, token, outcome, value, read, _, where) in outcomes.items():
        if outcome == "written":
            seen(key, value, token, rid, where)
            if read is not None:
                seen(key, *read, where)
        elif outcome == "refused":
            seen(key, *read, where)
            role = intents.get(rid, (None, None, "?"))[2]
            refused[role] += 1
            if role != "late":
                violation(f"counter {key}: run {rid} held the lock with token {token} and the "
                          f"fence refused its write: the counter had token {read[1]} already",
                          intents.get(rid, (0, 0, 0, None))[3], where)
    for key, (value, token, writer, where) in finals.items():
        seen(key, value, token, writer, where)

    landed = {}  # run -> (key, value)
    for key in keys:
        if key not in finals:
            violation(f"counter {key} was not read at the end")
            continue
        final = finals[key][0]
        last = (0, "init")
        for value in range(1, max([final] + list(made[key])) + 1):
            got = made[key].get(value)
            if value > final:
                if got:
                    violation(f"counter {key}: run {got[1]} made value {value}, above the final "
                              f"value {final}: an update was lost", got[2], finals[key][3])
                continue
            if got is None:
                violation(f"counter {key}: no run recorded or read value {value} (final {final})",
                          finals[key][3])
                continue
            token, writer, where = got
            if token <= last[0]:
                violation(f"counter {key}: value {value} was written with token {token} by run "
                          f"{writer}, after token {last[0]} (run {last[1]}): applied out of "
                          "token order", where)
            if writer in landed:
                violation(f"counter {key}: run {writer}'s increment landed twice", where)
            if writer not in intents:
                violation(f"counter {key}: value {value} was written by {writer}, which no run "
                          "says it meant to write", where)
            landed[writer] = (key, value)
            last = (token, writer)

    completed = [r for r, o in outcomes.items() if o[2] == "written"]
    late = [r for r, i in intents.items() if i[2] == "late"]
    return {
        "increments": len(landed),
        "completed": len(completed),
        # Runs killed (or cut off from the store) between intent and outcome.
        "unknown_landed": sum(1 for r in landed if outcomes.get(r, (0, 0, "?"))[2] != "written"),
        "unknown_not_landed": sum(1 for r in intents if r not in landed
                                  and outcomes.get(r, (0, 0, "?"))[2] in ("?", "error")),
        "late_writes": len(late),
        "late_refused": refused["late"],
        "late_landed": sum(1 for r in late if r in landed),
        "conflicts": sum(int(o[5]) for o in outcomes.values() if o[5].isdigit()),
        "final": {k: v[0] for k, v in sorted(finals.items())},
    }


def report(result, out=sys.stdout):
    for what, where in result["violations"]:
        print(f"VIOLATION: {what}", file=out)
        for w in where:
            print(f"    ledger {w}", file=out)


if __name__ == "__main__":
    res = check(sys.argv[1])
    report(res)
    for k, v in res.items():
        if k != "violations":
            print(f"{k}: {v}")
    sys.exit(1 if res["violations"] else 0)
