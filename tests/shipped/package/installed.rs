//! The package installed into a scratch root (`dpkg --root`): the user,
//! directories and socket enablement it makes, its units, man pages,
//! completions and binaries, and upgrade, remove and purge.

use super::{package, run_tool, stdout, workspace, CONFFILE, FILES, SOCKET_ENABLED};
use crate::shipped::systemd::{expect_verified, text, tool, verify};
use crate::support::agent::temp_dir;
use crate::support::run::Run;
use crate::support::{within, AgentOptions, TestAgent, WAIT};
use anyhow::{bail, ensure, Context, Result};
use runlock_shim::exit::EXIT_HELD;
use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;
use tokio::process::Command;

/// A scratch root with an empty dpkg database.
struct ScratchRoot {
    dir: tempfile::TempDir,
}

impl ScratchRoot {
    fn new() -> Result<ScratchRoot> {
        let dir = temp_dir()?;
        let admin = dir.path().join("var/lib/dpkg");
        std::fs::create_dir_all(admin.join("info"))?;
        std::fs::create_dir_all(admin.join("updates"))?;
        std::fs::write(admin.join("status"), "")?;
        Ok(ScratchRoot { dir })
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.dir.path().join(relative)
    }

    /// `dpkg --root` with the maintainer scripts run outside a chroot (there
    /// is no shell inside), where they act on DPKG_ROOT. The dependencies are
    /// the host's, not the scratch root's.
    async fn dpkg(&self, args: &[&str]) -> Result<Output> {
        let root = format!("--root={}", self.dir.path().display());
        let mut all = vec![
            root.as_str(),
            "--force-script-chrootless",
            "--force-depends",
        ];
        all.extend_from_slice(args);
        run_tool("dpkg", &all, &[]).await
    }

    fn read(&self, relative: &str) -> Result<String> {
        std::fs::read_to_string(self.path(relative))
            .with_context(|| format!("reading {relative} in the scratch root"))
    }

    /// Every path under `relative` whose name contains `part`.
    fn find(&self, relative: &str, part: &str) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let mut dirs = vec![self.path(relative)];
        while let Some(dir) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if entry.file_name().to_string_lossy().contains(part) {
                    found.push(path.clone());
                }
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(path);
                }
            }
        }
        found
    }
}

/// The uid and gid of `name` in a passwd-format file.
fn ids_of(passwd: &str, name: &str) -> Option<(u32, u32)> {
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.first() == Some(&name) && fields.len() > 3)
            .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
            .flatten()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_package_verifies_renders_completes_and_locks() -> Result<()> {
    let deb = package().await?.display().to_string();
    let root = ScratchRoot::new()?;
    root.dpkg(&["--install", &deb]).await?;

    // postinst: the user and group from sysusers, the directories from
    // tmpfiles, and the socket enabled as deb-systemd-helper does it.
    let (uid, gid) =
        ids_of(&root.read("etc/passwd")?, "runlock").context("postinst made no user runlock")?;
    ensure!(
        root.read("etc/group")?
            .lines()
            .any(|l| l.starts_with("runlock:")),
        "postinst made no group runlock"
    );
    for (dir, mode) in [("var/lib/runlock", 0o700), ("run/runlock", 0o750)] {
        let meta = std::fs::metadata(root.path(dir))
            .with_context(|| format!("{dir} in the scratch root"))?;
        ensure!(
            (meta.uid(), meta.gid(), meta.mode() & 0o7777) == (uid, gid, mode),
            "{dir} is {}:{} {:o}",
            meta.uid(),
            meta.gid(),
            meta.mode() & 0o7777
        );
    }
    let enabled =
        std::fs::read_link(root.path(SOCKET_ENABLED)).context("the socket is not enabled")?;
    ensure!(enabled == Path::new("/usr/lib/systemd/system/runlockd.socket"));
    ensure!(
        root.read(CONFFILE)?
            == std::fs::read_to_string(workspace()?.join("systemd/runlockd.toml"))?,
        "the conffile is not systemd/runlockd.toml"
    );

    // The installed units, verified as installed except that ExecStart names
    // the installed binary by its scratch path (verify looks for it on this host).
    let installed_runlockd = root.path("usr/bin/runlockd");
    let installed_runlock = root.path("usr/bin/runlock");
    let units = temp_dir()?;
    let service = root.read("usr/lib/systemd/system/runlockd.service")?;
    let exec = "\nExecStart=/usr/bin/runlockd\n";
    ensure!(
        service.contains(exec),
        "the installed service does not run {exec:?}"
    );
    let service_path = units.path().join("runlockd.service");
    let socket_path = units.path().join("runlockd.socket");
    std::fs::write(
        &service_path,
        service.replace(
            exec,
            &format!("\nExecStart={}\n", installed_runlockd.display()),
        ),
    )?;
    std::fs::copy(
        root.path("usr/lib/systemd/system/runlockd.socket"),
        &socket_path,
    )?;
    let out = verify(&service_path, &socket_path).await?;
    expect_verified(&out, "the installed units")?;

    // Every man page renders without a warning and names its command.
    let pages = root.find("usr/share/man", ".gz");
    let shipped = FILES
        .iter()
        .filter(|f| f.starts_with("usr/share/man/"))
        .count();
    ensure!(
        pages.len() == shipped,
        "{} man pages installed, {shipped} in the package: {pages:?}",
        pages.len()
    );
    for page in &pages {
        let page = page.display().to_string();
        let out = run_tool("man", &["--warnings", "-l", &page], &[("MANWIDTH", "80")]).await?;
        let rendered = stdout(&out);
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(stderr.trim().is_empty(), "man -l {page} warned:\n{stderr}");
        ensure!(
            rendered.contains("NAME") && rendered.contains("runlock"),
            "man -l {page} rendered:\n{rendered}"
        );
    }
    let config_page = stdout(
        &run_tool(
            "man",
            &[
                "-l",
                &root
                    .path("usr/share/man/man5/runlockd.toml.5.gz")
                    .display()
                    .to_string(),
            ],
            &[("MANWIDTH", "200")],
        )
        .await?,
    );
    for setting in [
        "backend",
        "on_unavailable",
        "[limits]",
        "connections_per_user",
        "[etcd]",
        "ca_file",
    ] {
        ensure!(
            config_page.contains(setting),
            "runlockd.toml(5) lacks {setting}"
        );
    }

    // Each binary names itself as installed, not after its crate.
    for (binary, name) in [
        (&installed_runlock, "runlock"),
        (&installed_runlockd, "runlockd"),
    ] {
        let printed = stdout(&run_tool(&binary.display().to_string(), &["--version"], &[]).await?);
        let expected = format!("{name} {}", env!("CARGO_PKG_VERSION"));
        ensure!(
            printed.trim() == expected,
            "{name} --version printed {printed:?}, not {expected:?}"
        );
    }

    // `runlock ui` hands over to the page's program where the package put it:
    // only runlock-ui refuses a listen address that is not loopback.
    let ui = within(
        WAIT,
        "runlock ui",
        Command::new(&installed_runlock)
            .args([
                "--socket",
                "/nonexistent.sock",
                "ui",
                "--listen",
                "0.0.0.0:0",
            ])
            .kill_on_drop(true)
            .output(),
    )
    .await??;
    ensure!(
        ui.status.code() == Some(64)
            && String::from_utf8_lossy(&ui.stderr).contains("only on a loopback address"),
        "the installed runlock ui: {}",
        text(&ui)
    );

    // The pages describe the installed binaries: every flag their --help names.
    for (page, binary, args) in [
        ("man1/runlock.1.gz", &installed_runlock, &["--help"][..]),
        (
            "man1/runlock-run.1.gz",
            &installed_runlock,
            &["run", "--help"][..],
        ),
        ("man8/runlockd.8.gz", &installed_runlockd, &["--help"][..]),
    ] {
        let page_path = root
            .path(&format!("usr/share/man/{page}"))
            .display()
            .to_string();
        let rendered = stdout(&run_tool("man", &["-l", &page_path], &[("MANWIDTH", "200")]).await?);
        let help = stdout(&run_tool(&binary.display().to_string(), args, &[]).await?);
        let flags: BTreeSet<&str> = help
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .filter(|word| word.starts_with("--") && word.len() > 2)
            .collect();
        ensure!(flags.len() > 2, "{args:?} --help names no flags: {help}");
        for flag in flags {
            ensure!(
                rendered.contains(flag),
                "{page} lacks {flag}, which --help names"
            );
        }
    }

    check_completions(&root).await?;

    // The installed binaries together: a run holds its key through the
    // installed agent, a second run of it is refused, and the key is free after.
    let locks = temp_dir()?;
    let mut options = AgentOptions::new(format!("file://{}", locks.path().display()));
    options.program = Some(installed_runlockd.clone());
    let agent = TestAgent::start_with(options).await?;
    let shim = |args: &[&str]| {
        let mut command = Command::new(&installed_runlock);
        command
            .arg("--socket")
            .arg(agent.socket())
            .args(args)
            .env_remove("RUNLOCK_SOCKET")
            .kill_on_drop(true);
        command
    };
    let script = format!(
        "{runlock} --socket {socket} run --key pkg -- true; echo second=$?; \
         {runlock} --socket {socket} inspect pkg",
        runlock = installed_runlock.display(),
        socket = agent.socket().display()
    );
    let run = shim(&["run", "--key", "pkg", "--", "sh", "-c", &script]);
    let finished = Run::spawn(run)?.finish().await?;
    finished.expect_code(0)?;
    ensure!(
        finished.stdout.contains(&format!("second={EXIT_HELD}")),
        "a second run of the held key was not refused: {}",
        finished.stdout
    );
    ensure!(
        finished
            .stdout
            .lines()
            .any(|line| line.starts_with("state:") && line.ends_with("held")),
        "inspect during the run: {}",
        finished.stdout
    );
    let after = within(
        WAIT,
        "runlock inspect",
        shim(&["inspect", "pkg", "--json"]).output(),
    )
    .await??;
    let record: serde_json::Value = serde_json::from_slice(&after.stdout)
        .with_context(|| format!("inspect --json printed {}", text(&after)))?;
    ensure!(record["state"] == "free", "after the run: {record}");
    Ok(())
}

/// Each shell parses the installed completions; bash and fish complete a subcommand.
async fn check_completions(root: &ScratchRoot) -> Result<()> {
    for name in ["runlock", "runlockd"] {
        let bash = root.path(&format!("usr/share/bash-completion/completions/{name}"));
        let zsh = root.path(&format!("usr/share/zsh/vendor-completions/_{name}"));
        let fish = root.path(&format!("usr/share/fish/vendor_completions.d/{name}.fish"));
        run_tool("bash", &["-n", &bash.display().to_string()], &[]).await?;
        run_tool("zsh", &["-n", &zsh.display().to_string()], &[]).await?;
        run_tool("fish", &["--no-execute", &fish.display().to_string()], &[]).await?;
    }
    let bash = root.path("usr/share/bash-completion/completions/runlock");
    let script = format!(
        "source {}; COMP_WORDS=(runlock ins); COMP_CWORD=1; COMP_LINE='runlock ins'; \
         COMP_POINT=${{#COMP_LINE}}; _runlock runlock ins runlock; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        bash.display()
    );
    let out = run_tool("bash", &["-c", &script], &[]).await?;
    ensure!(
        stdout(&out).trim() == "inspect",
        "bash completed `runlock ins` as {:?}",
        stdout(&out)
    );
    let fish = root.path("usr/share/fish/vendor_completions.d/runlock.fish");
    let script = format!(
        "source {}; complete --do-complete 'runlock run --on-lost '",
        fish.display()
    );
    let out = run_tool("fish", &["--no-config", "-c", &script], &[]).await?;
    let out_text = stdout(&out);
    let choices: BTreeSet<&str> = out_text
        .lines()
        .filter_map(|l| l.split('\t').next())
        .map(str::trim)
        .collect();
    ensure!(
        choices == BTreeSet::from(["ignore", "kill", "term"]),
        "fish completed `runlock run --on-lost` as {out_text:?}"
    );
    Ok(())
}

#[tokio::test]
async fn upgrade_remove_and_purge_keep_what_the_operator_wrote() -> Result<()> {
    let deb = package().await?.display().to_string();
    let root = ScratchRoot::new()?;
    root.dpkg(&["--install", &deb]).await?;
    let edited = format!("{}\n# the operator's\nttl = \"1m\"\n", root.read(CONFFILE)?);
    std::fs::write(root.path(CONFFILE), &edited)?;
    std::fs::write(root.path("etc/runlock/notes"), "the operator's\n")?;
    std::fs::write(root.path("var/lib/runlock/kept"), "lock state\n")?;
    // An earlier version's lock directory, open to the socket's group.
    std::fs::set_permissions(
        root.path("var/lib/runlock"),
        std::fs::Permissions::from_mode(0o750),
    )?;
    // The operator turns socket activation off; an upgrade must not turn it back on.
    let root_arg = format!("--root={}", root.path("").display());
    let out = tool("systemctl", &[&root_arg, "disable", "runlockd.socket"]).await?;
    ensure!(out.status.success(), "systemctl disable: {}", text(&out));
    ensure!(
        !root.path(SOCKET_ENABLED).exists(),
        "systemctl disable left the socket enabled"
    );

    // The same version again runs postinst as an upgrade does (configure OLD).
    root.dpkg(&["--install", &deb]).await?;
    ensure!(
        root.read(CONFFILE)? == edited,
        "the upgrade replaced the edited conffile"
    );
    ensure!(
        !root.path(SOCKET_ENABLED).exists(),
        "the upgrade enabled the socket the operator disabled"
    );
    let mode = std::fs::metadata(root.path("var/lib/runlock"))?.mode() & 0o7777;
    ensure!(
        mode == 0o700,
        "the upgrade left the lock directory {mode:o}"
    );

    root.dpkg(&["--remove", "runlock"]).await?;
    ensure!(
        !root.path("usr/bin/runlockd").exists(),
        "remove left the binary"
    );
    ensure!(
        root.read(CONFFILE)? == edited,
        "remove touched the conffile"
    );
    ensure!(
        root.path("var/lib/runlock/kept").exists(),
        "remove took the lock directory"
    );

    root.dpkg(&["--purge", "runlock"]).await?;
    ensure!(!root.path(CONFFILE).exists(), "purge left the conffile");
    ensure!(
        root.read("etc/runlock/notes")? == "the operator's\n",
        "purge took the operator's own file"
    );
    ensure!(
        root.path("var/lib/runlock/kept").exists(),
        "purge took the lock directory"
    );
    let left: Vec<PathBuf> = [
        root.find("etc/systemd", "runlockd"),
        root.find("var/lib/systemd", "runlockd"),
    ]
    .concat();
    ensure!(
        left.is_empty(),
        "purge left the socket's enablement state: {left:?}"
    );
    if ids_of(&root.read("etc/passwd")?, "runlock").is_none() {
        bail!("purge removed the user runlock, whose files may remain");
    }
    Ok(())
}
