//! The directory under faults: a disk that fills up, a lock file a cleanup
//! job removes, a record an operator moves aside.

use super::*;
use crate::backend::file::record::TOKEN_BLOCK;
use std::process::Command;

/// A tmpfs of its own, so that it can be filled: mounted on a new
/// directory (the tests run as root, as in CI) and unmounted when dropped.
struct SmallDisk {
    mount: tempfile::TempDir,
}

impl SmallDisk {
    fn mounted() -> SmallDisk {
        let mount = tempfile::tempdir().expect("tempdir");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=256k,mode=0700", "runlock-test"])
            .arg(mount.path())
            .status()
            .expect("mount(8)");
        assert!(status.success(), "mounting a tmpfs (the tests run as root)");
        SmallDisk { mount }
    }

    /// The lock directory, on this disk.
    fn locks(&self) -> PathBuf {
        self.mount.path().join("locks")
    }

    /// Takes every free block with a file beside the lock directory.
    fn fill(&self) -> PathBuf {
        let path = self.mount.path().join("filler");
        let mut filler = File::create(&path).expect("filler");
        let block = [0u8; 4096];
        loop {
            match filler.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling the disk: {e}"),
            }
        }
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.mount.path()).status();
    }
}

/// A record write that meets a full disk leaves the record whole, and once
/// space returns the key goes on above every token it handed out.
#[tokio::test]
async fn a_full_disk_leaves_the_record_whole_and_the_key_goes_on_once_space_returns() {
    let disk = SmallDisk::mounted();
    let backend = FileBackend::open(disk.locks()).expect("open");
    let first = backend.take("k", "l0", TTL).await;
    backend
        .release(&lease("k", "l0", first.holder.token))
        .await
        .expect("release");
    let filler = disk.fill();
    // Each grant and release adds to the record's history, so one of these
    // writes needs a block the disk no longer has (a write in place then
    // leaves the record cut).
    let mut handed_out = first.holder.token;
    let mut refused = None;
    for i in 1..40 {
        let id = format!("l{i}");
        match backend.acquire(&spec("k", &id, false, TTL)).await {
            Ok(grant) => {
                handed_out = handed_out.max(grant.holder.token);
                let _ = backend.release(&lease("k", &id, grant.holder.token)).await;
            }
            Err(err) => refused = Some(err),
        }
        let record = std::fs::read(disk.locks().join("k.lock")).expect("read");
        let record: FileRecord = serde_json::from_slice(&record)
            .unwrap_or_else(|e| panic!("the record was left cut ({e}) after lease {id}"));
        assert!(record.token <= handed_out && record.token >= first.holder.token);
    }
    match refused {
        Some(BackendError::Unavailable(why)) => {
            assert!(why.contains("k.lock") && why.contains("space"), "{why}")
        }
        other => panic!("no write met the full disk: {other:?}"),
    }
    std::fs::remove_file(filler).expect("space returns");
    let next = backend.take("k", "after", TTL).await;
    assert!(
        next.holder.token > handed_out,
        "{} <= {handed_out}",
        next.holder.token
    );
}

/// A record removed or moved aside (as an operator might, to free a key)
/// costs no token: the next is above every one the key handed out.
#[tokio::test]
async fn a_record_moved_aside_hands_out_no_token_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = opened(&dir);
    let mut handed_out = 0;
    for id in ["l1", "l2", "l3"] {
        let grant = backend.take("k", id, TTL).await;
        handed_out = grant.holder.token;
        backend
            .release(&lease("k", id, handed_out))
            .await
            .expect("release");
    }
    assert_eq!(handed_out, 3);
    std::fs::rename(dir.path().join("k.lock"), dir.path().join("k.lock.aside")).expect("aside");
    let next = backend.take("k", "l4", TTL).await;
    assert!(
        next.holder.token > handed_out,
        "token {} again",
        next.holder.token
    );
    assert_eq!(next.holder.token, TOKEN_BLOCK + 1);
}

/// A record written before `KEY.tokens` was kept reserves a block it keeps
/// at its next grant, so that moving it aside then costs no token either.
#[tokio::test]
async fn a_record_from_before_tokens_were_kept_apart_keeps_its_block_at_the_next_grant() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = opened(&dir);
    let old = format!(
        r#"{{"key":"k","state":"free","token":5,"reserved":1028,"boot_id":"{}"}}"#,
        boot_id()
    );
    std::fs::write(dir.path().join("k.lock"), old).expect("written");
    let grant = backend.take("k", "l1", TTL).await;
    assert_eq!(grant.holder.token, 1029);
    let kept = std::fs::read_to_string(dir.path().join("k.tokens")).expect("k.tokens");
    assert_eq!(kept.trim(), (1028 + TOKEN_BLOCK).to_string());
}

/// Two agents on one directory; through `one`, a run holds "k" (lease l1,
/// token 1) by `run`, and its `k.run` has been removed (a cleanup job,
/// tmpfiles ageing /tmp). `old`: another description of that file, opened
/// before, to see whether it is still locked.
struct RemovedUnderARun {
    dir: tempfile::TempDir,
    one: FileBackend,
    two: FileBackend,
    run: File,
    old: File,
}

async fn removed_under_a_run() -> RemovedUnderARun {
    let dir = tempfile::tempdir().expect("tempdir");
    let (one, two) = (opened(&dir), opened(&dir));
    let first = one.take("k", "l1", TTL).await;
    assert_eq!(first.holder.token, 1);
    let run = File::from(first.lock.expect("a lock for the run"));
    let old = File::open(dir.path().join("k.run")).expect("open k.run");
    std::fs::remove_file(dir.path().join("k.run")).expect("cleaned up");
    RemovedUnderARun {
        dir,
        one,
        two,
        run,
        old,
    }
}

/// A run through another agent creates a new `KEY.run` and locks it, yet
/// is not granted beside the run the record names; once that run ends it is.
#[tokio::test]
async fn a_key_whose_run_file_was_removed_is_not_granted_beside_its_live_run() {
    let RemovedUnderARun {
        dir, one, two, run, ..
    } = removed_under_a_run().await;
    match two.acquire(&spec("k", "l2", false, TTL)).await {
        Err(BackendError::Held(Some(h), _)) => assert_eq!(h.token, 1),
        other => panic!("granted beside a live run: {other:?}"),
    }
    // Replaced by another file (the refused agent made one): refused as well.
    assert!(dir.path().join("k.run").exists());
    assert!(matches!(
        two.acquire(&spec("k", "l3", false, TTL)).await,
        Err(BackendError::Held(Some(_), _))
    ));
    // The holder's agent sees its file is gone at its next renewal.
    assert!(matches!(
        one.renew(&lease("k", "l1", 1), TTL).await,
        Err(BackendError::LeaseMismatch)
    ));
    // The run ends: the key is free, above its token.
    flock(&run, libc::LOCK_UN).expect("the run lets go");
    drop((run, one));
    let next = two.take("k", "l4", TTL).await;
    assert_eq!(next.holder.token, 2);
}

/// Force still takes such a key over, says whom it displaced, and waits
/// until that run has stopped: the run's file is listed as locked until then.
#[tokio::test]
async fn a_key_whose_run_file_was_removed_is_taken_over_by_force_once_its_run_stops() {
    let RemovedUnderARun { dir, two, run, .. } = removed_under_a_run().await;
    let forced = two
        .acquire(&spec("k", "l2", true, TTL))
        .await
        .expect("force");
    assert_eq!(forced.holder.token, 2);
    let displaced = forced.displaced.expect("the live run was displaced");
    assert_eq!(displaced.token, 1);
    assert_eq!(record_at(dir.path(), "k.lock").forced_from, Some(1));
    let k = key_k();
    let stopped = || two.displaced_stopped(&k, &displaced);
    assert!(!stopped().await.expect("looked"), "the run still holds it");
    flock(&run, libc::LOCK_UN).expect("the run lets go");
    assert!(stopped().await.expect("looked"));
}

/// A lease whose `KEY.run` was removed is ended by its agent (a lost lease
/// is ended at once, while its run is still being stopped): the run keeps
/// its lock and the record still names it, so no run is granted beside it
/// until it has stopped; then the history says what happened.
#[tokio::test]
async fn a_lease_ended_after_its_run_file_was_removed_keeps_the_key_until_its_run_stops() {
    let RemovedUnderARun {
        dir: _dir,
        one,
        two,
        run,
        old,
    } = removed_under_a_run().await;
    one.end(&lease("k", "l1", 1), &Ending::Released)
        .await
        .expect("ended");
    assert!(
        !flock(&old, libc::LOCK_EX | libc::LOCK_NB).expect("flock"),
        "the run's lock was dropped while it ran"
    );
    match two.acquire(&spec("k", "l2", false, TTL)).await {
        Err(BackendError::Held(Some(h), _)) => assert_eq!(h.token, 1),
        other => panic!("granted beside a live run: {other:?}"),
    }
    assert_eq!(
        two.inspect(&key_k()).await.expect("inspect").state,
        KeyState::Held
    );
    flock(&run, libc::LOCK_UN).expect("the run stops");
    assert_eq!(two.take("k", "l3", TTL).await.holder.token, 2);
    let history = two.history(&key_k()).await.expect("history");
    let expired = history
        .iter()
        .find(|e| e.kind == EventKind::Expired)
        .expect("an expiry");
    assert!(
        expired.reason.contains("removed or replaced"),
        "{expired:?}"
    );
}

/// Where the kernel does not list locks by the inode `stat` gives (no
/// `/proc/locks` under the unit's `ProcSubset=pid`, or btrfs), a run whose
/// `KEY.run` was removed is believed while its holder's process lives.
#[tokio::test]
async fn without_proc_locks_a_removed_run_file_is_held_while_its_holder_lives() {
    let dir = tempfile::tempdir().expect("tempdir");
    let one = opened(&dir);
    let mut two = opened(&dir);
    Arc::get_mut(&mut two.inner)
        .expect("only here")
        .kernel_lists_locks = false;
    let mut shim = Command::new("sleep").arg("60").spawn().expect("sleep");
    let mut ask = spec("k", "l1", false, TTL);
    ask.holder.pid = shim.id();
    let first = one.acquire(&ask).await.expect("free");
    std::fs::remove_file(dir.path().join("k.run")).expect("cleaned up");
    assert!(matches!(
        two.acquire(&spec("k", "l2", false, TTL)).await,
        Err(BackendError::Held(Some(_), _))
    ));
    shim.kill().expect("kill");
    shim.wait().expect("reaped");
    assert_eq!(two.take("k", "l3", TTL).await.holder.token, 2);
    drop(first);
}

/// A forcer's agent that dies while it waits for the run it displaced
/// takes its lock on the new `KEY.run` with it. The record lists the
/// displaced run, whose file a second name keeps: no plain run is granted
/// beside it, and a second force waits for it too; once it has stopped, the
/// next grant drops it from the record and removes its second name.
#[tokio::test]
async fn a_run_displaced_by_a_forcer_that_died_keeps_the_key_until_it_stops() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (one, three) = (opened(&dir), opened(&dir));
    let first = one.take("k", "l1", TTL).await;
    let run = File::from(first.lock.expect("a lock for the run"));
    {
        let two = opened(&dir);
        let forced = two
            .acquire(&spec("k", "l2", true, TTL))
            .await
            .expect("force");
        assert_eq!(forced.displaced.expect("displaced").token, 1);
        assert!(dir.path().join(".k.run.1").exists(), "the run's file kept");
        // The forcer's agent dies: its description of the new file, and
        // the one it would have handed to its run, close.
    }
    assert_eq!(record_at(dir.path(), "k.lock").store.displaced.len(), 1);
    match three.acquire(&spec("k", "l3", false, TTL)).await {
        Err(BackendError::Held(Some(h), _)) => assert_eq!(h.token, 1),
        other => panic!("granted beside the displaced run: {other:?}"),
    }
    let again = three
        .acquire(&spec("k", "l4", true, TTL))
        .await
        .expect("a second force");
    let displaced = again.displaced.expect("the displaced run is waited for");
    assert_eq!(displaced.token, 1);
    let k = key_k();
    assert!(!three
        .displaced_stopped(&k, &displaced)
        .await
        .expect("looked"));
    flock(&run, libc::LOCK_UN).expect("the displaced run lets go");
    assert!(three
        .displaced_stopped(&k, &displaced)
        .await
        .expect("looked"));
    drop((run, again.lock));
    three
        .end(&lease("k", "l4", again.holder.token), &Ending::Released)
        .await
        .expect("released");
    let next = three.take("k", "l5", TTL).await;
    assert!(next.displaced.is_none());
    assert!(record_at(dir.path(), "k.lock").store.displaced.is_empty());
    assert!(
        !dir.path().join(".k.run.1").exists(),
        "the second name removed"
    );
    drop(one);
}
