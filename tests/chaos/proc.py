"""Processes the harness starts: spawning, one SIGCHLD reaper, and bounded waits.

asyncio's own subprocess support reaps each child by pid; the harness also
becomes a child subreaper (so a run's command orphaned by a shim SIGKILL is
reaped here, not left a zombie under a PID 1 that never reaps), and so it
reaps everything itself, in one place: every exit is seen as an event with
its CLOCK_MONOTONIC time, and no waitpid() elsewhere can steal it.
"""

import asyncio
import ctypes
import os
import signal
import subprocess
import time

PR_SET_CHILD_SUBREAPER = 36


def now_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def become_subreaper():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


class Reaper:
    """Reaps every child on SIGCHLD and resolves the waiter of each one started here."""

    def __init__(self, loop):
        self.loop = loop
        self.exits = {}  # pid -> Future[(exit code, monotonic ns)]
        loop.add_signal_handler(signal.SIGCHLD, self._reap)

    def track(self, pid):
        fut = self.loop.create_future()
        self.exits[pid] = fut
        return fut

    def _reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fut = self.exits.pop(pid, None)
            if fut is not None and not fut.done():
                fut.set_result((os.waitstatus_to_exitcode(status), now_ns()))
            # Anything else is an orphan re-parented to us: reaped, nothing to tell.


class Child:
    """A process started here, in a process group (or session) of its own."""

    def __init__(self, reaper, argv, *, env=None, cwd=None, stdin=subprocess.DEVNULL,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, session=False,
                 pass_fds=()):
        kw = {"start_new_session": True} if session else {"process_group": 0}
        self.popen = subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr,
            close_fds=True, pass_fds=pass_fds, **kw)
        self.pid = self.popen.pid
        self.started = now_ns()
        self.exited = reaper.track(self.pid)
        self.exited.add_done_callback(self._done)

    def _done(self, fut):
        # Tell Popen, so that it never waits for a pid already reaped.
        if not fut.cancelled():
            self.popen.returncode = fut.result()[0]

    @property
    def alive(self):
        return not self.exited.done()

    def signal(self, sig):
        self._send(os.kill, sig)

    def signal_group(self, sig):
        self._send(os.killpg, sig)

    def _send(self, kill, sig):
        """``kill(pid, sig)`` while it runs; one that exits meanwhile is no error."""
        if self.alive:
            try:
                kill(self.pid, sig)
            except ProcessLookupError:
                pass

    async def wait(self, timeout):
        """(exit code, monotonic ns), or None if it is still running after `timeout` s."""
        try:
            return await asyncio.wait_for(asyncio.shield(self.exited), timeout)
        except asyncio.TimeoutError:
            return None

    async def stop(self, timeout=5.0, group=True):
        """SIGTERM, then SIGKILL after `timeout` s; returns once it has exited (bounded)."""
        if not self.alive:
            return
        (self.signal_group if group else self.signal)(signal.SIGTERM)
        if await self.wait(timeout) is None:
            (self.signal_group if group else self.signal)(signal.SIGKILL)
            await self.wait(5.0)


def children_of(pid):
    """Pids whose parent is `pid` (this kernel has no /proc/PID/task/*/children)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses.
        rest = stat[stat.rfind(b")") + 2:].split()
        if len(rest) > 1 and int(rest[1]) == pid:
            found.append(int(name))
    return found


def descendants_of(pid):
    out, todo = [], [pid]
    while todo:
        kids = children_of(todo.pop())
        out.extend(kids)
        todo.extend(kids)
    return out


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] != b"Z"
