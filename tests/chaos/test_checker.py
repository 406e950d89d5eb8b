"""The checker's one excused overlap, on ledgers written line by line: a run
whose shim was killed while its agent was away is left running past its
lease, as the book documents, and the run after it is counted apart from
the overlaps; the same overlap with anyone left to stop the run, or on
file://, fails.

Run: python3 -B -m unittest discover -s tests/chaos -p 'test_*.py'
"""

import os
import tempfile
import unittest

import checker
from ledger import Ledger

KEY = "chaos-1"
MS = 1_000_000


class UnstoppedRun(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="runlock-checker-test-")
        self.path = os.path.join(self.dir.name, "ledger.tsv")
        self.ledger = Ledger(self.path)

    def tearDown(self):
        self.ledger.close()
        self.dir.cleanup()

    def ledger_of(self, backend, *, agent_down, agent_up, shim_killed):
        """Run 1 (token 43, agent 0) forced by run 2 (token 44, agent 2), which
        enters at 6000 ms while run 1's command holds until 6178 ms; agent 0
        is down from `agent_down` to `agent_up`, run 1's shim SIGKILLed at
        `shim_killed` (ms)."""
        w = self.ledger.write
        w("C", f"backend={backend}", "ttl_ms=5000", f"keys={KEY}", t=0)
        w("S", 1, 0, KEY, "work", t=1 * MS)
        w("E", 1, KEY, 43, "l1", 0, 0, 101, 0, t=2 * MS)
        w("F", 1, "force", "start", 2, KEY, "holder=1", t=3 * MS)
        w("S", 2, 2, KEY, "force", t=3 * MS)
        w("F", 2, "agent_term", "start", 0, "-", "down=0.4", t=agent_down * MS)
        w("A", 0, "down", t=agent_down * MS)
        w("F", 3, "shim_kill", "start", 0, KEY, "run=1", t=shim_killed * MS)
        w("X", 1, 0, KEY, "work", -9, t=shim_killed * MS)
        w("A", 0, "up", t=agent_up * MS)
        w("E", 2, KEY, 44, "l2", 2, 1, 102, 0, t=6000 * MS)
        w("L", 1, KEY, 43, "done", t=6178 * MS)
        w("L", 2, KEY, 44, "done", t=6200 * MS)
        w("X", 2, 2, KEY, "force", 0, t=6300 * MS)
        return checker.check(self.path)

    def overlaps(self, res):
        return [v for v, _ in res["violations"] if v.startswith("overlap")]

    def test_a_run_left_by_its_shim_and_its_agent_is_counted_apart(self):
        res = self.ledger_of("postgres", agent_down=2000, agent_up=4700, shim_killed=3800)
        self.assertEqual(res["overlaps"], 0)
        self.assertEqual(self.overlaps(res), [])
        self.assertEqual(len(res["orphaned"]), 1)
        self.assertIn("run 2 (token 44) entered beside run 1 (token 43)", res["orphaned"][0])

    def test_an_agent_going_down_after_the_shim_was_killed_leaves_the_run_too(self):
        res = self.ledger_of("postgres", agent_down=4000, agent_up=4500, shim_killed=3800)
        self.assertEqual((res["overlaps"], len(res["orphaned"])), (0, 1))

    def test_a_shim_killed_once_its_agent_was_back_fails(self):
        # The agent was up again: the shim could have reattached, and the
        # agent enforces --on-lost once the shim is gone.
        res = self.ledger_of("postgres", agent_down=2000, agent_up=3000, shim_killed=3800)
        self.assertEqual(res["overlaps"], 1)
        self.assertEqual(len(self.overlaps(res)), 1)
        self.assertEqual(res["orphaned"], [])

    def test_on_file_the_run_holds_its_lock_and_the_overlap_fails(self):
        res = self.ledger_of("file", agent_down=2000, agent_up=4700, shim_killed=3800)
        self.assertEqual(res["overlaps"], 1)
        self.assertEqual(res["orphaned"], [])


if __name__ == "__main__":
    unittest.main()
