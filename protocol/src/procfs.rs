//! What `/proc` says of a process, which both ends of a run read: the agent
//! to find an attached run's members and a lock's holder, the shim to know
//! that the last process of its command's group has exited. Linux only, as
//! runlock is.

/// `/proc/PID/stat`'s fields that say where a process is and whether it has
/// exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Zombie or dead: exited, whether or not reaped. A zombie is still in
    /// its group for `killpg`, but holds no lock or file any more.
    pub exited: bool,
    /// The process group.
    pub pgrp: u32,
    /// The session.
    pub session: u32,
    /// Since boot, in clock ticks: with the pid, names one process for good.
    pub start: u64,
}

impl Stat {
    /// The process `pid`'s, if it exists and can be read.
    pub fn read(pid: u32) -> Option<Stat> {
        Stat::parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
    }

    /// A `stat` file's text.
    pub fn parse(stat: &str) -> Option<Stat> {
        // The fields after the command name, which is in parentheses and may
        // itself hold spaces and parentheses: from field 3 (state) on.
        let (_, rest) = stat.rsplit_once(')')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3).copied();
        Some(Stat {
            exited: matches!(field(3)?, "Z" | "X" | "x"),
            pgrp: field(5)?.parse().ok()?,
            session: field(6)?.parse().ok()?,
            start: field(22)?.parse().ok()?,
        })
    }
}

/// The real uid of `pid` (the one kill(2) checks), from `/proc/PID/status`.
pub fn real_uid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The pids of the processes there are now.
pub fn pids() -> impl Iterator<Item = u32> {
    let entries = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    entries.filter_map(|e| e.file_name().to_str()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_name_with_spaces_and_parentheses_is_skipped() {
        let mut text = String::from("4242 (a ) b (c) S 1 4000 4100");
        for field in 7..=21 {
            text.push_str(&format!(" {field}"));
        }
        text.push_str(" 987654 0 0");
        let stat = Stat::parse(&text).expect("parsed");
        assert_eq!(
            stat,
            Stat {
                exited: false,
                pgrp: 4000,
                session: 4100,
                start: 987654
            }
        );
        let zombie = text.replacen(") S ", ") Z ", 1);
        assert!(Stat::parse(&zombie).expect("parsed").exited);
        assert_eq!(Stat::parse("4242 (truncated) S 1"), None);
    }

    #[test]
    fn this_process_is_listed_alive_with_its_own_uid() {
        let me = std::process::id();
        assert!(pids().any(|pid| pid == me));
        let stat = Stat::read(me).expect("readable");
        assert!(!stat.exited);
        // SAFETY: neither call takes an argument or touches memory.
        let (pgrp, uid) = unsafe { (libc::getpgrp(), libc::getuid()) };
        assert_eq!(i64::from(stat.pgrp), i64::from(pgrp));
        assert_eq!(real_uid(me), Some(uid));
    }
}
