//! The file backend's tests, on a temporary directory.
//! Taking, forcing, adopting and handing over locks are here; tokens and
//! what the directory holds (links, modes, corrupt records, others' locks)
//! have files of their own.

mod directory;
mod faults;
mod tokens;

use super::*;
use crate::backend::fixtures::{adopter, history_lines, lease, spec, Take, OWNER_UID};
use std::io::Write as _;
use std::path::Path;

const TTL: Duration = Duration::from_secs(30);

#[tokio::test]
async fn two_backends_on_one_directory_exclude_each_other_and_tokens_grow() {
    let dir = tempfile::tempdir().expect("tempdir");
    let one = opened(&dir);
    let two = opened(&dir);
    let first = one.take("k", "l1", TTL).await;
    assert_eq!(first.holder.token, 1);
    match two.acquire(&spec("k", "l2", false, TTL)).await {
        Err(BackendError::Held(Some(h), _)) => assert_eq!(h.token, 1),
        other => panic!("expected held, got {other:?}"),
    }
    assert_eq!(
        two.inspect(&key_k()).await.expect("inspect").state,
        KeyState::Held
    );
    one.release(&lease("k", "l1", 1)).await.expect("release");
    let record = two.inspect(&key_k()).await.expect("inspect");
    free_at_1_then_taken_at_2((record.state, record.token), &two, "l2").await;
}

#[tokio::test]
async fn force_takes_over_and_the_old_holder_sees_the_loss_at_renewal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let one = opened(&dir);
    let two = opened(&dir);
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
    let record = one.inspect(&key_k()).await.expect("inspect");
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

/// An agent's backend on the lock directory `dir`.
fn opened(dir: &tempfile::TempDir) -> FileBackend {
    FileBackend::open(dir.path().into()).expect("open")
}

/// The key most tests hold.
fn key_k() -> Key {
    Key::new("k").expect("valid")
}

/// After the first lease of "k" ended: its record (state and token) says
/// free at token 1, and the next lease, `lease` through `backend`, takes
/// token 2.
async fn free_at_1_then_taken_at_2(record: (KeyState, u64), backend: &FileBackend, lease: &str) {
    assert_eq!(record, (KeyState::Free, 1));
    assert_eq!(backend.take("k", lease, TTL).await.holder.token, 2);
}

/// A run's lock on "k" (lease l1, token 1) in `dir`, whose agent is gone:
/// dropped, every descriptor it had closed.
async fn run_left_by_its_agent(dir: &tempfile::TempDir) -> std::os::fd::OwnedFd {
    let agent = opened(dir);
    let grant = agent.take("k", "l1", TTL).await;
    grant.lock.expect("a lock for the run")
}

/// Waits (5 s at most) until nothing holds the run lock of "k" in `dir`,
/// once its descriptors here are dropped. They are not always the last: a
/// child that another test of this process forks meanwhile holds a copy of
/// each until its exec closes them (O_CLOEXEC), and with it the lock.
fn until_run_lock_is_free(dir: &Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let lock = std::fs::File::open(dir.join("k.run")).expect("open k.run");
    while !flock(&lock, libc::LOCK_EX | libc::LOCK_NB).expect("flock") {
        assert!(
            std::time::Instant::now() < deadline,
            "k's run lock is still held 5 s after its last descriptor here was dropped"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    flock(&lock, libc::LOCK_UN).expect("unlock");
}

fn record_at(dir: &Path, name: &str) -> FileRecord {
    serde_json::from_slice(&std::fs::read(dir.join(name)).expect("read")).expect("a record")
}

#[tokio::test]
async fn the_run_gets_the_lock_read_only_on_an_empty_file_apart_from_the_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = opened(&dir);
    let grant = backend.take("k", "l1", TTL).await;
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
    let key = key_k();
    let run = run_left_by_its_agent(&dir).await;

    let new = opened(&dir);
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
    free_at_1_then_taken_at_2((record.state, record.token), &new, "l4").await;
}

#[tokio::test]
async fn a_lock_taken_again_after_release_is_held_and_force_takes_it_higher() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = opened(&dir);
    let run = backend.take("k", "l1", TTL).await;
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
    let key = key_k();
    let old = opened(&dir);
    let run = old.take("k", "l1", TTL).await;
    drop((old, run)); // agent and run both gone, the record still says held
    until_run_lock_is_free(dir.path());
    assert_eq!(record_at(dir.path(), "k.lock").state, KeyState::Held);
    let new = opened(&dir);
    let record = new.inspect(&key).await.expect("inspect");
    assert_eq!(record.holder, None);
    free_at_1_then_taken_at_2((record.state, record.token), &new, "l2").await;
}

#[tokio::test]
async fn the_history_records_a_run_that_ended_with_no_agent_as_expired() {
    use runlock_protocol::EventKind;
    let dir = tempfile::tempdir().expect("tempdir");
    let key = key_k();
    {
        // A run holds the key, and it and its agent end without a release.
        let one = opened(&dir);
        let grant = one.take("k", "l1", TTL).await;
        drop(grant.lock);
    }
    until_run_lock_is_free(dir.path());
    let two = opened(&dir);
    two.acquire(&spec("k", "l2", false, TTL))
        .await
        .expect("its lock is free");
    two.end(&lease("k", "l2", 2), &Ending::Lost("gone".into()))
        .await
        .expect("freed");
    assert_eq!(
        history_lines(&two, "k").await,
        [
            "Granted 1 host-of-l1",
            "Expired 1 host-of-l1",
            "Granted 2 host-of-l2",
            "Lost 2 host-of-l2",
        ]
    );
    let record = two.inspect(&key).await.expect("inspect");
    assert_eq!(record.incident.map(|e| e.kind), Some(EventKind::Lost));
}

#[tokio::test]
async fn a_record_from_an_agent_that_kept_no_history_is_read_and_taken() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = opened(&dir);
    let old = r#"{"key":"k","state":"free","token":5,"reserved":1028,"boot_id":"x"}"#;
    std::fs::write(dir.path().join(file_name(&key_k())), old).expect("written");
    let key = key_k();
    assert!(backend.history(&key).await.expect("history").is_empty());
    let grant = backend.take("k", "l1", TTL).await;
    assert!(grant.holder.token > 5);
    assert_eq!(backend.history(&key).await.expect("history").len(), 1);
}

#[tokio::test]
async fn a_holder_that_lets_go_while_its_record_is_read_hands_the_lock_over_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let one = opened(&dir);
    let key = key_k();
    let first = one.take("k", "l1", TTL).await;
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
    let run = run_left_by_its_agent(&dir).await;

    let new = opened(&dir);
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
    until_run_lock_is_free(dir.path());
    assert_eq!(record_at(dir.path(), "k.lock").state, KeyState::Held);
    assert!(matches!(
        new.adopt(&lease("k", "l1", 1), &adopter("new-agent")).await,
        Err(BackendError::LeaseMismatch)
    ));
    // Nothing kept it: the next run takes the key at once, with a larger token.
    let next = new.take("k", "l2", TTL).await;
    assert_eq!(next.holder.token, 2);
}

/// The owner's run ends while its shim's `reattach` is on its way, and a new
/// holder takes the key's lock but has not yet written its record: the lock
/// is not the run's, so the lease is not adopted, and the new holder's
/// record is never overwritten with the old lease (its token handed out again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_by_a_new_holder_mid_acquire_is_not_taken_for_the_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = run_left_by_its_agent(&dir).await;
    drop(run); // the run ends
    until_run_lock_is_free(dir.path());

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

    let new = opened(&dir);
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
