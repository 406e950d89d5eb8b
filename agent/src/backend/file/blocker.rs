//! Who is in the way: what the kernel tells of a process holding a lock on
//! one of the directory's files that no record explains, for the message
//! that refuses because of it. Best effort: an OFD lock names no process,
//! and a sandboxed agent (`ProcSubset=pid`, `ProtectProc=invisible`) may see
//! neither `/proc/locks` nor another user's `/proc/PID`.

use super::transport::range_lock;
use runlock_protocol::procfs;
use std::fmt;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;

/// A lock's holder, as far as the kernel says.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Blocker {
    pub(super) pid: Option<u32>,
    pub(super) uid: Option<u32>,
    /// The pid that took the lock has exited: a process it started, which
    /// inherited the descriptor, holds it now.
    pub(super) exited: bool,
}

impl Blocker {
    fn of_pid(pid: u32) -> Blocker {
        Blocker {
            pid: Some(pid),
            uid: procfs::real_uid(pid),
            exited: !process_lives(pid),
        }
    }
}

/// Whether a process `pid` exists (one the agent may not signal does).
pub(super) fn process_lives(pid: u32) -> bool {
    let sent =
        i32::try_from(pid).map(|p| nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None));
    !matches!(sent, Ok(Err(nix::errno::Errno::ESRCH)))
}

impl fmt::Display for Blocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.pid, self.uid) {
            (Some(pid), _) if self.exited => write!(
                f,
                "taken by pid {pid}, which has exited: a process it started holds it"
            ),
            (None, _) if self.exited => {
                f.write_str("taken by a process that has exited: a process it started holds it")
            }
            (Some(pid), Some(uid)) => {
                write!(f, "pid {pid}, {}", super::settings::user_name(uid))
            }
            (Some(pid), None) => write!(f, "pid {pid}"),
            (None, _) => f.write_str("a process the kernel does not name to runlockd"),
        }
    }
}

/// The holder of an `fcntl` lock on `file` that conflicts with one of
/// `kind`: a classic POSIX lock names its process, an OFD lock does not.
pub(super) fn range_blocker(file: &File, kind: libc::c_int) -> Blocker {
    let mut lock = range_lock(kind);
    // SAFETY: the descriptor is open for the call and `lock` outlives it.
    let asked = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut lock) };
    match (asked, lock.l_type as libc::c_int, lock.l_pid) {
        (0, libc::F_UNLCK, _) => Blocker::default(),
        (0, _, pid) if pid > 0 => Blocker::of_pid(pid as u32),
        _ => Blocker::default(),
    }
}

/// A file as `/proc/locks` names it: `MAJ:MIN:INODE`.
fn locks_name(dev: u64, ino: u64) -> String {
    format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev))
}

/// Whether any process holds a lock on the file `dev`, `ino` (whose name
/// may be gone), as `/proc/locks` lists it; `None` where the agent cannot
/// read it. Read a few times before it is believed free: one read can skip
/// a line (see [`flock_blocker`]).
pub(super) fn inode_locked(dev: u64, ino: u64) -> Option<bool> {
    let device = locks_name(dev, ino);
    let mut read = false;
    for _ in 0..3 {
        let Ok(table) = std::fs::read_to_string("/proc/locks") else {
            continue;
        };
        read = true;
        if holder_in(&table, &device).is_some() {
            return Some(true);
        }
    }
    read.then_some(false)
}

/// The holder of a lock on `file` as `/proc/locks` lists it: the process
/// that took a `flock` (or classic POSIX) lock; an OFD lock shows -1.
pub(super) fn flock_blocker(file: &File) -> Blocker {
    let Ok(meta) = file.metadata() else {
        return Blocker::default();
    };
    let device = locks_name(meta.dev(), meta.ino());
    // The kernel hands the table out a page at a time, and a lock taken or
    // dropped meanwhile shifts the rest: on a busy host one read can skip
    // the very line asked for. A few reads find it.
    let holder = (0..3).find_map(|_| {
        let table = std::fs::read_to_string("/proc/locks").ok()?;
        holder_in(&table, &device)
    });
    match holder {
        // The kernel shows 0 once the process that took the lock is gone.
        Some(0) => Blocker {
            exited: true,
            ..Blocker::default()
        },
        Some(pid) => Blocker::of_pid(pid),
        None => Blocker::default(),
    }
}

/// The pid holding (not waiting for) a lock on `device` (`MAJ:MIN:INODE`)
/// in a `/proc/locks` table (0: the process that took it has exited).
fn holder_in(table: &str, device: &str) -> Option<u32> {
    table
        .lines()
        .filter(|line| !line.contains("->"))
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // "1: FLOCK  ADVISORY  WRITE 2148 fd:01:1049390 0 EOF"
            (fields.get(5) == Some(&device))
                .then(|| fields.get(4)?.parse::<u32>().ok())
                .flatten()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_is_read_from_proc_locks_and_waiters_are_skipped() {
        let table = "1: FLOCK  ADVISORY  WRITE 2148 fd:01:1049390 0 EOF\n\
                     1: -> FLOCK  ADVISORY  WRITE 77 00:2f:12 0 EOF\n\
                     2: OFDLCK ADVISORY  READ  -1 00:2f:13 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 4242 00:2f:12 0 EOF\n";
        assert_eq!(holder_in(table, "00:2f:12"), Some(4242));
        assert_eq!(holder_in(table, "fd:01:1049390"), Some(2148));
        assert_eq!(
            holder_in(table, "00:2f:13"),
            None,
            "an OFD lock names no pid"
        );
        assert_eq!(holder_in(table, "00:2f:99"), None);
        let gone = "1: FLOCK  ADVISORY  WRITE 0 00:2f:12 0 EOF\n";
        assert_eq!(holder_in(gone, "00:2f:12"), Some(0));
    }

    #[test]
    fn a_flock_held_here_is_named_with_this_process() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let file = File::create(&path).expect("create");
        assert!(super::super::transport::flock(&file, libc::LOCK_EX).expect("flock"));
        let other = File::open(&path).expect("open");
        let who = flock_blocker(&other);
        assert_eq!(who.pid, Some(std::process::id()));
        assert!(who
            .to_string()
            .starts_with(&format!("pid {}", std::process::id())));
    }

    #[test]
    fn a_lock_whose_taker_exited_is_said_to_be_held_by_a_process_it_started() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        File::create(&path).expect("create");
        // flock(1) locks the shell's descriptor and exits; the background
        // sleep inherited it and holds the lock on.
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg("exec 9<\"$0\"; flock -n 9 || exit 3; sleep 30 >/dev/null 2>&1 & echo $!")
            .arg(&path)
            .stdout(std::process::Stdio::piped())
            .output()
            .expect("sh");
        assert!(out.status.success(), "{out:?}");
        let sleeper: i32 = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("pid");
        let who = flock_blocker(&File::open(&path).expect("open"));
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(sleeper),
            nix::sys::signal::Signal::SIGKILL,
        );
        assert!(who.exited, "{who:?}");
        assert!(who.to_string().contains("has exited"), "{who}");
    }
}
