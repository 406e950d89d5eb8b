//! One persistent `bash` for one prompt of a page: the runner writes it one
//! command at a time and reads what it prints, stdout and stderr as one
//! stream, up to a marker the shell prints after each command. Dropping a
//! session kills every process started in it.

use anyhow::{bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// Ends a command's output, followed by its exit status and a newline: a
/// byte (ASCII record separator) that no program under test prints.
const END: u8 = 0x1e;

/// A shell, started in a session of its own.
pub struct Session {
    child: Child,
    stdin: ChildStdin,
    output: Receiver<Vec<u8>>,
    /// What the shell printed that no command has been given yet: output
    /// after the last marker (a background job's, say).
    unread: Vec<u8>,
}

/// A command's exit status and what it printed before its marker.
pub struct Ran {
    pub status: i32,
    pub output: String,
}

impl Session {
    /// `bash --noprofile --norc` in `dir`, with exactly the variables `env`.
    pub fn start(dir: &Path, env: &[(String, String)]) -> Result<Session> {
        let (reader, writer) = std::io::pipe().context("making the output pipe")?;
        let mut command = std::process::Command::new("bash");
        command
            .args(["--noprofile", "--norc"])
            .current_dir(dir)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(writer.try_clone().context("sharing the output pipe")?)
            .stderr(writer);
        // SAFETY: setsid is async-signal-safe and touches no memory of ours.
        // A session of its own: the runs' own process groups stay in it, so
        // that dropping the session finds every process to kill.
        unsafe {
            command.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(Into::into));
        }
        let mut child = command.spawn().context("starting bash")?;
        drop(command); // closes this process's copies of the pipe's write end
        let stdin = child.stdin.take().context("bash's stdin")?;
        let (send, output) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = reader;
            let mut buffer = [0u8; 8192];
            while let Ok(n @ 1..) = reader.read(&mut buffer) {
                if send.send(buffer[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Ok(Session {
            child,
            stdin,
            output,
            unread: Vec::new(),
        })
    }

    /// Runs `text` as the shell's next command (its stdin from /dev/null, so
    /// that it cannot read the commands after it), for at most `limit`.
    pub fn run(&mut self, text: &str, limit: Duration) -> Result<Ran> {
        self.send(&format!(
            "{{ {text}\n}} </dev/null\n\
             __transcript_status=$?; printf '\\036%d\\n' \"$__transcript_status\"; \
             (exit \"$__transcript_status\")\n"
        ))?;
        let deadline = Instant::now() + limit;
        loop {
            if let Some(end) = self.unread.iter().position(|&b| b == END) {
                if let Some(newline) = self.unread[end..].iter().position(|&b| b == b'\n') {
                    let output = String::from_utf8_lossy(&self.unread[..end]).into_owned();
                    let status = String::from_utf8_lossy(&self.unread[end + 1..end + newline])
                        .parse()
                        .context("the shell's status marker")?;
                    self.unread.drain(..end + newline + 1);
                    return Ok(Ran { status, output });
                }
            }
            if !self.read_until(deadline)? {
                bail!(
                    "not finished after {limit:?}; it printed so far:\n{}",
                    String::from_utf8_lossy(&self.unread)
                );
            }
        }
    }

    /// What the shell has printed since the last marker, waiting (until
    /// `deadline`) for more while `wanted` says the text is not yet complete.
    pub fn printed_until(&mut self, deadline: Instant, wanted: impl Fn(&str) -> bool) -> String {
        loop {
            let text = String::from_utf8_lossy(&self.unread).into_owned();
            if wanted(&text) || !self.read_until(deadline).unwrap_or(false) {
                self.unread.clear();
                return text;
            }
        }
    }

    /// Puts `text` back before what is unread (output a discarded command did not print).
    pub fn unread(&mut self, text: &str) {
        self.unread.splice(0..0, text.bytes());
    }

    /// Reads one more piece of output: false if `deadline` passed first.
    fn read_until(&mut self, deadline: Instant) -> Result<bool> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.output.recv_timeout(left) {
            Ok(piece) => {
                self.unread.extend(piece);
                Ok(true)
            }
            Err(RecvTimeoutError::Timeout) => Ok(false),
            Err(RecvTimeoutError::Disconnected) => bail!("the shell exited"),
        }
    }

    fn send(&mut self, text: &str) -> Result<()> {
        self.stdin
            .write_all(text.as_bytes())
            .and_then(|()| self.stdin.flush())
            .context("writing to the shell")
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let session = self.child.id() as i32;
        // Processes may start while the first are killed: look again, a few times.
        for _ in 0..50 {
            let members = members_of(session);
            if members.is_empty() {
                break;
            }
            for pid in members {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let _ = self.child.try_wait();
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.wait();
    }
}

/// The live (not zombie) processes of session `sid`, from /proc.
fn members_of(sid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // After the command's name: state, ppid, pgrp, session.
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .map_or(vec![], |(_, after)| after.split_whitespace().collect());
            fields.first() != Some(&"Z") && fields.get(3) == Some(&sid.to_string().as_str())
        })
        .collect()
}
