"""One chaos run on one backend: the store, a proxy and an agent per host,
workers running `runlock run` in a loop, the faults of the schedule, a final
phase that takes every key again, and the checker's verdict.
"""

import asyncio
import os
import random
import shutil
import signal
import socket
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import agents as agents_mod
import backends
import checker
import ledger as ledger_mod
import proc
import proxy as proxy_mod
import schedule as schedule_mod

HERE = os.path.dirname(os.path.abspath(__file__))
CRITICAL = os.path.join(HERE, "critical.py")
COUNTER = os.path.join(HERE, "counter.py")
HUNG = -1000  # the exit code the ledger gets for a shim that outlived its bound


@dataclass(eq=False)
class RunInfo:
    id: str
    key: str
    agent: int
    role: str
    shim: object
    pid: Optional[int] = None  # the command's pid (its process group), once it entered
    inside: bool = False
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    enter_ns: Optional[int] = None
    hold_ms: int = 0
    killed: bool = False
    token: Optional[str] = None
    wrote: bool = False  # its increment of the counter landed


class Harness:
    def __init__(self, opts, backend_name, repo, bindir, out):
        self.o = opts
        self.name = backend_name
        self.repo = repo
        self.bindir = bindir
        self.out = out
        self.keys = [f"chaos-{i}" for i in range(opts.keys)]
        # --slots: keys every run takes with a random count (plain = 1);
        # never forced by a fault (a plain force of a slot key is refused).
        self.slot_keys = [f"slots-{i}" for i in range(2)] if opts.slots else []
        self.ttl = opts.ttl
        self.runs = {}
        # Runs whose shim alone was killed: their commands go on, untracked
        # by self.runs once the shim's exit is recorded.
        self.shimless = []
        self.next_run = 0
        self.stopping = False
        self.faults_off = False
        self.counts = Counter()
        self.skipped = Counter()
        self.agents = []
        self.proxies = []
        self.pausing = False
        self.tasks = set()

    def say(self, text):
        print(f"chaos {self.name}: {text}", file=self.out, flush=True)

    # --- runs -------------------------------------------------------------

    def _on_datagram(self):
        while True:
            try:
                data = self.dsock.recv(4096)
            except BlockingIOError:
                return
            parts = data.decode(errors="replace").rstrip("\n").split("\t")
            r = self.runs.get(parts[2]) if len(parts) > 2 else None
            if r is None:
                continue
            if parts[0] == "E" and len(parts) > 8:
                r.pid = int(parts[8])
                r.enter_ns = int(parts[1])
                r.token = parts[4]
                r.inside = True
                r.entered.set()
            elif parts[0] == "L":
                r.inside = False
            elif parts[0] == "W" and len(parts) > 5:
                r.wrote = parts[5] == "written"

    def hold_ms(self, rng):
        x = rng.random()
        if x < self.o.long_holds:
            return rng.randint(2000, 7000)  # spans renewals (every TTL/3)
        if x < self.o.long_holds + 0.08:
            return rng.randint(100, 600)
        return rng.randint(5, 40)

    async def run_once(self, key, agent, role, hold, wait_s, made=None, slots=0):
        rid = str(self.next_run)
        self.next_run += 1
        argv = [os.path.join(self.bindir, "runlock"), "run", "--socket", agent.socket,
                "--key", key, "--ttl", f"{self.ttl}s", "--wait", f"{wait_s}s"]
        if role == "force":
            argv.append("--force")
        if slots > 1:
            argv += ["--slots", str(slots)]
        argv += ["--", self.python, "-I", "-S", CRITICAL]
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "RUNLOCK_CONFIG": agent.config,
            "CHAOS_LEDGER": self.ledger.path, "CHAOS_NOTIFY": self.dpath,
            "CHAOS_RUN": rid, "CHAOS_AGENT": str(agent.index),
            "CHAOS_FORCED": "1" if role == "force" else "0", "CHAOS_HOLD_MS": str(hold),
            "CHAOS_SLOTS": str(slots), **self.counter_envs[agent.index],
        }
        errpath = os.path.join(self.shim_err, rid)
        with open(errpath, "wb") as err:
            self.ledger.write("S", rid, agent.index, key, role)
            shim = proc.Child(self.reaper, argv, env=env, stderr=err)
        r = RunInfo(rid, key, agent.index, role, shim, hold_ms=hold)
        self.runs[rid] = r
        if made is not None:
            made.set_result(r)
        bound = wait_s + hold / 1000 + 3 * self.ttl + 30
        done = await shim.wait(bound)
        if done is None:
            code, t = HUNG, proc.now_ns()
            self.notes.append(f"run {rid} (agent {agent.index}, {key}) still running "
                              f"{bound:.0f} s after it started; SIGKILLed")
            await agent.dump_stacks(f"run {rid}'s shim still running {bound:.0f} s after start")
            shim.signal(signal.SIGKILL)
            if r.pid:
                self._killpg(r.pid)
        else:
            code, t = done
        self.ledger.write("X", rid, agent.index, key, role, code, t=t)
        del self.runs[rid]
        # Kept only when it may explain something: a loss, an unavailable store, a failure.
        if code in (0, 75) or (code == -9 and os.path.getsize(errpath) == 0):
            os.unlink(errpath)
        return code

    def _kill_run(self, r):
        # The command may have entered before its datagram was read (r.pid unknown
        # yet): its group is then found under the shim, and the kill is always
        # recorded, or the checker sees a section that never ended.
        r.killed = True
        groups = [r.pid] if r.pid else [c for c in proc.children_of(r.shim.pid)]
        r.shim.signal(signal.SIGKILL)
        for g in groups:
            self._killpg(g)
        self.ledger.write("K", r.id)

    @staticmethod
    def _killpg(pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    async def worker(self, w):
        rng = random.Random(f"{self.o.seed}-worker-{w}")
        agent = self.agents[w % len(self.agents)]
        while not self.stopping:
            if not agent.up.is_set():
                try:
                    await asyncio.wait_for(agent.up.wait(), 60)
                except asyncio.TimeoutError:
                    pass
                continue
            if self.slot_keys and rng.random() < 0.5:
                code = await self.run_once(rng.choice(self.slot_keys), agent, "work",
                                           self.hold_ms(rng), self.o.wait,
                                           slots=rng.choice([1, 2, 2, 3, 3]))
            else:
                code = await self.run_once(rng.choice(self.keys), agent, "work",
                                           self.hold_ms(rng), self.o.wait)
            if code == 69:
                await asyncio.sleep(0.1)  # backoff while the store is away, not a wait for it

    # --- faults -----------------------------------------------------------

    def _candidates(self, inside_only):
        rs = [r for r in self.runs.values()
              if r.role != "final" and not r.killed and r.shim.alive]
        if inside_only:
            rs = [r for r in rs if r.inside and r.pid and proc.pid_alive(r.pid)]
        return sorted(rs, key=lambda r: int(r.id))

    async def apply(self, f):
        kind = f["kind"]
        seq = f["seq"]
        agent = self.agents[f["agent"]]
        key = "-"
        detail = ""

        def start(k="-", d=""):
            self.ledger.write("F", seq, kind, "start", agent.index, k, d)

        def end(k="-", d=""):
            self.ledger.write("F", seq, kind, "end", agent.index, k, d)

        if kind in ("run_kill", "shim_kill"):
            rs = self._candidates(inside_only=True) or (
                self._candidates(inside_only=False) if kind == "run_kill" else [])
            if not rs:
                self.skipped[kind] += 1
                return
            r = rs[f["pick"] % len(rs)]
            self.ledger.write("F", seq, kind, "start", r.agent, r.key, f"run={r.id}")
            if kind == "run_kill":
                self._kill_run(r)
            else:
                r.shim.signal(signal.SIGKILL)
                self.shimless.append(r)
            self.ledger.write("F", seq, kind, "end", r.agent, r.key, f"run={r.id}")
        elif kind in ("agent_kill", "agent_term"):
            if agent.busy or not agent.up.is_set():
                self.skipped[kind] += 1
                return
            agent.busy = True
            try:
                start(d=f"down={f['down']}")
                sig = signal.SIGKILL if kind == "agent_kill" else signal.SIGTERM
                clean = await agent.kill(sig, 15)
                if not clean:
                    detail = "did not exit within 15 s of SIGTERM; SIGKILLed"
                    self.notes.append(f"agent {agent.index} {detail}")
                await asyncio.sleep(f["down"])  # the host's downtime, part of the fault
                await agent.start()
                end(d=detail)
            finally:
                agent.busy = False
        elif kind == "force":
            # Over a lease that lives on: a holder with a second or more to go, or else a
            # victim of our own, holding 4-6 s (across renewals), on a key the pick names.
            now = proc.now_ns()
            # Slot keys are never forced: a plain force of one is refused (64).
            held = [r for r in self._candidates(inside_only=True) if r.key in self.keys
                    if r.enter_ns and r.enter_ns + r.hold_ms * 1_000_000 - now > 1_000_000_000]
            if held:
                victim = held[f["pick"] % len(held)]
            else:
                key = self.keys[f["pick"] % len(self.keys)]
                made = asyncio.get_running_loop().create_future()
                task = asyncio.ensure_future(self.run_once(
                    key, agent, "work", 4000 + f["pick"] % 2000, self.o.wait, made=made))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
                victim = await made
                try:
                    await asyncio.wait_for(victim.entered.wait(), self.o.wait + 5)
                except asyncio.TimeoutError:
                    pass
                if not victim.inside or self.faults_off:
                    self.skipped[kind] += 1
                    return
            key = victim.key
            others = [a for a in self.agents if a.index != victim.agent]
            via = others[(f["pick"] // 7) % len(others)]
            self.ledger.write("F", seq, kind, "start", via.index, key, f"holder={victim.id}")
            self.ledger.write("F", seq, kind, "end", via.index, key, "")
            self.counts[kind] += 1
            made = asyncio.get_running_loop().create_future()
            code = await self.run_once(key, via, "force", 5 + f["pick"] % 300, self.o.wait,
                                       made=made)
            forcer = made.result()
            # The write the displaced run had sent lands now, after the forced run's:
            # the fence must refuse it (its token is lower than the one stored).
            if code == 0 and forcer.wrote and victim.token and victim.token != "none":
                await self.late_write(victim)
            return
        elif kind == "run_file_removed":
            start()
            removed = 0
            for entry in os.scandir(self.backend.lock_dir()):
                if entry.name.endswith(".run") and not entry.name.startswith("."):
                    try:
                        os.unlink(entry.path)
                        removed += 1
                    except FileNotFoundError:
                        pass
            end(d=f"removed={removed}")
        elif kind == "backend_pause":
            if self.pausing:
                self.skipped[kind] += 1
                return
            self.pausing = True
            pids = self.backend.pause_pids()
            start(d=f"duration={f['duration']} pids={len(pids)}")
            try:
                for p in pids:
                    os.kill(p, signal.SIGSTOP)
                await asyncio.sleep(f["duration"])
            finally:
                for p in self.backend.pause_pids() + pids:
                    try:
                        os.kill(p, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
                self.pausing = False
            end()
        elif kind.startswith("net_"):
            px = self.proxies[agent.index]
            if kind == "net_latency":
                start(d=f"latency={f['latency']} duration={f['duration']}")
                px.add_latency(f["latency"], f["duration"])
                await asyncio.sleep(f["duration"])
                end()
            elif kind == "net_drop":
                start()
                n = px.drop_all()
                end(d=f"connections={n}")
            elif kind == "net_blackhole":
                start(d=f"duration={f['duration']}")
                await px.blackhole(f["duration"])
                end()
            else:
                what = "lost" if kind == "net_lost" else "reset"
                fired_before = len(px.fired)
                start()
                px.arm(what)
                # Fires on the agent's next request: renewals come every TTL/3.
                loop = asyncio.get_running_loop()
                deadline = loop.time() + self.ttl
                while len(px.fired) == fired_before and what in px.armed:
                    if loop.time() > deadline:
                        break
                    await asyncio.sleep(0.05)
                if px.disarm(what):
                    end(d="never fired")
                    self.skipped[kind] += 1
                    return
                end()
        self.counts[kind] += 1

    async def late_write(self, victim):
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               "CHAOS_LEDGER": self.ledger.path, "CHAOS_NOTIFY": self.dpath,
               "CHAOS_RUN": f"late-{victim.id}",
               "RUNLOCK_KEY": victim.key, "RUNLOCK_TOKEN": victim.token, "CHAOS_LATE": "1",
               **self.counter_envs[victim.agent]}
        child = proc.Child(self.reaper, [self.python, "-I", "-S", CRITICAL], env=env)
        if await child.wait(60) is None:
            child.signal_group(signal.SIGKILL)
            self.notes.append(f"the late write of run {victim.id} still ran after 60 s; killed")

    async def counters(self, what):
        """counter.py `what` (init, final) on the store itself, every key's counter."""
        env = dict(os.environ, CHAOS_LEDGER=self.ledger.path, **self.backend.counter_env())
        code, out = await self.backend._run(
            [self.python, "-I", "-S", COUNTER, what] + self.keys, env=env)
        if code != 0:
            raise RuntimeError(f"counter.py {what} exited {code}: {out[-500:]!r}")

    async def faults(self, plan, t0):
        loop = asyncio.get_running_loop()
        pending = set()
        for f in plan:
            delay = t0 + f["at"] - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)  # the schedule's own clock
            if self.faults_off:
                break
            task = asyncio.ensure_future(self.apply(f))
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            await asyncio.wait(pending, timeout=60)

    # --- the whole run ----------------------------------------------------

    async def run(self):
        loop = asyncio.get_running_loop()
        self.python = os.path.realpath(__import__("sys").executable)
        self.reaper = self.o.reaper
        self.notes = []
        self.workdir = tempfile.mkdtemp(prefix=f"runlock-chaos-{self.name}-", dir="/tmp")
        self.shim_err = os.path.join(self.workdir, "shim-stderr")
        os.makedirs(self.shim_err)
        self.ledger = ledger_mod.Ledger(os.path.join(self.workdir, "ledger.tsv"))
        self.dpath = os.path.join(self.workdir, "runs.sock")
        self.dsock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.dsock.bind(self.dpath)
        self.dsock.setblocking(False)
        self.dsock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        loop.add_reader(self.dsock, self._on_datagram)
        self.backend = backends.Backend(self.name, self.repo, self.workdir, self.reaper)
        n_agents = self.o.agents
        skewed = n_agents - 1 if self.o.skew else None
        plan = schedule_mod.make(self.o.seed, self.o.seconds, n_agents, self.backend.network,
                                 self.o.fault_interval)
        self.counted = self.name in backends.COUNTED
        self.ledger.write("C", f"backend={self.name}", f"counter={int(self.counted)}",
                          f"ttl_ms={self.ttl * 1000}",
                          f"slack_ms={self.o.slack_ms}", f"keys={','.join(self.keys)}",
                          f"agents={n_agents}", f"seed={self.o.seed}",
                          f"schedule={schedule_mod.digest(plan)}")
        ok = False
        try:
            await self.backend.start()
            if self.counted:
                await self.counters("init")
            self.counter_envs = []
            for i in range(n_agents):
                port = None
                if self.backend.network:
                    px = proxy_mod.Proxy(f"agent{i}", *self.backend.upstream)
                    port = await px.start()
                    self.proxies.append(px)
                self.counter_envs.append(
                    self.backend.counter_env(self.proxies[i].side_port if port else None))
                uri, env = self.backend.agent_setup(i, port)
                self.agents.append(agents_mod.Agent(
                    i, self.bindir, self.workdir, self.reaper, self.ledger, uri, env, self.ttl,
                    skew=self.o.skew if i == skewed else None))
            await asyncio.gather(*(a.start() for a in self.agents))
            self.say(f"seed {self.o.seed}, {self.o.seconds} s, {n_agents} agents"
                     + (f" (agent {skewed}'s wall clock {self.o.skew})" if skewed is not None
                        else "")
                     + f", {self.o.workers} workers, {len(self.keys)} keys, TTL {self.ttl} s, "
                     f"{len(plan)} faults scheduled (schedule {schedule_mod.digest(plan)})")
            self.ledger.write("P", "faults_on")
            t0 = loop.time()
            workers = [asyncio.ensure_future(self.worker(w)) for w in range(self.o.workers)]
            faults = asyncio.ensure_future(self.faults(plan, t0))
            await asyncio.sleep(self.o.seconds)  # the run's length
            self.faults_off = True
            await asyncio.wait({faults}, timeout=90)
            self.ledger.write("P", "faults_off")
            # Heal: every agent up, the network clean, the store running.
            for px in self.proxies:
                px.latency_s = 0
                px.blackhole_until = 0
                px.armed.clear()
            for p in self.backend.pause_pids() if self.backend.network else []:
                try:
                    os.kill(p, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            for a in self.agents:
                if not a.up.is_set() and not a.busy:
                    await a.start()
            self.stopping = True
            bound = self.o.wait + 7 + 3 * self.ttl + 40
            await asyncio.wait(workers, timeout=bound)
            # The final phase: each key, with a bounded wait, through each agent in turn.
            self.ledger.write("P", "final")
            wait_s = 3 * self.ttl + 10
            codes = await asyncio.gather(*(
                self.run_once(k, self.agents[i % n_agents], "final", 10, wait_s)
                for i, k in enumerate(self.keys)))
            if self.counted:
                await self.counters("final")
            self.ledger.write("P", "done")
            ok = True
        finally:
            await self.shutdown()
        result = checker.check(self.ledger.path)
        result["grants"] = sum(a.grants() for a in self.agents)
        result["faults"] = dict(self.counts)
        result["skipped"] = dict(self.skipped)
        result["workdir"] = self.workdir
        result["final_codes"] = codes if ok else None
        for a in self.agents:
            self.notes.extend(f"agent {a.index}: {s}" for s in a.stuck)
        return result

    async def shutdown(self):
        self.stopping = True
        self.faults_off = True
        for r in list(self.runs.values()):
            self._kill_run(r)
        # A command whose shim was killed may still be inside: its kill at
        # the end is recorded too, or its section would look unended.
        for r in self.shimless:
            if proc.pid_alive(r.pid):
                self._killpg(r.pid)
                self.ledger.write("K", r.id)
        for a in self.agents:
            await a.stop()
        for px in self.proxies:
            await px.close()
        await self.backend.stop()
        try:
            asyncio.get_running_loop().remove_reader(self.dsock)
        except Exception:
            pass
        self.dsock.close()
        # Commands left by killed shims are our children now (subreaper): end them.
        for pid in proc.descendants_of(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def cleanup(self, keep):
        if not keep:
            shutil.rmtree(self.workdir, ignore_errors=True)
