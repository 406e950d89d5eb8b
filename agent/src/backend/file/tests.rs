//! The file backend's tests, on a temporary directory.

use super::record::{next_token, TokenBlock, TOKEN_BLOCK};
use super::*;
use crate::backend::fixtures::{adopter, lease, spec, OWNER_UID};
use std::io::Write as _;
use std::path::Path;

const TTL: Duration = Duration::from_secs(30);

#[tokio::test]
async fn two_backends_on_one_directory_exclude_each_other_and_tokens_grow() {
    let dir = tempfile::tempdir().expect("tempdir");
    let one = FileBackend::open(dir.path().into()).expect("open");
    let two = FileBackend::open(dir.path().into()).expect("open");
    let first = one
        .acquire(&spec("k", "l1", false, TTL))
        .await
        .expect("free key");
    assert_eq!(first.holder.token, 1);
    match two.acquire(&spec("k", "l2", false, TTL)).await {
        Err(BackendError::Held(Some(h), _)) => assert_eq!(h.token, 1),
        other => panic!("expected held, got {other:?}"),
    }
    assert_eq!(
        two.inspect(&Key::new("k").expect("valid"))
            .await
            .expect("inspect")
            .state,
        KeyState::Held
    );
    one.release(&lease("k", "l1", 1)).await.expect("release");
    let record = two
        .inspect(&Key::new("k").expect("valid"))
        .await
        .expect("inspect");
    assert_eq!((record.state, record.token), (KeyState::Free, 1));
    let second = two
        .acquire(&spec("k", "l2", false, TTL))
        .await
        .expect("freed");
    assert_eq!(second.holder.token, 2);
}

#[tokio::test]
async fn force_takes_over_and_the_old_holder_sees_the_loss_at_renewal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let one = FileBackend::open(dir.path().into()).expect("open");
    let two = FileBackend::open(dir.path().into()).expect("open");
    one.acquire(&spec("k", "l1", false, TTL))
        .await
        .expect("free key");
    let forced = two
        .acquire(&spec("k", "l2", true, TTL))
        .await
        .expect("force");
    assert_eq!(forced.holder.token, 2);
    assert!(matches!(
        one.renew(&lease("k", "l1", 1), Duration::from_secs(1))
            .await,
        Err(BackendError::LeaseMismatch)
    ));
    two.renew(&lease("k", "l2", 2), Duration::from_secs(1))
        .await
        .expect("still ours");
    // The loser's release must not overwrite the new holder's record.
    one.release(&lease("k", "l1", 1)).await.expect("release");
    let record = one
        .inspect(&Key::new("k").expect("valid"))
        .await
        .expect("inspect");
    assert_eq!((record.state, record.token), (KeyState::Held, 2));
    two.release(&lease("k", "l2", 2)).await.expect("release");
    assert_eq!(
        one.acquire(&spec("k", "l3", false, TTL))
            .await
            .expect("free")
            .holder
            .token,
        3
    );
}

fn record_at(dir: &Path, name: &str) -> FileRecord {
    serde_json::from_slice(&std::fs::read(dir.join(name)).expect("read")).expect("a record")
}

#[tokio::test]
async fn the_run_gets_the_lock_read_only_on_an_empty_file_apart_from_the_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = FileBackend::open(dir.path().into()).expect("open");
    let grant = backend
        .acquire(&spec("k", "l1", false, TTL))
        .await
        .expect("free key");
    let lock = File::from(grant.lock.expect("a lock for the run"));
    let flags = nix::fcntl::fcntl(lock.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFL).expect("flags");
    assert_eq!(flags & libc::O_ACCMODE, libc::O_RDONLY);
    assert!(
        (&lock).write_all(b"token 0").is_err(),
        "the run could write"
    );
    let ino = |path: &Path| std::fs::metadata(path).expect("stat").ino();
    let meta = lock.metadata().expect("stat");
    assert_eq!(meta.len(), 0);
    assert_eq!(meta.ino(), ino(&dir.path().join("k.run")));
    assert_ne!(meta.ino(), ino(&dir.path().join("k.lock")));
    assert_eq!(meta.mode() & 0o7777 & !FILE_MODE, 0);
}

#[tokio::test]
async fn a_lock_the_run_holds_outlives_its_agent_and_is_adopted_by_the_next() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = Key::new("k").expect("valid");
    let old = FileBackend::open(dir.path().into()).expect("open");
    let run = old
        .acquire(&spec("k", "l1", false, TTL))
        .await
        .expect("free key")
        .lock
        .expect("a lock for the run");
    drop(old); // the agent dies; every descriptor it had is closed

    let new = FileBackend::open(dir.path().into()).expect("open");
    assert!(matches!(
        new.acquire(&spec("k", "l2", false, TTL)).await,
        Err(BackendError::Held(Some(h), _)) if h.token == 1
    ));
    assert_eq!(
        new.inspect(&key).await.expect("inspect").state,
        KeyState::Held
    );
    assert!(matches!(
        new.adopt(&lease("k", "l1", 2), &adopter("new-agent")).await,
        Err(BackendError::LeaseMismatch)
    ));
    assert!(matches!(
        new.adopt(&lease("k", "other", 1), &adopter("new-agent"))
            .await,
        Err(BackendError::LeaseMismatch)
    ));
    let adopted = new
        .adopt(&lease("k", "l1", 1), &adopter("new-agent"))
        .await
        .expect("adopt");
    assert_eq!(
        (
            adopted.grant.holder.token,
            adopted.grant.holder.agent_id.as_str()
        ),
        (1, "new-agent")
    );
    assert_eq!(adopted.ttl, TTL);
    new.renew(&lease("k", "l1", 1), TTL)
        .await
        .expect("still ours");
    // Held by the run alone: the adopting agent's copy does not lock it.
    assert!(matches!(
        new.acquire(&spec("k", "l3", false, TTL)).await,
        Err(BackendError::Held(..))
    ));

    // The run ends (its shim drops the lock), then the agent releases.
    flock(&File::from(run), libc::LOCK_UN).expect("unlock");
    new.release(&lease("k", "l1", 1)).await.expect("release");
    let record = record_at(dir.path(), "k.lock");
    assert_eq!((record.state, record.token), (KeyState::Free, 1));
    let next = new
        .acquire(&spec("k", "l4", false, TTL))
        .await
        .expect("free");
    assert_eq!(next.holder.token, 2);
}

#[tokio::test]
async fn a_lock_taken_again_after_release_is_held_and_force_takes_it_higher() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = FileBackend::open(dir.path().into()).expect("open");
    let run = backend
        .acquire(&spec("k", "l1", false, TTL))
        .await
        .expect("free");
    let run = File::from(run.lock.expect("a lock for the run"));
    flock(&run, libc::LOCK_UN).expect("the shim drops it");
    backend
        .release(&lease("k", "l1", 1))
        .await
        .expect("release");
    // A process the run left behind locks its inherited description again.
    assert!(flock(&run, libc::LOCK_EX | libc::LOCK_NB).expect("relock"));
    // Refused as held, naming the file and the process, which no record names.
    match backend.acquire(&spec("k", "l2", false, TTL)).await {
        Err(BackendError::HeldUnrecorded(why)) => {
            let pid = format!("pid {}", std::process::id());
            assert!(why.contains("k.run") && why.contains(&pid), "{why}");
        }
        other => panic!("not refused as held by a stranger: {other:?}"),
    }
    let forced = backend
        .acquire(&spec("k", "l3", true, TTL))
        .await
        .expect("force");
    assert_eq!(forced.holder.token, 2);
}

#[tokio::test]
async fn a_record_left_held_by_a_run_that_ended_alone_reads_as_free() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = Key::new("k").expect("valid");
    let old = FileBackend::open(dir.path().into()).expect("open");
    let run = old
        .acquire(&spec("k", "l1", false, TTL))
        .await
        .expect("free");
    drop((old, run)); // agent and run both gone, the record still says held
    assert_eq!(record_at(dir.path(), "k.lock").state, KeyState::Held);
    let new = FileBackend::open(dir.path().into()).expect("open");
    let record = new.inspect(&key).await.expect("inspect");
    assert_eq!(
        (record.state, record.token, record.holder),
        (KeyState::Free, 1, None)
    );
    let next = new
        .acquire(&spec("k", "l2", false, TTL))
        .await
        .expect("free");
    assert_eq!(next.holder.token, 2);
}

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

#[test]
fn tokens_come_from_durable_blocks_and_a_new_boot_starts_above_the_block() {
    let record = |token, reserved, boot: &str| FileRecord {
        key: "k".into(),
        state: KeyState::Free,
        token,
        holder: None,
        forced_from: None,
        lease_id: None,
        history: Vec::new(),
        store: TokenBlock {
            ttl_ms: None,
            reserved,
            boot_id: boot.into(),
        },
    };
    assert_eq!(next_token(None, "a"), (1, TOKEN_BLOCK, true));
    assert_eq!(
        next_token(Some(&record(1, 1024, "a")), "a"),
        (2, 1024, false)
    );
    assert_eq!(
        next_token(Some(&record(1023, 1024, "a")), "a"),
        (1024, 1024, false)
    );
    assert_eq!(
        next_token(Some(&record(1024, 1024, "a")), "a"),
        (1025, 2048, true)
    );
    // After a reboot the record may lag behind what was handed out.
    assert_eq!(
        next_token(Some(&record(3, 1024, "a")), "b"),
        (1025, 2048, true)
    );
    // A record from before blocks (no reservation) goes on from its token.
    assert_eq!(next_token(Some(&record(7, 0, "")), "b"), (8, 1031, true));
}

#[tokio::test]
async fn after_a_reboot_no_token_handed_out_before_it_comes_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let before = FileBackend::open_in_boot(dir.path().into(), "boot-1".into()).expect("open");
    let mut handed_out = Vec::new();
    for i in 0..3 {
        let id = format!("l{i}");
        let grant = before
            .acquire(&spec("k", &id, false, TTL))
            .await
            .expect("free");
        handed_out.push(grant.holder.token);
        before
            .release(&lease("k", &id, grant.holder.token))
            .await
            .expect("release");
    }
    assert_eq!(handed_out, [1, 2, 3]);
    assert_eq!(record_at(dir.path(), "k.lock").store.reserved, TOKEN_BLOCK);
    drop(before);
    // Power lost before tokens 2 and 3 reached the disk: it holds the first grant's record.
    let mut lagging = record_at(dir.path(), "k.lock");
    lagging.token = 1;
    std::fs::write(
        dir.path().join("k.lock"),
        serde_json::to_vec(&lagging).expect("json"),
    )
    .expect("write");
    let after = FileBackend::open_in_boot(dir.path().into(), "boot-2".into()).expect("open");
    let grant = after
        .acquire(&spec("k", "l9", false, TTL))
        .await
        .expect("free");
    assert_eq!(grant.holder.token, TOKEN_BLOCK + 1);
    assert_eq!(
        record_at(dir.path(), "k.lock").store.reserved,
        2 * TOKEN_BLOCK
    );
}

#[tokio::test]
async fn a_corrupt_record_is_reported_not_overwritten() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = FileBackend::open(dir.path().into()).expect("open");
    std::fs::write(dir.path().join("k.lock"), b"not json").expect("write");
    match backend.acquire(&spec("k", "l1", false, TTL)).await {
        Err(BackendError::Corrupt(msg)) => assert!(msg.contains("k.lock"), "{msg}"),
        other => panic!("expected corrupt, got {other:?}"),
    }
    assert_eq!(
        std::fs::read(dir.path().join("k.lock")).expect("read"),
        b"not json"
    );
}

fn corrupt_naming(result: Result<Grant, BackendError>, name: &str) -> String {
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
    let backend = FileBackend::open(dir.path().into()).expect("open");
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
        backend.inspect(&Key::new("k").expect("valid")).await,
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
    let backend = FileBackend::open(dir.path().into()).expect("open");
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
    backend
        .acquire(&spec("wide", "l1", false, TTL))
        .await
        .expect("free key");
    assert_eq!((mode(&wide), mode(&wide_run)), (0o600, 0o600));
    backend
        .acquire(&spec("fresh", "l2", false, TTL))
        .await
        .expect("free key");
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
    FileBackend::open(dir.path().into()).expect("open");
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

#[tokio::test]
async fn the_history_records_a_run_that_ended_with_no_agent_as_expired() {
    use runlock_protocol::EventKind;
    let dir = tempfile::tempdir().expect("tempdir");
    let key = Key::new("k").expect("valid");
    {
        // A run holds the key, and it and its agent end without a release.
        let one = FileBackend::open(dir.path().into()).expect("open");
        let grant = one
            .acquire(&spec("k", "l1", false, TTL))
            .await
            .expect("free key");
        drop(grant.lock);
    }
    let two = FileBackend::open(dir.path().into()).expect("open");
    two.acquire(&spec("k", "l2", false, TTL))
        .await
        .expect("its lock is free");
    two.end(&lease("k", "l2", 2), &Ending::Lost("gone".into()))
        .await
        .expect("freed");
    let got: Vec<_> = (two.history(&key).await.expect("history").iter())
        .map(|e| (e.kind, e.token, e.host.clone()))
        .collect();
    assert_eq!(
        got,
        [
            (EventKind::Granted, 1, "host-of-l1".to_string()),
            (EventKind::Expired, 1, "host-of-l1".to_string()),
            (EventKind::Granted, 2, "host-of-l2".to_string()),
            (EventKind::Lost, 2, "host-of-l2".to_string()),
        ]
    );
    let record = two.inspect(&key).await.expect("inspect");
    assert_eq!(record.incident.map(|e| e.kind), Some(EventKind::Lost));
}

#[tokio::test]
async fn a_record_from_an_agent_that_kept_no_history_is_read_and_taken() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = FileBackend::open(dir.path().into()).expect("open");
    let old = r#"{"key":"k","state":"free","token":5,"reserved":1028,"boot_id":"x"}"#;
    std::fs::write(
        dir.path().join(file_name(&Key::new("k").expect("valid"))),
        old,
    )
    .expect("written");
    let key = Key::new("k").expect("valid");
    assert!(backend.history(&key).await.expect("history").is_empty());
    let grant = backend
        .acquire(&spec("k", "l1", false, TTL))
        .await
        .expect("free");
    assert!(grant.holder.token > 5);
    assert_eq!(backend.history(&key).await.expect("history").len(), 1);
}

#[tokio::test]
async fn a_holder_that_lets_go_while_its_record_is_read_hands_the_lock_over_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let one = FileBackend::open(dir.path().into()).expect("open");
    let key = Key::new("k").expect("valid");
    let first = one
        .acquire(&spec("k", "l1", false, TTL))
        .await
        .expect("free key");
    let inner = &one.inner;
    let open_dir = inner.dir().expect("dir");
    let (name, lock_name) = (file_name(&key), lock_name(&key));
    let lock = inner
        .open(&open_dir, &lock_name, OFlag::O_RDONLY | OFlag::O_CREAT)
        .expect("open the lock");
    // Held: the refused lock's record names its holder.
    match inner.holder_record(&open_dir, &lock, &name).expect("read") {
        Refused::Held(Some(record)) => assert_eq!(record.token, first.holder.token),
        Refused::Held(None) => panic!("the holder's record was not read"),
        Refused::LetGo => panic!("took a lock that is held"),
    }
    // Let go between the refusal and the read (the record is free, the lock
    // too): the waiter takes the lock, where it used to wait for a held
    // record that would never come, and then say "held" by nobody.
    one.release(&lease("k", "l1", 1)).await.expect("release");
    assert!(matches!(
        inner.holder_record(&open_dir, &lock, &name).expect("read"),
        Refused::LetGo
    ));
    assert!(
        !flock(
            &first.lock.map(File::from).expect("the run's copy"),
            libc::LOCK_EX | libc::LOCK_NB
        )
        .expect("flock"),
        "the lock was not taken"
    );
}

#[tokio::test]
async fn a_lease_whose_run_ended_or_of_another_user_is_not_adopted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let old = FileBackend::open(dir.path().into()).expect("open");
    let run = old
        .acquire(&spec("k", "l1", false, TTL))
        .await
        .expect("free key")
        .lock
        .expect("a lock for the run");
    drop(old);

    let new = FileBackend::open(dir.path().into()).expect("open");
    let stranger = Adopter {
        uid: OWNER_UID + 1,
        ..adopter("new-agent")
    };
    assert!(matches!(
        new.adopt(&lease("k", "l1", 1), &stranger).await,
        Err(BackendError::LeaseMismatch)
    ));
    // The run ends while no agent runs: its record still names it.
    drop(run);
    assert_eq!(record_at(dir.path(), "k.lock").state, KeyState::Held);
    assert!(matches!(
        new.adopt(&lease("k", "l1", 1), &adopter("new-agent")).await,
        Err(BackendError::LeaseMismatch)
    ));
    // Nothing kept it: the next run takes the key at once, with a larger token.
    let next = new
        .acquire(&spec("k", "l2", false, TTL))
        .await
        .expect("free");
    assert_eq!(next.holder.token, 2);
}

/// The owner's run ends while its shim's `reattach` is on its way, and a new
/// holder takes the key's lock but has not yet written its record: the lock
/// is not the run's, so the lease is not adopted, and the new holder's
/// record is never overwritten with the old lease (its token handed out again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_by_a_new_holder_mid_acquire_is_not_taken_for_the_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let old = FileBackend::open(dir.path().into()).expect("open");
    let run = old
        .acquire(&spec("k", "l1", false, TTL))
        .await
        .expect("free key")
        .lock
        .expect("a lock for the run");
    drop(old);
    drop(run); // the run ends

    // A new holder, between taking the key's lock and writing its record,
    // as every acquisition is: inside the gate, shared.
    let open = |name: &str| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.path().join(name))
            .expect("open")
    };
    let gate = open(GATE_FILE);
    assert!(super::transport::ofd_lock(&gate, libc::F_RDLCK).expect("gate"));
    let key_lock = open("k.run");
    assert!(flock(&key_lock, libc::LOCK_EX | libc::LOCK_NB).expect("lock"));

    let new = FileBackend::open(dir.path().into()).expect("open");
    let mut adopting =
        tokio::spawn(async move { new.adopt(&lease("k", "l1", 1), &adopter("new-agent")).await });
    // Not answered while an acquisition is under way.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut adopting)
            .await
            .is_err(),
        "adopted while another holder was between its lock and its record"
    );
    // That holder gives up (or finishes): the run's lock is free, so its
    // lease is over.
    drop(key_lock);
    drop(gate);
    assert!(matches!(
        adopting.await.expect("adopt ran"),
        Err(BackendError::LeaseMismatch)
    ));
}
