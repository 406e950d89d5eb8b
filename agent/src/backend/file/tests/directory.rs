//! What the directory and its file system hold: locks that must exclude,
//! corrupt records, planted links, modes too wide, the start probe, gates
//! others lock, and a directory others can change.

use super::*;

#[test]
fn a_lock_that_lets_a_second_holder_in_is_caught() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("f");
    File::create(&path).expect("create");
    let first = File::open(&path).expect("open");
    let second = File::open(&path).expect("open");
    flock_excludes(&first, &second).expect("two opens exclude each other here");
    // A duplicate shares the open file description, so its lock is the
    // same lock: what a file system that grants every lock looks like.
    let same = first.try_clone().expect("dup");
    let err = flock_excludes(&first, &same).expect_err("caught");
    assert!(err.to_string().contains("at once"), "{err}");
    assert!(
        flock(&second, libc::LOCK_EX | libc::LOCK_NB).expect("try"),
        "left unlocked"
    );
}

#[tokio::test]
async fn a_corrupt_record_is_reported_not_overwritten() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = opened(&dir);
    std::fs::write(dir.path().join("k.lock"), b"not json").expect("write");
    let ask = spec("k", "l1", false, TTL);
    let refused = || backend.acquire(&ask);
    // Moved aside with no `k.tokens`, it would hand its tokens out again.
    let msg = corrupt_naming(refused().await, "k.lock");
    assert!(
        msg.contains("first write a number") && msg.contains("k.tokens"),
        "{msg}"
    );
    std::fs::write(dir.path().join("k.tokens"), b"2048\n").expect("write");
    let msg = corrupt_naming(refused().await, "k.lock");
    assert!(
        msg.contains("moved aside") && msg.contains("above 2048"),
        "{msg}"
    );
    assert_eq!(
        std::fs::read(dir.path().join("k.lock")).expect("read"),
        b"not json"
    );
    std::fs::rename(dir.path().join("k.lock"), dir.path().join("k.aside")).expect("aside");
    assert_eq!(backend.take("k", "l2", TTL).await.holder.token, 2049);
}

fn corrupt_naming(result: BackendResult<Grant>, name: &str) -> String {
    match result {
        Err(BackendError::Corrupt(msg)) => {
            assert!(msg.contains(name), "{msg}");
            msg
        }
        other => panic!("expected corrupt naming {name}, got {other:?}"),
    }
}

#[tokio::test]
async fn a_planted_link_is_refused_never_followed_and_other_keys_go_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let outside = tempfile::tempdir().expect("tempdir");
    let precious = outside.path().join("precious");
    let absent = outside.path().join("absent");
    std::fs::write(&precious, b"keep me").expect("write");
    let backend = opened(&dir);
    std::os::unix::fs::symlink(&precious, dir.path().join("k.lock")).expect("link");
    std::os::unix::fs::symlink(&absent, dir.path().join("d.lock")).expect("link");

    let msg = corrupt_naming(
        backend.acquire(&spec("k", "l1", false, TTL)).await,
        "k.lock",
    );
    assert!(msg.contains("symbolic link"), "{msg}");
    corrupt_naming(backend.acquire(&spec("k", "l2", true, TTL)).await, "k.lock");
    corrupt_naming(
        backend.acquire(&spec("d", "l3", false, TTL)).await,
        "d.lock",
    );
    corrupt_naming(backend.acquire(&spec("d", "l4", true, TTL)).await, "d.lock");
    assert!(matches!(
        backend.inspect(&key_k()).await,
        Err(BackendError::Corrupt(_))
    ));
    assert_eq!(std::fs::read(&precious).expect("read"), b"keep me");
    assert!(!absent.exists(), "the link's target was created");
    let other = backend
        .acquire(&spec("other", "l5", false, TTL))
        .await
        .expect("another key is unaffected");
    assert_eq!(other.holder.token, 1);
}

#[tokio::test]
async fn a_linked_gate_refuses_force_and_lets_plain_acquisitions_go_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let outside = tempfile::tempdir().expect("tempdir");
    let target = outside.path().join("gate-target");
    let backend = opened(&dir);
    std::fs::remove_file(dir.path().join(GATE_FILE)).expect("remove the gate");
    std::os::unix::fs::symlink(&target, dir.path().join(GATE_FILE)).expect("link");
    corrupt_naming(
        backend.acquire(&spec("k", "l1", true, TTL)).await,
        GATE_FILE,
    );
    backend
        .acquire(&spec("k", "l2", false, TTL))
        .await
        .expect("plain acquisitions need no gate no force can take");
    assert!(!target.exists(), "the gate's target was created");
    // An agent started on such a directory serves too.
    FileBackend::open(dir.path().into()).expect("open with a linked gate");
    assert!(!target.exists(), "the gate's target was created");
}

#[tokio::test]
async fn lock_files_are_0600_and_a_wider_one_or_a_wider_directory_is_tightened() {
    use std::os::unix::fs::PermissionsExt;
    let top = tempfile::tempdir().expect("tempdir");
    let dir = top.path().join("new").join("locks");
    let backend = FileBackend::open(dir.clone()).expect("open");
    let mode = |path: &Path| std::fs::metadata(path).expect("stat").mode() & 0o7777;
    assert_eq!(mode(&dir), DIR_MODE, "directory mode {:o}", mode(&dir));
    // An earlier layout's files: a record and a lock file its group could open.
    let (wide, wide_run) = (dir.join("wide.lock"), dir.join("wide.run"));
    for file in [&wide, &wide_run] {
        std::fs::write(file, b"").expect("write");
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    }
    backend.take("wide", "l1", TTL).await;
    assert_eq!((mode(&wide), mode(&wide_run)), (0o600, 0o600));
    backend.take("fresh", "l2", TTL).await;
    for name in ["fresh.lock", "fresh.run", ".force.lock"] {
        let fresh = mode(&dir.join(name));
        assert_eq!(fresh & !FILE_MODE, 0, "new {name} mode {fresh:o}");
    }
    // And an earlier layout's directory, closed when an agent opens it.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).expect("chmod");
    FileBackend::open(dir.clone()).expect("open again");
    assert_eq!(mode(&dir), 0o700);
}

#[test]
fn the_start_probe_leaves_no_file_and_ignores_a_lock_on_the_old_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let old = File::create(dir.path().join(".probe.run")).expect("create");
    assert!(flock(&old, libc::LOCK_EX).expect("flock"));
    FileBackend::open(dir.path().into()).expect("open beside a held .probe.run");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(".probe"))
        .collect();
    assert_eq!(left, [".probe.run"], "probe files left");
}

#[test]
fn a_gate_locked_by_a_classic_lock_names_its_process_and_an_ofd_lock_none() {
    use super::blocker::{range_blocker, Blocker};
    use super::transport::{ofd_lock, range_lock};
    let dir = tempfile::tempdir().expect("tempdir");
    opened(&dir);
    let path = dir.path().join(GATE_FILE);
    let open = || {
        File::options()
            .read(true)
            .write(true)
            .open(&path)
            .expect("open the gate")
    };
    let (holder, agent) = (open(), open());
    // A classic lock is this process's; it still conflicts with an OFD lock.
    let lock = range_lock(libc::F_WRLCK);
    // SAFETY: the descriptor is open and `lock` outlives the call.
    let done = unsafe { libc::fcntl(holder.as_raw_fd(), libc::F_SETLK, &lock) };
    assert_eq!(done, 0, "{}", std::io::Error::last_os_error());
    assert!(
        !ofd_lock(&agent, libc::F_RDLCK).expect("try"),
        "no conflict"
    );
    let who = range_blocker(&agent, libc::F_RDLCK);
    assert_eq!(who.pid, Some(std::process::id()));
    drop(holder); // closing any descriptor of the file ends a classic lock
    let other = open();
    assert!(ofd_lock(&other, libc::F_WRLCK).expect("lock"));
    assert_eq!(range_blocker(&agent, libc::F_RDLCK), Blocker::default());
}

#[test]
fn a_directory_others_can_change_is_refused_naming_it() {
    use std::os::unix::fs::PermissionsExt;
    let chmod = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod")
    };
    let top = tempfile::tempdir().expect("tempdir");
    let locks = top.path().join("locks");
    std::fs::create_dir(&locks).expect("mkdir");
    for (mode, who) in [(0o770, "group"), (0o703, "all users")] {
        chmod(&locks, mode);
        let Err(err) = FileBackend::open(locks.clone()) else {
            panic!("mode {mode:o} was accepted");
        };
        let msg = format!("{err:#}");
        assert!(msg.contains(&locks.display().to_string()), "{msg}");
        assert!(
            msg.contains(who) && msg.contains(&format!("{mode:04o}")),
            "{msg}"
        );
    }
    chmod(&locks, 0o700);
    FileBackend::open(locks.clone()).expect("a private directory");

    // A parent anyone can write, or one a link passes through, is refused too.
    let open = top.path().join("open");
    std::fs::create_dir(&open).expect("mkdir");
    chmod(&open, 0o777);
    std::fs::create_dir(open.join("locks")).expect("mkdir");
    std::os::unix::fs::symlink(&locks, open.join("link")).expect("link");
    for given in [open.join("locks"), open.join("link")] {
        let Err(err) = FileBackend::open(given.clone()) else {
            panic!("{} was accepted", given.display());
        };
        let msg = format!("{err:#}");
        assert!(
            msg.contains(&format!("{} is writable by", open.display())) && msg.contains("0777"),
            "{msg}"
        );
    }
}
