"""The pip wheels as a user gets them. tests/shipped/package/wheel.sh installs them
into a fresh venv (no cargo, no checkout on the import path) and runs this
file with that venv's python: ``runlock`` and ``runlockd`` must come from
the venv's bin, statically linked, the client from its site-packages, and a
locked run must go through them. Standard library only: the venv holds
nothing but the wheels and msgpack."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
import unittest
from importlib import metadata
from pathlib import Path

#: Every command run here must end within this.
BOUND_S = 30.0
#: The shim's exit status when another run holds the key (EX_TEMPFAIL).
EXIT_HELD = 75
#: The venv's bin, where pip put the wheels' binaries.
VENV_BIN = Path(sysconfig.get_path("scripts"))
#: An ELF program header's type for a dynamic loader's path.
PT_INTERP = 3


def program_header_types(path: Path) -> list[int]:
    """The p_type of each of a 64-bit little-endian ELF file's program headers."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise AssertionError(f"{path} is not a 64-bit little-endian ELF file")
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return [struct.unpack_from("<I", data, phoff + i * phentsize)[0] for i in range(phnum)]


class InstalledWheels(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        import runlock
        from runlock.testing import Agent

        cls.runlock = runlock
        # Under /tmp: a Unix socket's path must stay under ~108 bytes.
        cls.scratch = tempfile.TemporaryDirectory(prefix="runlock-wheel-", dir="/tmp")
        workdir = Path(cls.scratch.name)
        cls.socket = str(workdir / "agent.sock")
        # The venv's bin first, then the system's (for `true`): nothing else
        # could provide runlock or runlockd.
        cls.env = {
            "PATH": f"{VENV_BIN}:/usr/bin:/bin",
            "HOME": str(workdir),
            "RUNLOCK_SOCKET": cls.socket,
        }
        runlockd = shutil.which("runlockd", path=cls.env["PATH"])
        assert runlockd is not None, f"no runlockd on {cls.env['PATH']}"
        # file:// under a directory of this test's, not the default for
        # root (/var/lib/runlock), which CI would share with the host.
        cls.agent = Agent(Path(runlockd), workdir, f"file://{workdir / 'locks'}", socket=cls.socket)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.agent.stop()
        cls.scratch.cleanup()

    def shim(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["runlock", *args], env=self.env, capture_output=True, text=True, timeout=BOUND_S, cwd="/"
        )

    def test_the_binaries_are_the_venvs_and_static(self) -> None:
        for name in ("runlock", "runlock-ui", "runlockd"):
            found = shutil.which(name, path=self.env["PATH"])
            self.assertEqual(found, str(VENV_BIN / name))
            # No dynamic loader: the binary runs on any Linux of its architecture.
            self.assertNotIn(PT_INTERP, program_header_types(VENV_BIN / name), name)
            done = subprocess.run(
                [name, "--version"], env=self.env, capture_output=True, text=True, timeout=BOUND_S
            )
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertEqual(done.stdout.split(), [name, metadata.version("runlock")])

    def test_a_run_locks_and_a_second_run_is_refused(self) -> None:
        done = self.shim("run", "--key", "k", "--", "true")
        self.assertEqual(done.returncode, 0, done.stderr)
        # The run's own command tries the same key: held by the outer run,
        # refused with 75, which the outer run passes on.
        done = self.shim("run", "--key", "k", "--", "runlock", "run", "--key", "k", "--", "true")
        self.assertEqual(done.returncode, EXIT_HELD, done.stderr)
        self.assertIn("held", done.stderr)
        self.assertEqual(self.runlock.inspect("k", socket=self.socket).state, "free")

    def test_runlock_ui_hands_over_to_the_venvs_page_program(self) -> None:
        # Only runlock-ui refuses an address that is not loopback.
        done = self.shim("ui", "--listen", "0.0.0.0:0")
        self.assertEqual(done.returncode, 64, done.stderr)
        self.assertIn("only on a loopback address", done.stderr)

    def test_the_client_is_the_venvs_and_holds_a_key_the_shim_respects(self) -> None:
        installed = Path(self.runlock.__file__).resolve()
        self.assertTrue(installed.is_relative_to(Path(sys.prefix).resolve()), installed)
        self.assertEqual(self.runlock.__version__, metadata.version("runlock"))
        self.assertEqual(metadata.version("runlockd"), metadata.version("runlock"))
        with self.runlock.lock("client-held", socket=self.socket, ttl=30) as lease:
            self.assertGreaterEqual(lease.token, 1)
            done = self.shim("run", "--key", "client-held", "--", "true")
            self.assertEqual(done.returncode, EXIT_HELD, done.stderr)


if __name__ == "__main__":
    unittest.main()
