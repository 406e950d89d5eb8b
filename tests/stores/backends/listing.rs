//! `Backend::list` on a store's emulator: what every store's listing keeps
//! to, run by each store's own tests (which make a record unreadable in
//! their store's own way).

use anyhow::{bail, ensure, Context, Result};
use runlock_agent::backend::testing::spec;
use runlock_agent::backend::{Backend, LeaseRef, ListFrom, ListPage, Listed, PageAsk};
use runlock_protocol::{EventKind, Key, KeyRecord, KeyState};
use std::future::Future;
use std::time::Duration;

const TTL: Duration = Duration::from_secs(10);
/// The key whose record the store's test makes unreadable.
pub(super) const UNREADABLE: &str = "app/bad";

/// One page of at most `limit` records under `prefix`, from `from` on.
pub(super) async fn list_page(
    backend: &dyn Backend,
    prefix: &str,
    from: &ListFrom,
    limit: usize,
) -> Result<ListPage> {
    let ask = PageAsk {
        prefix,
        from,
        limit,
    };
    Ok(backend.list(ask).await?)
}

/// Every record `backend` lists under `prefix`, `limit` at a time, and how
/// many pages that took.
pub(super) async fn list_all(
    backend: &dyn Backend,
    prefix: &str,
    limit: usize,
) -> Result<(Vec<Listed>, usize)> {
    let (mut listed, mut pages) = (Vec::new(), 0);
    let mut from = ListFrom::default();
    loop {
        let page = list_page(backend, prefix, &from, limit).await?;
        pages += 1;
        ensure!(
            page.records.len() <= limit,
            "page {pages} has {} records",
            page.records.len()
        );
        listed.extend(page.records);
        match page.next {
            Some(next) => from = next,
            None => return Ok((listed, pages)),
        }
        ensure!(pages < 100, "the listing never ends");
    }
}

/// The keys of `listed`, readable or not (`!` and the name for those not).
pub(super) fn keys_of(listed: &[Listed]) -> Vec<String> {
    listed
        .iter()
        .map(|l| match &l.read {
            Ok((record, _)) => record.key.clone(),
            Err(_) => format!("!{}", l.name),
        })
        .collect()
}

/// The contract, on a space of its own: `one` and `two` stand for two
/// hosts' agents; `make_unreadable` spoils the record of [`UNREADABLE`],
/// held through `one`, in the store.
pub(super) async fn lists_every_record<F, Fut>(
    one: &dyn Backend,
    two: &dyn Backend,
    make_unreadable: F,
) -> Result<()>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let mut tokens = Vec::new();
    for n in 1..=7 {
        let granted = one
            .acquire(&spec(&format!("app/k{n}"), &format!("l{n}"), false, TTL))
            .await?;
        tokens.push(granted.holder.token);
    }
    for n in [2, 5] {
        one.release(&LeaseRef {
            key: Key::new(format!("app/k{n}"))?,
            lease_id: format!("l{n}"),
            token: tokens[n - 1],
        })
        .await?;
    }
    two.acquire(&spec("other/x", "lx", false, TTL)).await?;
    let mut slot = spec("app/s", "ls", false, TTL);
    slot.key = Key::new("app/s")?.slot_record(1);
    (slot.holder.slot, slot.holder.slots) = (Some(1), Some(2));
    two.acquire(&slot).await?;
    one.acquire(&spec(UNREADABLE, "lbad", false, TTL)).await?;
    make_unreadable().await?;

    // Three at a time, through the other agent: every record, each once,
    // in the store's order.
    let (listed, pages) = list_all(two, "app/", 3).await?;
    let mut expected: Vec<String> = (1..=7).map(|n| format!("app/k{n}")).collect();
    expected.push(format!("!{}", unreadable_name(&listed)?));
    expected.push(Key::new("app/s")?.slot_record(1).to_string());
    let mut keys = keys_of(&listed);
    keys.sort();
    expected.sort();
    ensure!(keys == expected, "listed {keys:?}");
    ensure!(pages >= 3, "nine records, three a page, in {pages} pages");
    let names: Vec<&str> = listed.iter().map(|l| l.name.as_str()).collect();
    ensure!(
        names.windows(2).all(|w| w[0] < w[1]),
        "not in name order: {names:?}"
    );

    for (n, token) in (1..=7).zip(&tokens) {
        let key = Key::new(format!("app/k{n}"))?;
        let (record, history) = read_of(&listed, &key)?;
        let kinds: Vec<EventKind> = history.iter().map(|e| e.kind).collect();
        ensure!(
            history == &two.history(&key).await?,
            "{key}: {history:?} is not its history"
        );
        ensure!(record.token == *token, "{key}: {record:?}");
        if n == 2 || n == 5 {
            // Released: free, with the token it had and how it ended.
            ensure!(
                record == &two.inspect(&key).await?,
                "{key}: {record:?} is not as inspected"
            );
            ensure!(record.state == KeyState::Free && record.holder.is_none());
            ensure!(
                kinds == [EventKind::Granted, EventKind::Released],
                "{key}: {kinds:?}"
            );
            continue;
        }
        let inspected = two.inspect(&key).await?;
        ensure!(
            without_expiry(record) == without_expiry(&inspected),
            "{key}: {record:?} is not as inspected ({inspected:?})"
        );
        ensure!(record.state == KeyState::Held, "{key}: {record:?}");
        let host = record.holder.as_ref().map(|h| h.host.as_str());
        ensure!(host == Some(&*format!("host-of-l{n}")), "{key}: {record:?}");
        let left = record.expires_in_ms.context("a held key expires")?;
        ensure!(left > 0 && left <= TTL.as_millis() as u64, "{key}: {left}");
        ensure!(kinds == [EventKind::Granted], "{key}: {kinds:?}");
    }
    let (slot_record, _) = read_of(&listed, &Key::new("app/s")?.slot_record(1))?;
    ensure!(
        slot_record.state == KeyState::Held
            && slot_record.holder.as_ref().and_then(|h| h.slot) == Some(1),
        "{slot_record:?}"
    );

    // Resumed after a record of a page (as asked, with that record's name):
    // the listing goes on from the next.
    let mut asked = ListFrom::default();
    loop {
        let page = list_page(two, "app/", &asked, 3).await?;
        if let [first, second, ..] = page.records.as_slice() {
            let resumed = ListFrom {
                after: Some(first.name.clone()),
                ..asked.clone()
            };
            let rest = list_page(two, "app/", &resumed, 3).await?;
            ensure!(
                rest.records.first().map(|l| &l.name) == Some(&second.name),
                "resumed after {:?}: {:?}",
                first.name,
                keys_of(&rest.records)
            );
        }
        match page.next {
            Some(next) => asked = next,
            None => break,
        }
    }

    // A prefix is of the key: `app/k` is seven keys; none is every key.
    let (only_k, _) = list_all(one, "app/k", 2).await?;
    let only_k = keys_of(&only_k);
    ensure!(
        only_k == (1..=7).map(|n| format!("app/k{n}")).collect::<Vec<_>>(),
        "{only_k:?}"
    );
    let (all, _) = list_all(one, "", 2).await?;
    ensure!(all.len() == 10, "{:?}", keys_of(&all));
    ensure!(keys_of(&all).contains(&"other/x".to_string()));
    let (none, _) = list_all(one, "zzz", 2).await?;
    ensure!(none.is_empty(), "{:?}", keys_of(&none));
    Ok(())
}

/// The store's name of the one unreadable record listed.
fn unreadable_name(listed: &[Listed]) -> Result<String> {
    let unreadable: Vec<&Listed> = listed.iter().filter(|l| l.read.is_err()).collect();
    match unreadable.as_slice() {
        [one] => Ok(one.name.clone()),
        other => bail!("expected one unreadable record, got {other:?}"),
    }
}

/// What the listing read of `key`.
fn read_of<'a>(
    listed: &'a [Listed],
    key: &Key,
) -> Result<(&'a KeyRecord, &'a Vec<runlock_protocol::KeyEvent>)> {
    listed
        .iter()
        .find_map(|l| match &l.read {
            Ok((record, history)) if record.key == key.as_str() => Some((record, history)),
            _ => None,
        })
        .with_context(|| format!("{key:?} is not listed"))
}

/// A record without the time it has left, which moves between two reads.
fn without_expiry(record: &KeyRecord) -> KeyRecord {
    KeyRecord {
        expires_in_ms: None,
        ..record.clone()
    }
}
