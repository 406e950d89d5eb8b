"""The checker's counter rules, on ledgers that critical.py itself writes while
it increments a real counter (the file store's): a fenced history passes, and
a write without the token check, a lost update or an increment no one can
account for fails it.

Run: python3 -B -m unittest discover -s tests/chaos -p 'test_*.py'
"""

import os
import subprocess
import sys
import tempfile
import unittest

import checker
import counter
from ledger import Ledger

HERE = os.path.dirname(os.path.abspath(__file__))
KEY = "chaos-0"


class CounterHistory(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="runlock-counter-test-")
        self.path = os.path.join(self.dir.name, "ledger.tsv")
        self.ledger = Ledger(self.path)
        self.env = {"CHAOS_COUNTER": f"file:{os.path.join(self.dir.name, 'counters')}"}
        self.store = counter.open_store(self.env["CHAOS_COUNTER"])
        self.store.init(KEY)
        self.ledger.write("C", "backend=file", "counter=1", f"keys={KEY}")
        self.ledger.write("P", "faults_on")
        self.runs = 0

    def tearDown(self):
        self.ledger.close()
        self.dir.cleanup()

    def critical(self, token, *, role="work", late=False, unfenced=False):
        """One critical section (or, `late`, a forced-out run's late write) of
        critical.py, with its shim's lines; returns the run's id."""
        rid = f"late-{token}" if late else str(self.runs)
        self.runs += 1
        env = {"PATH": os.environ["PATH"], "CHAOS_LEDGER": self.path, "CHAOS_RUN": rid,
               "CHAOS_NOTIFY": os.path.join(self.dir.name, "nobody.sock"), "CHAOS_AGENT": "0",
               "CHAOS_FORCED": "1" if role == "force" else "0", "CHAOS_HOLD_MS": "0",
               "RUNLOCK_KEY": KEY, "RUNLOCK_TOKEN": str(token), "RUNLOCK_LEASE_ID": f"l{rid}",
               **self.env}
        if late:
            env["CHAOS_LATE"] = "1"
        if unfenced:
            env["CHAOS_UNFENCED"] = "1"
        if not late:
            self.ledger.write("S", rid, 0, KEY, role)
        code = subprocess.run([sys.executable, "-I", "-S", os.path.join(HERE, "critical.py")],
                              env=env, timeout=60).returncode
        self.assertEqual(code, 0)
        if not late:
            self.ledger.write("X", rid, 0, KEY, role, code)
        return rid

    def check(self):
        self.ledger.write("P", "final")
        self.critical(self.final_token, role="final")
        env = dict(os.environ, CHAOS_LEDGER=self.path, **self.env)
        subprocess.run([sys.executable, "-I", "-S", os.path.join(HERE, "counter.py"), "final", KEY],
                       env=env, check=True, timeout=60)
        self.ledger.write("P", "done")
        result = checker.check(self.path)
        return result, [what for what, _ in result["violations"]]

    def forced_history(self, **late):
        self.critical(1)
        self.critical(2)
        self.critical(3, role="force")
        self.critical(2, late=True, **late)  # run 2's write, arriving after run 3's
        self.final_token = 4

    def test_a_fenced_history_passes_and_the_late_write_is_refused(self):
        self.forced_history()
        result, violations = self.check()
        self.assertEqual(violations, [])
        c = result["counter"]
        self.assertEqual((c["increments"], c["completed"], c["final"]), (4, 4, {KEY: 4}))
        self.assertEqual((c["late_writes"], c["late_refused"], c["late_landed"]), (1, 1, 0))

    def test_a_write_without_the_token_check_is_caught(self):
        self.forced_history(unfenced=True)
        result, violations = self.check()
        self.assertEqual(result["counter"]["late_landed"], 1)
        self.assertTrue(any("value 4 was written with token 2 by run late-2, after token 3 "
                            "(run 2): applied out of token order" in v for v in violations),
                        violations)

    def test_a_lost_update_is_caught(self):
        self.critical(1)
        self.critical(2)
        # A store that lost run 1's write (no conditional write): run 2's then
        # replaced it, and run 3 made value 2 over it again.
        self.store._replace(KEY, (1, 1, "0"), "lost")
        self.critical(3)
        self.final_token = 4
        _, violations = self.check()
        self.assertTrue(any("value 2 was made twice, by run 1 (token 2) and by run 2 (token 3): "
                            "an update was lost" in v for v in violations), violations)

    def test_a_killed_runs_increment_is_told_from_the_counter(self):
        self.critical(1)
        # Killed between its intent and its outcome, after its write landed.
        self.ledger.write("S", "killed", 0, KEY, "work")
        self.ledger.write("I", "killed", KEY, 2, "section")
        counter.increment(self.store, KEY, 2, "killed")
        self.critical(3)
        self.final_token = 4
        result, violations = self.check()
        self.assertEqual(violations, [])
        c = result["counter"]
        self.assertEqual((c["increments"], c["completed"], c["unknown_landed"]), (4, 3, 1))

    def test_an_increment_no_run_meant_is_caught(self):
        self.critical(1)
        counter.increment(self.store, KEY, 2, "stranger")  # no intent line
        self.final_token = 3
        _, violations = self.check()
        self.assertTrue(any("value 2 was written by stranger, which no run says it meant to "
                            "write" in v for v in violations), violations)


if __name__ == "__main__":
    unittest.main()
