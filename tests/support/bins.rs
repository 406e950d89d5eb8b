//! Builds `runlockd` and `runlock` (and the Rust client's example) once per test process, with the test's own
//! profile, and finds them from cargo's own report of what it built (so a
//! `CARGO_TARGET_DIR` or a configured target dir is honoured).

use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Paths of the real binaries under test.
#[derive(Debug)]
pub struct Bins {
    /// The agent.
    pub runlockd: PathBuf,
    /// The shim.
    pub runlock: PathBuf,
    /// The Rust client's example (clients/rust/examples/hold.rs).
    pub hold_example: PathBuf,
}

static BINS: OnceLock<Result<Bins, String>> = OnceLock::new();

/// The binaries, built on first use. A build failure fails every test that
/// needs them, with cargo's output.
pub fn bins() -> anyhow::Result<&'static Bins> {
    BINS.get_or_init(|| build().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow::anyhow!("building runlockd, runlock and the hold example failed: {e}"))
}

fn build() -> anyhow::Result<Bins> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the tests package has no parent directory")?;
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .current_dir(workspace)
        .args(["build", "--message-format=json-render-diagnostics"])
        .args(["-p", "runlock-agent", "-p", "runlock-shim"])
        // runlock-docs too, from the same build: scripts/package takes it from
        // beside the binaries, so the package tests compile nothing more.
        .args(["-p", "runlock-packaging"])
        // The Rust client's example, run as its users would run it.
        .args(["-p", "runlock-client", "--example", "hold"])
        // memory-cas://, which tests and benches run agents on; no release has it.
        .args(["--features", "runlock-agent/test-support"])
        // Building the packages' tests too resolves features as the test
        // build does (tokio's `test-util` comes from a dev-dependency), so
        // the binaries share its dependencies: without it, every dependency
        // from tokio up was compiled a second time (75 s in CI; BENCHMARKS.md,
        // "CI phases").
        .args(["--bins", "--tests"]);
    for name in test_package_env() {
        cargo.env_remove(name);
    }
    if !cfg!(debug_assertions) {
        cargo.arg("--release");
    }
    let output = cargo.output().context("running cargo build")?;
    if !output.status.success() {
        bail!(
            "cargo build exited with {}:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let mut runlockd = None;
    let mut runlock = None;
    let mut hold_example = None;
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if message["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(executable) = message["executable"].as_str() else {
            continue;
        };
        if message["profile"]["test"] == true {
            continue; // a test harness built from the binary's source
        }
        match message["target"]["name"].as_str() {
            Some("runlockd") => runlockd = Some(PathBuf::from(executable)),
            Some("runlock") => runlock = Some(PathBuf::from(executable)),
            Some("hold") => hold_example = Some(PathBuf::from(executable)),
            _ => {}
        }
    }
    Ok(Bins {
        runlockd: runlockd.context("cargo build did not report the runlockd executable")?,
        runlock: runlock.context("cargo build did not report the runlock executable")?,
        hold_example: hold_example.context("cargo build did not report the hold example")?,
    })
}

/// What cargo sets for this test process describes the tests package, not a
/// build, and is removed from a cargo started from a test: ring's build script
/// tracks these names, so passing them on rebuilt ring and the AWS SDK over
/// it there, and again in the next `cargo test`.
pub fn test_package_env() -> Vec<String> {
    std::env::vars_os()
        .map(|(name, _)| name.to_string_lossy().into_owned())
        .filter(|name| {
            name.starts_with("CARGO_PKG_")
                || name.starts_with("CARGO_MANIFEST_")
                || [
                    "CARGO_CRATE_NAME",
                    "CARGO_PRIMARY_PACKAGE",
                    "CARGO_TARGET_TMPDIR",
                    "OUT_DIR",
                ]
                .contains(&name.as_str())
        })
        .collect()
}
