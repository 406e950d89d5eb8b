//! Tokens: handed out from durable blocks, so that none comes again after a
//! reboot (the boot id tells the record may lag behind).

use super::*;
use crate::backend::file::record::{next_token, TokenBlock, TOKEN_BLOCK};

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
            kept: true,
            run: None,
            displaced: Vec::new(),
        },
    };
    assert_eq!(next_token(None, 0, "a"), (1, TOKEN_BLOCK, true));
    assert_eq!(
        next_token(Some(&record(1, 1024, "a")), 0, "a"),
        (2, 1024, false)
    );
    assert_eq!(
        next_token(Some(&record(1023, 1024, "a")), 0, "a"),
        (1024, 1024, false)
    );
    assert_eq!(
        next_token(Some(&record(1024, 1024, "a")), 0, "a"),
        (1025, 2048, true)
    );
    // After a reboot the record may lag behind what was handed out.
    assert_eq!(
        next_token(Some(&record(3, 1024, "a")), 0, "b"),
        (1025, 2048, true)
    );
    // A record from before blocks (no reservation) goes on from its token.
    assert_eq!(next_token(Some(&record(7, 0, "")), 0, "b"), (8, 1031, true));
    // A record whose block `KEY.tokens` does not keep reserves one it keeps.
    let unkept = FileRecord {
        store: TokenBlock {
            kept: false,
            ..record(3, 1024, "a").store
        },
        ..record(3, 1024, "a")
    };
    assert_eq!(next_token(Some(&unkept), 0, "a"), (1025, 2048, true));
    // With no record, or a reservation to make, `KEY.tokens` is the floor.
    assert_eq!(next_token(None, 5120, "a"), (5121, 6144, true));
    assert_eq!(
        next_token(Some(&record(1024, 1024, "a")), 5120, "a"),
        (5121, 6144, true)
    );
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
    let grant = after.take("k", "l9", TTL).await;
    assert_eq!(grant.holder.token, TOKEN_BLOCK + 1);
    assert_eq!(
        record_at(dir.path(), "k.lock").store.reserved,
        2 * TOKEN_BLOCK
    );
}
