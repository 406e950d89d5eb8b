//! `--wait` as runlock's neighbours take it (issue 46): plain seconds as
//! flock's `-w`, durations, and `infinity`; and, on a terminal, one line
//! that says what the run waits for and for how long, redrawn in place and
//! cleared when the wait ends; nothing of it when stderr is not a terminal.
//! Against the real agent, with a real pseudo-terminal.

use crate::support::{within, TestAgent, WAIT};
use anyhow::{ensure, Context, Result};
use nix::pty::{openpty, Winsize};
use std::io::Read;
use std::process::Stdio;
use tokio::sync::mpsc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_seconds_are_a_wait_as_flock_takes_them() -> Result<()> {
    let agent = TestAgent::start("memory://").await?;
    let (holder, _) = agent.hold("dev:seconds").await?;
    let waiter_of = &agent;
    let waiting = |wait: &'static str| async move {
        waiter_of
            .run(&["dev:seconds"], &["--wait", wait], "echo ran")?
            .finish()
            .await
    };
    for (wait, waited) in [("0.5", "500ms"), ("1", "1s"), ("700ms", "700ms")] {
        let out = waiting(wait).await?;
        out.expect_code(75)?;
        ensure!(
            out.stderr
                .contains(&format!("still held after waiting {waited}")),
            "--wait {wait}: {out:?}"
        );
    }
    for bad in ["-1", "soon", "NaN"] {
        let out = waiting(bad).await?;
        out.expect_code(64)?;
        ensure!(
            out.stdout.is_empty(),
            "--wait {bad} ran the command: {out:?}"
        );
    }
    holder.end_and_expect_success().await
}

/// A terminal's output, read on a thread of its own (a pty master blocks).
struct Terminal {
    chunks: mpsc::UnboundedReceiver<Vec<u8>>,
    seen: Vec<u8>,
}

impl Terminal {
    /// A pseudo-terminal wide enough for the whole line; its slave end, for
    /// a child's stderr.
    fn open() -> Result<(Terminal, Stdio)> {
        let size = Winsize {
            ws_row: 24,
            ws_col: 250,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = openpty(Some(&size), None).context("openpty")?;
        let (send, chunks) = mpsc::unbounded_channel();
        let mut master = std::fs::File::from(pty.master);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // EIO once every slave copy is closed: the child has exited.
            while let Ok(n @ 1..) = master.read(&mut buf) {
                if send.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        let terminal = Terminal {
            chunks,
            seen: Vec::new(),
        };
        Ok((terminal, Stdio::from(pty.slave)))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.seen).into_owned()
    }

    /// Reads until the output holds `want`.
    async fn until(&mut self, want: &str) -> Result<()> {
        let chunks = &mut self.chunks;
        let seen = &mut self.seen;
        within(WAIT, &format!("{want:?} on the terminal"), async {
            while !String::from_utf8_lossy(seen).contains(want) {
                match chunks.recv().await {
                    Some(chunk) => seen.extend(chunk),
                    None => break,
                }
            }
        })
        .await?;
        ensure!(
            self.text().contains(want),
            "no {want:?} in {:?}",
            self.text()
        );
        Ok(())
    }

    /// Reads until the child's last copy of the terminal is closed.
    async fn until_closed(&mut self) -> Result<()> {
        let chunks = &mut self.chunks;
        let seen = &mut self.seen;
        within(WAIT, "the terminal to close", async {
            while let Some(chunk) = chunks.recv().await {
                seen.extend(chunk);
            }
        })
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_on_a_terminal_shows_what_it_waits_for_and_nothing_elsewhere() -> Result<()> {
    let agent = TestAgent::start("memory://").await?;
    let (holder, ready) = agent.hold("dev:tty").await?;
    let holder_pid = holder.pid()?;

    // First the run whose stderr is a pipe, so that it has waited at least
    // as long as the one on the terminal shows.
    let piped = agent.run(&["dev:tty"], &["--wait", "infinity"], "echo piped")?;
    let (mut terminal, slave) = Terminal::open()?;
    let mut command = agent.runlock()?;
    command
        .args(["run", "--key", "dev:tty", "--wait", "30", "--"])
        .args(["sh", "-c", "echo on-terminal"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(slave)
        .kill_on_drop(true);
    let on_terminal = command.spawn().context("starting runlock")?;
    drop(command); // its copy of the slave would keep the terminal open

    let user = nix::unistd::User::from_uid(nix::unistd::getuid())?
        .map(|u| u.name)
        .context("no user name")?;
    let host = nix::unistd::gethostname()?.to_string_lossy().into_owned();
    let waits_for = format!(
        "runlock: \"dev:tty\" is held; waiting for the run of {user}@{host} (pid {holder_pid}, token {}) to release it: ",
        ready.token()
    );
    // Redrawn in place: the same line from its start again, a second on.
    terminal
        .until(&format!("\r{waits_for}2s so far, at most 30s"))
        .await?;
    terminal
        .until(&format!("\r{waits_for}3s so far, at most 30s"))
        .await?;
    ensure!(
        !terminal.text().contains('\n'),
        "the wait took more than its line: {:?}",
        terminal.text()
    );

    holder.end_and_expect_success().await?;
    let piped = piped.finish().await?;
    piped.expect_code(0)?;
    let on_terminal = within(WAIT, "runlock to exit", on_terminal.wait_with_output()).await??;
    ensure!(
        on_terminal.status.success() && on_terminal.stdout == b"on-terminal\n",
        "the run on the terminal: {on_terminal:?}"
    );
    terminal.until_closed().await?;
    // Cleared when the wait ended: the terminal is left as it was.
    let text = terminal.text();
    let last_line = text.rfind("so far").context("no line")?;
    ensure!(
        text[last_line..].ends_with("\r\x1b[K"),
        "the line was not cleared: {text:?}"
    );
    ensure!(
        !piped.stderr.contains("so far") && !piped.stderr.contains('\x1b'),
        "a wait whose stderr is a pipe drew a line: {:?}",
        piped.stderr
    );
    Ok(())
}
