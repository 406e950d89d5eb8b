"""The agents: one real `runlockd` per simulated host, each with its own
directory (socket, config file, notify socket, log), its own host name (a UTS
namespace, when run as root) and, for one of them, a wall clock set off by
libfaketime. Ready means the READY=1 datagram on its NOTIFY_SOCKET.
"""

import asyncio
import glob
import os
import signal
import socket

import proc


def faketime_library():
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1")
                   + glob.glob("/usr/lib/faketime/libfaketimeMT.so.1"))
    return found[0] if found else None


class Agent:
    def __init__(self, index, bindir, workdir, reaper, ledger, uri, env, ttl_s, skew=None):
        self.index = index
        self.runlockd = os.path.join(bindir, "runlockd")
        self.dir = os.path.join(workdir, f"agent{index}")
        os.makedirs(self.dir, mode=0o700)
        self.socket = os.path.join(self.dir, "agent.sock")
        self.config = os.path.join(self.dir, "runlockd.toml")
        self.log = os.path.join(self.dir, "runlockd.log")
        self.reaper = reaper
        self.ledger = ledger
        self.env = env
        self.skew = skew
        self.child = None
        self.starts = 0
        self.up = asyncio.Event()
        self.busy = False  # a fault is stopping or restarting it
        self.dumped = 0
        self.stuck = []  # what went wrong with it, for the report
        with open(self.config, "w") as f:
            # No secrets here: credentials come through the environment.
            f.write(f'socket = "{self.socket}"\nbackend = "{uri}"\nttl = "{ttl_s}s"\n'
                    'on_unavailable = "fail"\nlog_format = "json"\n')
        self.notify_path = os.path.join(self.dir, "notify.sock")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(self.notify_path)
        self.notify.setblocking(False)
        self.ready = asyncio.Event()
        asyncio.get_running_loop().add_reader(self.notify, self._on_notify)

    def _argv(self):
        argv = [self.runlockd, "--config", self.config]
        if os.geteuid() == 0:
            # A host name of its own, as separate hosts have (the agent records it).
            return ["unshare", "--uts", "--", "sh", "-c",
                    f'hostname chaos-host-{self.index} && exec "$@"', "sh"] + argv
        return argv

    def _on_notify(self):
        # Read all the time: a datagram socket nobody reads fills up, and then the
        # agent's next STATUS= update blocks it (as systemd, which always reads, never would).
        while True:
            try:
                data = self.notify.recv(4096)
            except (BlockingIOError, OSError):
                return
            if b"READY=1" in data.split(b"\n"):
                self.ready.set()

    async def start(self, timeout=60):
        self.ready.clear()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RUNLOCK_", "AWS_", "AZURE_", "STORAGE_EMULATOR", "PG",
                                    "ETCDCTL_", "JOURNAL_STREAM", "INVOCATION_ID", "NOTIFY_"))}
        env.update(self.env)
        env["NOTIFY_SOCKET"] = self.notify_path
        env["RUNLOCK_CONFIG"] = self.config
        env.setdefault("RUST_LOG", "info")
        if self.skew:
            lib = faketime_library()
            if lib is None:
                raise RuntimeError("libfaketime is not installed (apt-get install faketime)")
            env.update(LD_PRELOAD=lib, FAKETIME=self.skew, FAKETIME_DONT_FAKE_MONOTONIC="1")
        self.starts += 1
        with open(self.log, "ab") as log:
            log.write(f"=== chaos: agent {self.index} start {self.starts} ===\n".encode())
            log.flush()
            self.child = proc.Child(self.reaper, self._argv(), env=env, stderr=log, session=True)
        ready = asyncio.ensure_future(self.ready.wait())
        done, _ = await asyncio.wait({ready, self.child.exited}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if ready not in done:
            ready.cancel()
            if self.child.exited in done:
                code = self.child.exited.result()[0]
                raise RuntimeError(f"agent {self.index} exited {code} at start; log {self.log}")
            raise RuntimeError(f"agent {self.index}: no READY=1 within {timeout} s; log {self.log}")
        self.ledger.write("A", self.index, "up")
        self.up.set()

    def going_down(self):
        self.up.clear()
        self.ledger.write("A", self.index, "down")

    async def kill(self, sig, timeout):
        """Sends `sig` and waits (bounded) for the exit; SIGKILL if it outlives `timeout`
        (after its threads' stacks are saved). Returns False if SIGKILL was needed."""
        self.going_down()
        self.child.signal(sig)
        if await self.child.wait(timeout) is not None:
            return True
        await self.dump_stacks(f"still running {timeout} s after signal {int(sig)}")
        self.child.signal(signal.SIGKILL)
        await self.child.wait(10)
        return False

    async def stop(self):
        if self.child is not None and self.child.alive:
            clean = await self.kill(signal.SIGTERM, 10)
            if not clean:
                self.stuck.append("did not stop within 10 s of SIGTERM at the end")
        asyncio.get_running_loop().remove_reader(self.notify)
        self.notify.close()

    async def dump_stacks(self, why):
        """Every thread's backtrace (gdb, bounded), into the agent's directory, once per start."""
        if self.child is None or not self.child.alive or self.dumped == self.starts:
            return None
        self.dumped = self.starts
        path = os.path.join(self.dir, f"stacks-start{self.starts}.txt")
        with open(path, "wb") as out:
            out.write(f"agent {self.index} pid {self.child.pid}: {why}\n".encode())
            out.flush()
            gdb = proc.Child(self.reaper, ["gdb", "-p", str(self.child.pid), "-batch", "-nx",
                                           "-ex", "thread apply all bt"],
                             stdout=out, stderr=out)
            if await gdb.wait(60) is None:
                gdb.signal(signal.SIGKILL)
                await gdb.wait(5)
        self.stuck.append(f"{why}; stacks in {path}")
        return path

    def grants(self):
        """How many leases its log says it granted, over all its starts."""
        n = 0
        try:
            with open(self.log, "rb") as f:
                for line in f:
                    if b'"message":"acquired"' in line:
                        n += 1
        except OSError:
            pass
        return n
