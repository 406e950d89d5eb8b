//! A shared file that runs append `start ID` / `end ID` to, so a test can
//! prove that runs holding the same keys never overlapped.

use anyhow::{ensure, Context, Result};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

pub struct Journal {
    path: PathBuf,
}

impl Journal {
    pub fn new(dir: &Path) -> Journal {
        Journal {
            path: dir.join("journal"),
        }
    }

    /// A shell script for run `id` that marks its start and end.
    pub fn script(&self, id: usize) -> String {
        format!(
            "echo start {id} >> {j}; sleep 0.02; echo end {id} >> {j}",
            j = self.path.display()
        )
    }

    /// Every one of `runs` ran exactly once, each start followed by its own end.
    pub fn assert_serial(&self, runs: usize) -> Result<()> {
        let text = std::fs::read_to_string(&self.path)?;
        let lines: Vec<&str> = text.lines().collect();
        ensure!(lines.len() == 2 * runs, "every run ran once:\n{text}");
        let mut seen = BTreeSet::new();
        for pair in lines.chunks(2) {
            let id = pair[0]
                .strip_prefix("start ")
                .context("a run started inside another")?;
            ensure!(pair[1] == format!("end {id}"), "runs overlapped:\n{text}");
            ensure!(seen.insert(id.to_string()), "run {id} ran twice:\n{text}");
        }
        Ok(())
    }
}
