//! The Debian package: `scripts/package` builds it from the binaries the tests
//! built; its files and control fields are the expected ones, lintian reports
//! nothing unexplained, and installed into a scratch root (`dpkg --root`, the
//! maintainer scripts run there through DPKG_ROOT) it makes the user, the
//! directories and the socket's enablement, its units verify, its man pages
//! render, its completions parse and complete, its binaries lock a run
//! together, and upgrade, remove and purge keep what the operator wrote.
//!
//! Building the package and what the .deb holds are here; the package
//! installed into a scratch root has a file of its own.

mod installed;

use crate::shipped::systemd::text;
use crate::support::agent::temp_dir;
use crate::support::bins::{bins, test_package_env};
use crate::support::{within, WAIT};
use anyhow::{ensure, Context, Result};
use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;
use tokio::process::Command;
use tokio::sync::OnceCell;

/// Building the package compiles the man page generator (once) and strips and
/// compresses some tens of megabytes of debug binaries.
const BUILD_WAIT: Duration = Duration::from_secs(600);

/// The tags lintian may report, each with why it stays.
const LINTIAN_ALLOWED: &[(&str, &str)] = &[
    (
        "embedded-library",
        "libyaml in runlock: the shim reads meltano.yml with a Rust translation of \
         libyaml (unsafe-libyaml, through yaml_serde), statically linked as every Rust \
         dependency is; there is no C libyaml to link instead",
    ),
    (
        "hardening-no-fortify-functions",
        "Rust code does not call glibc's unchecked string functions that \
         _FORTIFY_SOURCE replaces; nothing is left to fortify",
    ),
    (
        "package-supports-alternative-init-but-no-init.d-script",
        "systemd only, on purpose: runlockd relies on socket activation and \
         Type=notify; without systemd it runs as `runlockd` from any supervisor",
    ),
    (
        "spelling-error-in-binary",
        "the words are in strings of statically linked dependencies, not ours",
    ),
];

/// The files the package installs (directories aside).
const FILES: &[&str] = &[
    "etc/runlock/runlockd.toml",
    "usr/bin/runlock",
    "usr/bin/runlockd",
    "usr/lib/systemd/system/runlockd.service",
    "usr/lib/systemd/system/runlockd.socket",
    "usr/lib/sysusers.d/runlock.conf",
    "usr/lib/tmpfiles.d/runlock.conf",
    "usr/libexec/runlock/runlock-ui",
    "usr/share/bash-completion/completions/runlock",
    "usr/share/bash-completion/completions/runlockd",
    "usr/share/doc/runlock/changelog.gz",
    "usr/share/doc/runlock/copyright",
    "usr/share/fish/vendor_completions.d/runlock.fish",
    "usr/share/fish/vendor_completions.d/runlockd.fish",
    "usr/share/man/man1/runlock-history.1.gz",
    "usr/share/man/man1/runlock-inspect.1.gz",
    "usr/share/man/man1/runlock-list.1.gz",
    "usr/share/man/man1/runlock-release.1.gz",
    "usr/share/man/man1/runlock-run.1.gz",
    "usr/share/man/man1/runlock-status.1.gz",
    "usr/share/man/man1/runlock-ui.1.gz",
    "usr/share/man/man1/runlock.1.gz",
    "usr/share/man/man5/runlockd.toml.5.gz",
    "usr/share/man/man8/runlockd-check-config.8.gz",
    "usr/share/man/man8/runlockd.8.gz",
    "usr/share/zsh/vendor-completions/_runlock",
    "usr/share/zsh/vendor-completions/_runlockd",
];

const CONFFILE: &str = "etc/runlock/runlockd.toml";
const SOCKET_ENABLED: &str = "etc/systemd/system/sockets.target.wants/runlockd.socket";

fn workspace() -> Result<PathBuf> {
    Ok(Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the tests package has no parent directory")?
        .to_owned())
}

static PACKAGE: OnceCell<std::result::Result<PathBuf, String>> = OnceCell::const_new();

/// The .deb, built once per test process from the tests' own binaries.
async fn package() -> Result<&'static Path> {
    PACKAGE
        .get_or_init(|| async { build_package().await.map_err(|e| format!("{e:#}")) })
        .await
        .as_deref()
        .map_err(|e| anyhow::anyhow!("building the package failed: {e}"))
}

async fn build_package() -> Result<PathBuf> {
    let bin_dir = bins()?
        .runlockd
        .parent()
        .context("runlockd has no directory")?
        .to_owned();
    ensure!(
        bin_dir.join("runlock").exists(),
        "runlock is not beside runlockd in {}",
        bin_dir.display()
    );
    let mut command = Command::new(workspace()?.join("scripts/package"));
    command
        .env("RUNLOCK_BIN_DIR", &bin_dir)
        // xz at its fastest: the debug binaries are large, and the level
        // changes no byte of what is installed.
        .env("DPKG_DEB_COMPRESSOR_LEVEL", "1")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for name in test_package_env() {
        command.env_remove(name);
    }
    let out = within(BUILD_WAIT, "scripts/package", command.output())
        .await?
        .context("running scripts/package")?;
    ensure!(
        out.status.success(),
        "scripts/package exited with {}:\n{}",
        out.status,
        text(&out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let deb = PathBuf::from(
        stdout
            .lines()
            .last()
            .context("scripts/package printed no path")?,
    );
    ensure!(
        deb.is_file(),
        "scripts/package printed {deb:?}, which is no file"
    );
    Ok(deb)
}

/// Runs a packaging tool to its end (bounded), failing on a non-zero exit.
async fn run_tool(program: &str, args: &[&str], env: &[(&str, &str)]) -> Result<Output> {
    let mut command = Command::new(program);
    command
        .args(args)
        .envs(env.iter().copied())
        .env("LC_ALL", "C.UTF-8")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = within(Duration::from_secs(120), program, command.output())
        .await?
        .with_context(|| format!("running {program} (scripts/test installs it)"))?;
    ensure!(
        out.status.success(),
        "{program} {args:?} exited with {}:\n{}",
        out.status,
        text(&out)
    );
    Ok(out)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn package_holds_its_files_and_control_fields() -> Result<()> {
    let deb = package().await?.display().to_string();
    let field = |name: &'static str| {
        let deb = deb.clone();
        async move {
            let out = run_tool("dpkg-deb", &["--field", &deb, name], &[]).await?;
            anyhow::Ok(stdout(&out).trim().to_owned())
        }
    };
    let arch = stdout(&run_tool("dpkg", &["--print-architecture"], &[]).await?);
    // The tests package's version is the workspace's, as the package's is.
    let version = env!("CARGO_PKG_VERSION");
    ensure!(field("Package").await? == "runlock");
    ensure!(
        field("Version").await? == version,
        "not the workspace's {version}"
    );
    ensure!(field("Architecture").await? == arch.trim());
    let depends = field("Depends").await?;
    for needed in ["libc6 (>= ", "systemd | systemd-standalone-sysusers"] {
        ensure!(
            depends.contains(needed),
            "Depends {depends:?} lacks {needed:?}"
        );
    }
    ensure!(
        deb.ends_with(&format!("/runlock_{version}_{}.deb", arch.trim())),
        "{deb} is not named runlock_VERSION_ARCH.deb"
    );

    // Every file, with its mode and owner: `-rwxr-xr-x root/root 123 date ./usr/bin/runlock`.
    let listing = stdout(&run_tool("dpkg-deb", &["--contents", &deb], &[]).await?);
    let mut files = BTreeSet::new();
    for line in listing.lines().filter(|l| !l.starts_with('d')) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (mode, owner, path) = (fields[0], fields[1], fields[fields.len() - 1]);
        let path = path.trim_start_matches("./");
        ensure!(owner == "root/root", "{path} is owned by {owner}");
        let want = if path.starts_with("usr/bin/") || path.starts_with("usr/libexec/") {
            "-rwxr-xr-x"
        } else {
            "-rw-r--r--"
        };
        ensure!(mode == want, "{path} has mode {mode}, not {want}");
        files.insert(path.to_owned());
    }
    let want: BTreeSet<String> = FILES.iter().map(|f| (*f).to_owned()).collect();
    ensure!(
        files == want,
        "the package's files differ: extra {:?}, missing {:?}",
        files.difference(&want).collect::<Vec<_>>(),
        want.difference(&files).collect::<Vec<_>>()
    );

    let control = temp_dir()?;
    let control_dir = control.path().display().to_string();
    run_tool("dpkg-deb", &["--control", &deb, &control_dir], &[]).await?;
    let conffiles = std::fs::read_to_string(control.path().join("conffiles"))?;
    ensure!(
        conffiles == format!("/{CONFFILE}\n"),
        "conffiles: {conffiles:?}"
    );
    for script in ["postinst", "prerm", "postrm"] {
        let mode = std::fs::metadata(control.path().join(script))?
            .permissions()
            .mode();
        ensure!(mode & 0o777 == 0o755, "{script} has mode {mode:o}");
    }
    Ok(())
}

/// A release is built as scripts/package builds it, the agent and the shim
/// alone: the features cargo resolves for that build must not include the
/// tests' `test-support` (memory-cas://, the agent's insides), which the
/// tests' own dependency adds only when they are built with it.
#[tokio::test]
async fn a_release_build_has_no_test_support() -> Result<()> {
    let mut command = Command::new(env!("CARGO"));
    command
        .current_dir(workspace()?)
        .args(["tree", "-p", "runlock-agent", "-p", "runlock-shim"])
        .args(["-e", "features", "-i", "runlock-agent", "--prefix", "none"]);
    for name in test_package_env() {
        command.env_remove(name);
    }
    let out = within(WAIT, "cargo tree", command.output()).await??;
    ensure!(out.status.success(), "cargo tree: {}", text(&out));
    let tree = stdout(&out);
    ensure!(
        tree.contains("runlock-agent feature \"s3\""),
        "cargo tree shows no agent features:\n{tree}"
    );
    ensure!(
        !tree.contains("test-support"),
        "a release build would carry test-support:\n{tree}"
    );
    Ok(())
}

#[tokio::test]
async fn lintian_reports_only_explained_tags() -> Result<()> {
    let deb = package().await?.display().to_string();
    // --fail-on none: the tags are judged here; a non-zero exit is lintian failing.
    let out = run_tool(
        "lintian",
        &["--display-info", "--pedantic", "--fail-on", "none", &deb],
        &[],
    )
    .await?;
    // "W: runlock: command-with-path-in-maintainer-script /usr/bin/x [postrm:13]"
    let mut unexplained = Vec::new();
    for line in stdout(&out).lines() {
        let Some((severity, rest)) = line.split_once(": runlock") else {
            continue;
        };
        let tag = rest
            .trim_start_matches(|c: char| c != ':')
            .trim_start_matches(':')
            .split_whitespace()
            .next()
            .unwrap_or_default();
        let known = ["E", "W", "I", "P", "X", "C", "O"].contains(&severity);
        if !known || !LINTIAN_ALLOWED.iter().any(|(allowed, _)| *allowed == tag) {
            unexplained.push(line.to_owned());
        }
    }
    ensure!(
        unexplained.is_empty(),
        "lintian reported tags with no reason in LINTIAN_ALLOWED:\n{}",
        unexplained.join("\n")
    );
    Ok(())
}
