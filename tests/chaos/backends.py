"""The stores the chaos runs share: each started with the project's own
emulator script (tests/scripts/*.sh) on free ports, prepared as the Rust
tests prepare it (tests/support/stores/), reached by each agent through its
own fault proxy, paused with SIGSTOP, and stopped by the script's own stop
function.

Each emulator is started by a bash "controller" that sources the script,
calls its start function, writes the exported RUNLOCK_TEST_* variables to a
private file, and then waits on its stdin: closing that pipe (which the
kernel does too if the harness dies) makes it run the stop function.
Nothing read from the scripts is printed (they carry the Azurite key and a
Postgres password).
"""

import asyncio
import json
import os
import signal
import subprocess
import tempfile
import urllib.parse
import urllib.request

import proc

# name: (script, start, stop, pid variables)
SCRIPTS = {
    "s3": ("moto.sh", "moto_start", "moto_stop"),
    "ministack": ("ministack.sh", "ministack_start", "ministack_stop"),
    "azure": ("azurite.sh", "azurite_start", "azurite_stop"),
    "gs": ("fake_gcs.sh", "fake_gcs_start", "fake_gcs_stop"),
    "postgres": ("postgres.sh", "pg_start", "pg_stop"),
    # One plain server: etcd_start also makes an authenticated and a TLS one.
    "etcd": ("etcd.sh", "etcd_install && etcd_launch CHAOS_ETCD_URL 23790 && "
             "export RUNLOCK_TEST_ETCD_ENDPOINT=$CHAOS_ETCD_URL", "etcd_stop"),
}
NAMES = ["file"] + list(SCRIPTS)
# The S3 emulators (two, written apart), and the variable naming each one's endpoint.
S3_ENDPOINTS = {"s3": "RUNLOCK_TEST_S3_ENDPOINT", "ministack": "RUNLOCK_TEST_MINISTACK_ENDPOINT"}
SPACE = "runlock-chaos"  # bucket, container, database, etcd prefix
# The stores the runs keep a counter in (counter.py), which each run increments.
COUNTED = {"file", "s3", "ministack", "postgres"}


class Backend:
    """One store for one chaos run. `file` has no process and no network."""

    def __init__(self, name, repo, workdir, reaper):
        self.name = name
        self.repo = repo
        self.workdir = workdir
        self.reaper = reaper
        self.controller = None
        self.vars = {}
        self.upstream = None  # (host, port) the proxies forward to
        self.log = os.path.join(workdir, f"emulator-{name}.log")

    @property
    def network(self):
        return self.name != "file"

    async def start(self, timeout=300):
        if not self.network:
            os.makedirs(os.path.join(self.workdir, "file-backend"), mode=0o700)
            return
        script, start, stop = SCRIPTS[self.name]
        envfile = os.path.join(self.workdir, f"{self.name}.env")
        pidfile = os.path.join(self.workdir, f"{self.name}.pids")
        cmd = (
            f'source tests/scripts/{script} || exit 1\n'
            f'{start} || exit 1\n'
            f'trap "{stop}" EXIT\n'
            f'(umask 077; env -0 >"{envfile}")\n'
            # The processes to pause: the variables that name them.
            f'echo "${{MOTO_PID:-}} ${{MINISTACK_PID:-}} ${{AZURITE_PID:-}} '
            f'${{FAKE_GCS_PID:-}} ${{ETCD_PIDS:-}}" >"{pidfile}"\n'
            f'echo ready\n'
            f'read -r _ || true\n'
        )
        env = dict(os.environ)
        env.setdefault("RUNLOCK_EMU_DIR", "/tmp/runlock-emu")
        with open(self.log, "ab") as log:
            self.controller = proc.Child(
                self.reaper, ["bash", "-c", cmd], env=env, cwd=self.repo,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, session=True)
        loop = asyncio.get_running_loop()
        out = self.controller.popen.stdout
        try:
            line = await asyncio.wait_for(loop.run_in_executor(None, out.readline), timeout)
        except asyncio.TimeoutError:
            line = b""
        if line.strip() != b"ready":
            raise RuntimeError(f"{self.name}: the emulator did not start; see {self.log}")
        with open(envfile, "rb") as f:
            for item in f.read().split(b"\0"):
                k, _, v = item.decode(errors="replace").partition("=")
                if k.startswith("RUNLOCK_TEST_"):
                    self.vars[k] = v
        os.unlink(envfile)
        with open(pidfile) as f:
            self.pids = [int(p) for p in f.read().split()]
        await self._prepare()

    async def _run(self, argv, env=None, timeout=60):
        """(exit code, output) of a helper command, reaped by the harness's reaper."""
        with tempfile.TemporaryFile() as out:
            child = proc.Child(self.reaper, argv, env=env, stdout=out, stderr=out)
            done = await child.wait(timeout)
            if done is None:
                child.signal_group(signal.SIGKILL)
                await child.wait(5)
                return -1, b"timed out"
            out.seek(0)
            return done[0], out.read()

    async def _prepare(self):
        """Makes the bucket, container or database, as the Rust tests do."""
        v = self.vars
        if self.name in S3_ENDPOINTS:
            endpoint = v[S3_ENDPOINTS[self.name]]
            url = urllib.parse.urlparse(endpoint)
            self.upstream = (url.hostname, url.port)
            # Both accept an unsigned bucket creation (tests/support/stores/s3.rs).
            req = urllib.request.Request(f"{endpoint}/{SPACE}", method="PUT")
            await asyncio.to_thread(lambda: urllib.request.urlopen(req, timeout=10).read())
        elif self.name == "gs":
            url = urllib.parse.urlparse(v["RUNLOCK_TEST_GCS_ENDPOINT"])
            self.upstream = (url.hostname, url.port)
            req = urllib.request.Request(
                f"{v['RUNLOCK_TEST_GCS_ENDPOINT']}/storage/v1/b?project=test",
                data=json.dumps({"name": SPACE}).encode(),
                headers={"Content-Type": "application/json"}, method="POST")
            await asyncio.to_thread(lambda: urllib.request.urlopen(req, timeout=10).read())
        elif self.name == "azure":
            url = urllib.parse.urlparse(v["RUNLOCK_TEST_AZURE_ENDPOINT"])
            self.upstream = (url.hostname, url.port)
            self.account_path = url.path  # /devstoreaccount1
            # With Azure's own SDK from the script's venv (tests/support/stores/azure.rs).
            code = ("import os\nfrom azure.storage.blob import BlobServiceClient\n"
                    "s = BlobServiceClient.from_connection_string("
                    "os.environ['AZURE_STORAGE_CONNECTION_STRING'])\n"
                    f"s.get_container_client('{SPACE}').create_container()\n")
            env = dict(os.environ,
                       AZURE_STORAGE_CONNECTION_STRING=v["RUNLOCK_TEST_AZURE_CONNECTION_STRING"])
            code, _ = await self._run([v["RUNLOCK_TEST_AZURE_PYTHON"], "-c", code], env=env)
            if code != 0:
                raise RuntimeError("azure: creating the container failed (the SDK's output is "
                                   "not shown: it may name the key)")
        elif self.name == "postgres":
            url = urllib.parse.urlparse(v["RUNLOCK_TEST_PG_URI"])
            self.upstream = (url.hostname, url.port)
            psql = os.path.join(v["RUNLOCK_TEST_PG_BIN"], "psql")
            if not os.path.exists(psql):
                psql = "psql"
            code, out = await self._run([psql, "-q", v["RUNLOCK_TEST_PG_URI"], "-v",
                                         "ON_ERROR_STOP=1", "-c", f'CREATE DATABASE "{SPACE}"'])
            if code != 0:
                raise RuntimeError(f"postgres: CREATE DATABASE failed: {out[-500:]!r}")
            self.psql = psql
            self.pg_dir = os.path.dirname(os.path.dirname(v["RUNLOCK_TEST_PG_CA"]))
        elif self.name == "etcd":
            url = urllib.parse.urlparse(v["RUNLOCK_TEST_ETCD_ENDPOINT"])
            self.upstream = (url.hostname, url.port)

    def pause_pids(self):
        """Every process of the store (for Postgres: the postmaster and all its children)."""
        if self.name == "postgres":
            try:
                with open(os.path.join(self.pg_dir, "data", "postmaster.pid")) as f:
                    master = int(f.readline())
            except (OSError, ValueError):
                return []
            return [master] + proc.descendants_of(master)
        pids = list(self.pids)
        for p in self.pids:
            pids.extend(proc.descendants_of(p))
        return pids

    def lock_dir(self):
        """`file`'s lock directory."""
        return os.path.join(self.workdir, "file-backend", "locks")

    def agent_setup(self, index, proxy_port):
        """(backend URI, environment) for agent `index`, whose proxy listens on `proxy_port`."""
        if self.name == "file":
            return f"file://{self.lock_dir()}", {}
        at = f"127.0.0.1:{proxy_port}"
        if self.name in S3_ENDPOINTS:
            return f"s3://{SPACE}/chaos", {
                "AWS_ENDPOINT_URL": f"http://{at}", "AWS_ENDPOINT_URL_S3": f"http://{at}",
                "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
        if self.name == "gs":
            return f"gs://{SPACE}/chaos", {"STORAGE_EMULATOR_HOST": f"http://{at}"}
        if self.name == "azure":
            real = self.vars["RUNLOCK_TEST_AZURE_CONNECTION_STRING"]
            parts = [p for p in real.split(";") if p and not p.startswith("BlobEndpoint=")]
            parts.append(f"BlobEndpoint=http://{at}{self.account_path}")
            return f"azure://{SPACE}/chaos", {
                "AZURE_STORAGE_CONNECTION_STRING": ";".join(parts) + ";"}
        if self.name == "postgres":
            # Plain TCP through the proxy, so its faults cut statements, not TLS records.
            return f"postgresql://postgres@{at}/{SPACE}?sslmode=disable", {}
        if self.name == "etcd":
            return f"etcd://{at}/{SPACE}", {}
        raise ValueError(self.name)

    def counter_env(self, proxy_port=None):
        """The environment of counter.py for a run whose side of its agent's proxy
        is `proxy_port` (None: the store itself); {} where no counter is kept."""
        if self.name not in COUNTED:
            return {}
        if self.name == "file":
            return {"CHAOS_COUNTER": f"file:{os.path.join(self.workdir, 'file-backend', 'counters')}"}
        at = f"127.0.0.1:{proxy_port}" if proxy_port else "%s:%d" % self.upstream
        if self.name == "postgres":
            return {"CHAOS_COUNTER": f"pg:postgresql://postgres@{at}/{SPACE}?sslmode=disable",
                    "CHAOS_PSQL": self.psql}
        return {"CHAOS_COUNTER": f"s3:http://{at}/{SPACE}"}

    async def stop(self):
        if self.controller is None:
            return
        # Whatever a fault left stopped must run again to stop.
        for pid in self.pause_pids():
            try:
                os.kill(pid, signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.controller.popen.stdin.close()
        except OSError:
            pass
        if await self.controller.wait(30) is None:
            self.controller.signal_group(9)
            await self.controller.wait(5)
        # A server the script could not stop (it waits 5 s, then SIGKILLs) is ours to end.
        for pid in getattr(self, "pids", []):
            if proc.pid_alive(pid):
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
