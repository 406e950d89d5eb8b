"""Reads a chaos ledger and says whether the lock held.

- No two runs on one key inside their critical sections at once, except a
  forced-out run beside what entered after the force, until that run is
  stopped, which must happen within the --force bound (below).
- Fencing tokens strictly increase per key, in the order of entering.
- Every key is taken again in the final phase, after the faults stopped.
- Every exit 76 is explained by a fault that could cost that lease, shortly
  before it: a --force on its key; and, on a backend whose leases live in a
  store, a fault of its own agent (kill, SIGTERM, network) or a backend pause.
  (On file:// the run holds the kernel lock itself, so README says no agent
  restart may stop it: only a force explains a 76 there.)

The --force bound, from README and DESIGN (README gives no single figure): the
forced-out holder hears of the force at its next renewal, every TTL/3, and is
sent SIGTERM, then SIGKILL a kill grace (TTL/6 under a 30 s TTL) later; if
its renewals cannot reach the store, it is stopped at its lease's deadline
(its last renewal + TTL - TTL/6), again followed by the kill grace. Either
way it is gone by last renewal + TTL <= the force + TTL. On file:// a force
while the holder's agent is down stops the run once its shim has reattached
to the next agent, so the time that agent was down is added. `slack` (1 s)
covers a loaded machine's scheduling.

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
            else:
                bad_lines.append(where)
        except (IndexError, ValueError):
            bad_lines.append(where)
    for agent, t in down_since.items():
        downs[agent].append((t, last_t))

    ttl = int(conf.get("ttl_ms", "5000")) * 1_000_000
    slack = int(conf.get("slack_ms", "1000")) * 1_000_000
    backend = conf.get("backend", "?")
    bound = ttl + slack
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

    overlaps = 0
    forced_overlaps = 0
    regressions = 0
    lingers = []
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
                        # The bound runs from the force's grant, just before the forced
                        # run's command entered (the force itself may take a while).
                        r.forced_at, r.forced_by = f.enter[0], f
                        forced_out.append(r)
                    break

        def excused(p, n):
            """p (the lower token) beside n: p was forced out, and n was granted no
            earlier than the run that forced it (the forced run itself, or a later one)."""
            return (p.forced_by is not None and p.id in tokens and n.id in tokens
                    and tokens[p.forced_by.id] <= tokens[n.id])

        active = []
        for b in rs:
            active = [a for a in active if a.end > b.enter[0]]
            for a in active:
                ta, tb = tokens.get(a.id), tokens.get(b.id)
                p, n = (a, b) if ta is None or tb is None or ta < tb else (b, a)
                if excused(p, n):
                    forced_overlaps += 1
                    continue
                overlaps += 1
                violation(f"overlap on key {key}: run {b.id} (token {b.enter[2]}) entered while "
                          f"run {a.id} (token {a.enter[2]}) was inside "
                          f"({(min(a.end, b.end) - b.enter[0]) / 1e6:.1f} ms together)"
                          + (f"; run {p.id} had been forced out by run {p.forced_by.id} "
                             f"(token {p.forced_by.enter[2]}), and run {n.id} (token "
                             f"{n.enter[2]}) was granted in the middle of that force, not by it"
                             if p.forced_by else ""),
                          a.spawn and a.spawn[4], a.enter[7], a.leave and a.leave[2],
                          a.kill and a.kill[1], b.spawn and b.spawn[4], b.enter[7],
                          b.leave and b.leave[2],
                          p.forced_by and p.forced_by.spawn and p.forced_by.spawn[4],
                          p.forced_by and p.forced_by.enter[7])
            active.append(b)
        # Tokens, in the order of entering; a forced-out run may enter after its
        # successors (its command was still starting when the force came).
        best = None
        for r in rs:
            if r.id not in tokens:
                continue
            token = tokens[r.id]
            if best is not None and token <= best[0] and not (
                    token < best[0] and excused(r, best[1])):
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

    # Forced-out runs must be gone within the bound.
    forced_exits = defaultdict(int)
    for r in forced_out:
        limit = r.forced_at + bound
        if backend == "file":
            agent = r.enter[4]
            counted = set()
            changed = True
            while changed:
                changed = False
                for i, (d, u) in enumerate(downs.get(agent, [])):
                    if i not in counted and u > r.forced_at and d < limit:
                        counted.add(i)
                        limit += u - max(d, r.forced_at)
                        changed = True
        linger = max(0, r.end - r.forced_at)
        lingers.append(linger)
        forced_exits[r.exit[1] if r.exit else "none"] += 1
        if r.end > limit:
            violation(f"run {r.id} (key {r.enter[1]}) was forced out by run {r.forced_by.id} "
                      f"and was still inside {linger / 1e9:.2f} s after the forced run entered, past "
                      f"the bound of {(limit - r.forced_at) / 1e9:.2f} s",
                      r.enter[7], r.forced_by.spawn and r.forced_by.spawn[4],
                      r.forced_by.enter[7], r.leave and r.leave[2], r.kill and r.kill[1])

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

    n_sections = sum(len(v) for v in sections.values())
    return {
        "backend": backend,
        "sections": n_sections,
        "slot_sections": sum(len(v) for v in slot_sections.values()),
        "over_count": too_many,
        "overlaps": overlaps,
        "regressions": regressions,
        "forced_overlaps": forced_overlaps,
        "forced_out": len(lingers),
        "forced_out_exits": dict(forced_exits),
        "linger_max_s": max(lingers) / 1e9 if lingers else 0.0,
        "bound_s": bound / 1e9,
        "exits": dict(sorted(by_code.items())),
        "lost": lost,
        "lost_explained_by": dict(explained_by),
        "violations": violations,
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
