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

/// `KEY.run` removed (a cleanup job, tmpfiles ageing /tmp) while a run holds
/// it: a run through another agent creates a new one and locks it, yet is
/// not granted beside the run the record names; once that run ends it is.
#[tokio::test]
async fn a_key_whose_run_file_was_removed_is_not_granted_beside_its_live_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let one = opened(&dir);
    let two = opened(&dir);
    let first = one.take("k", "l1", TTL).await;
    let run = File::from(first.lock.expect("a lock for the run"));
    std::fs::remove_file(dir.path().join("k.run")).expect("cleaned up");
    match two.acquire(&spec("k", "l2", false, TTL)).await {
        Err(BackendError::Held(Some(h), _)) => assert_eq!(h.token, first.holder.token),
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

/// Force still takes such a key over, and says whom it displaced.
#[tokio::test]
async fn a_key_whose_run_file_was_removed_is_taken_over_by_force() {
    let dir = tempfile::tempdir().expect("tempdir");
    let one = opened(&dir);
    let two = opened(&dir);
    let first = one.take("k", "l1", TTL).await;
    std::fs::remove_file(dir.path().join("k.run")).expect("cleaned up");
    let forced = two
        .acquire(&spec("k", "l2", true, TTL))
        .await
        .expect("force");
    assert_eq!(forced.holder.token, 2);
    let displaced = forced.displaced.expect("the live run was displaced");
    assert_eq!(displaced.token, first.holder.token);
    let record = record_at(dir.path(), "k.lock");
    assert_eq!(record.forced_from, Some(first.holder.token));
    drop(first);
}

/// The run whose `KEY.run` was removed ends and its agent releases it: the
/// record says so, and the key goes on at once, whatever the kernel tells
/// of the old file.
#[tokio::test]
async fn a_run_whose_file_was_removed_is_released_as_its_record_says() {
    let dir = tempfile::tempdir().expect("tempdir");
    let one = opened(&dir);
    let first = one.take("k", "l1", TTL).await;
    std::fs::remove_file(dir.path().join("k.run")).expect("cleaned up");
    drop(first.lock);
    one.release(&lease("k", "l1", first.holder.token))
        .await
        .expect("release");
    let record = record_at(dir.path(), "k.lock");
    assert_eq!((record.state, record.token), (KeyState::Free, 1));
    let two = opened(&dir);
    assert_eq!(two.take("k", "l2", TTL).await.holder.token, 2);
    assert_eq!(
        history_lines(&two, "k").await,
        [
            "Granted 1 host-of-l1",
            "Released 1 host-of-l1",
            "Granted 2 host-of-l2"
        ]
    );
}
