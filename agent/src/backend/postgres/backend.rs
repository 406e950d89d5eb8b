//! The lease algorithm on PostgreSQL: one row per key, one statement per
//! operation (`sql.rs`), run through the kept connection (`session.rs`).

use super::session::{self, Session};
use super::settings::Settings;
use super::sql::{self, Sql};
use crate::backend::history;
use crate::backend::{
    redact_uri, AcquireSpec, Adopted, Adopter, Backend, BackendError, BackendResult, Capabilities,
    Displaced, Ending, Grant, LeaseRef, ListFrom, ListPage, Listed, PageAsk, PostgresOptions,
    Profile, Profiled, Renewed, ReportName, Reports, StoreContext, StoredReport,
};
use async_trait::async_trait;
use runlock_protocol::timing::grace;
use runlock_protocol::{Holder, Key, KeyEvent, KeyRecord, KeyState, Scope};
use std::time::Duration;
use tokio::sync::broadcast;

/// A lock table in PostgreSQL.
pub struct PostgresBackend {
    session: Session,
    described: String,
    table: String,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Column `index` of `row`; a type the statement does not produce is a corrupt answer.
fn column<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a tokio_postgres::Row,
    index: usize,
) -> BackendResult<T> {
    row.try_get(index)
        .map_err(|err| BackendError::Corrupt(format!("unexpected answer from PostgreSQL: {err}")))
}

/// A row's first columns, as a tuple of their types (see [`column`]).
trait Columns<'a>: Sized {
    fn of(row: &'a tokio_postgres::Row) -> BackendResult<Self>;
}

macro_rules! columns {
    ($($type:ident $index:tt),+) => {
        impl<'a, $($type: tokio_postgres::types::FromSql<'a>),+> Columns<'a> for ($($type,)+) {
            fn of(row: &'a tokio_postgres::Row) -> BackendResult<Self> {
                Ok(($(column(row, $index)?,)+))
            }
        }
    };
}
columns!(A 0, B 1);
columns!(A 0, B 1, C 2, D 3, E 4);
columns!(A 0, B 1, C 2, D 3, E 4, F 5);

/// A lease's token as the table stores it; one no row can have matches nothing.
fn stored_token(lease: &LeaseRef) -> i64 {
    i64::try_from(lease.token).unwrap_or(-1)
}

fn token(value: i64, key: &Key) -> BackendResult<u64> {
    u64::try_from(value)
        .map_err(|_| BackendError::Corrupt(format!("the row of {key:?} has token {value}")))
}

impl PostgresBackend {
    /// Reads the URI (and libpq's `PG*` variables) and the options; makes no
    /// connection (see [`PostgresBackend::probe`]).
    pub fn open(
        uri: &str,
        options: &PostgresOptions,
        context: &StoreContext,
    ) -> anyhow::Result<PostgresBackend> {
        let settings = Settings::from_uri(uri, Some(session::STATEMENT_TIMEOUT))
            .map_err(|err| anyhow::anyhow!("backend {}: {err}", redact_uri(uri)))?;
        let schema = options.schema().map_err(anyhow::Error::msg)?;
        let sql = Sql::new(&schema, &format!("runlock:{schema}"));
        let table = sql.table().to_string();
        let described = format!("{} (schema {schema})", redact_uri(uri));
        Ok(PostgresBackend {
            session: Session::new(settings, sql, options.listen, context),
            described,
            table,
        })
    }

    /// Connects, creating the schema and table if missing: the start-up check.
    pub async fn probe(&self) -> Result<(), String> {
        self.session.connect_now().await
    }

    /// Statements sent by operations so far: each operation is one, unless retried.
    pub fn statements_sent(&self) -> u64 {
        self.session.statements_sent()
    }

    /// A forced row's `displaced`: the holder and TTL of the lease it took over.
    fn displaced(&self, key: &Key, text: Option<String>) -> BackendResult<Option<Displaced>> {
        #[derive(serde::Deserialize)]
        struct Column {
            holder: Holder,
            ttl_ms: u64,
        }
        let Some(text) = text else { return Ok(None) };
        let column: Column = serde_json::from_str(&text).map_err(|err| {
            BackendError::Corrupt(format!(
                "the row of {key:?} in {} names a taken-over lease runlock cannot read ({err})",
                self.table
            ))
        })?;
        Ok(Some(Displaced {
            token: column.holder.token,
            holder: Some(column.holder),
            ttl: Duration::from_millis(column.ttl_ms),
            lock: None,
        }))
    }

    fn holder(&self, key: &Key, text: Option<String>) -> BackendResult<Option<Holder>> {
        text.map(|text| {
            serde_json::from_str(&text).map_err(|err| {
                BackendError::Corrupt(format!(
                    "the row of {key:?} in {} names a holder runlock cannot read ({err}); \
                     to free the key, set its state to 'free' and its lease_id and holder \
                     to NULL, keeping its token (a row deleted hands its tokens out again)",
                    self.table
                ))
            })
        })
        .transpose()
    }
}

impl PostgresBackend {
    /// The row `statement` (one that takes only the key) reads for `key`, if any.
    async fn row_of(
        &self,
        key: &Key,
        statement: fn(&sql::Statements) -> &sql::Statement,
    ) -> BackendResult<Option<tokio_postgres::Row>> {
        let name = key.as_str();
        let (row, _) = self
            .session
            .run(|link, statements| async move {
                statement(&statements)
                    .query_opt(&link.client, &[&name])
                    .await
            })
            .await
            .map_err(BackendError::Unavailable)?;
        Ok(row)
    }

    /// The rows `statement` (one that takes a key and a token) answers.
    async fn rows_of_token(
        &self,
        key: &str,
        token: i64,
        statement: fn(&sql::Statements) -> &sql::Statement,
    ) -> BackendResult<Vec<tokio_postgres::Row>> {
        let (rows, _) = self
            .session
            .run(|link, statements| async move {
                statement(&statements)
                    .query(&link.client, &[&key, &token])
                    .await
            })
            .await
            .map_err(BackendError::Unavailable)?;
        Ok(rows)
    }

    /// The row of `key` as `inspect` reports it, with its history: its first
    /// columns are `Statements::inspect`'s (`list` reads them too).
    fn shown(
        &self,
        key: &Key,
        row: &tokio_postgres::Row,
    ) -> BackendResult<(KeyRecord, Vec<KeyEvent>)> {
        let (state, token_value, holder, expired, expires_in_ms, events): (
            String,
            i64,
            Option<String>,
            bool,
            i64,
            Option<String>,
        ) = Columns::of(row)?;
        let mut record = KeyRecord::free(key, Scope::Global);
        record.token = token(token_value, key)?;
        let events = self.history_of(key, events)?;
        record.incident = history::last_incident(&events);
        if state == "held" && !expired {
            record.state = KeyState::Held;
            record.holder = self.holder(key, holder)?;
            record.expires_in_ms = Some(u64::try_from(expires_in_ms).unwrap_or(0));
        }
        Ok((record, events))
    }

    /// A row's history column, read.
    fn history_of(&self, key: &Key, text: Option<String>) -> BackendResult<Vec<KeyEvent>> {
        let Some(text) = text else {
            return Ok(Vec::new());
        };
        serde_json::from_str(&text).map_err(|err| {
            BackendError::Corrupt(format!(
                "the row of {key:?} in {} has a history runlock cannot read ({err}); \
                 set it to '[]' to start it afresh",
                self.table
            ))
        })
    }

    /// Keys released through any agent, as the server announces them; `None`
    /// when this backend does not listen.
    pub fn releases(&self) -> Option<broadcast::Receiver<Key>> {
        self.session.releases()
    }
}

impl Profiled for PostgresBackend {
    fn profile(&self) -> Profile {
        Profile {
            capabilities: Capabilities::SHARED_LEASES,
            min_ttl: Duration::ZERO,
            description: self.described.clone(),
            releases: self.session.release_sender(),
        }
    }
}

#[async_trait]
impl Backend for PostgresBackend {
    async fn acquire(&self, spec: &AcquireSpec) -> BackendResult<Grant> {
        // invariant: a Holder always serializes (plain strings and numbers)
        let holder = serde_json::to_string(&spec.holder).unwrap_or_default();
        let (key, ttl, grace) = (spec.key.as_str(), millis(spec.ttl), millis(grace(spec.ttl)));
        // A row inserted by another agent after this statement's snapshot is
        // neither taken nor seen: look once more before calling it held by nobody known.
        for _ in 0..2 {
            let (rows, sent) = self
                .session
                .run(|link, statements| {
                    let holder = &holder;
                    let lease_id = &spec.lease_id;
                    async move {
                        let args: [&(dyn tokio_postgres::types::ToSql + Sync); 7] = [
                            &key,
                            lease_id,
                            holder,
                            &ttl,
                            &grace,
                            &spec.force,
                            &spec.breaking,
                        ];
                        statements.acquire.query(&link.client, &args).await
                    }
                })
                .await
                .map_err(BackendError::Unavailable)?;
            let Some(row) = rows.first() else { continue };
            let (taken, token_value, holder_text, history, displaced): (
                bool,
                i64,
                Option<String>,
                Option<String>,
                Option<String>,
            ) = Columns::of(row)?;
            let recorded = self.holder(&spec.key, holder_text)?;
            if !taken {
                let history = self.history_of(&spec.key, history)?;
                let incident = history::last_incident(&history);
                return Err(BackendError::Held(recorded.map(Box::new), incident));
            }
            let holder = Holder {
                token: token(token_value, &spec.key)?,
                ..spec.holder.clone()
            };
            let displaced = self.displaced(&spec.key, displaced)?;
            return Ok(Grant {
                holder,
                sent,
                lock: None,
                displaced,
            });
        }
        Err(BackendError::Held(None, None))
    }

    async fn confirm_stopped(&self, lease: &LeaseRef) -> BackendResult<()> {
        let (key, token) = (lease.key.as_str(), stored_token(lease));
        self.rows_of_token(key, token, |statements| &statements.stopped)
            .await?;
        Ok(())
    }

    async fn displaced_stopped(&self, key: &Key, displaced: &Displaced) -> BackendResult<bool> {
        let (key, token) = (
            key.as_str(),
            i64::try_from(displaced.token).unwrap_or(i64::MAX),
        );
        let taken = self
            .rows_of_token(key, token, |statements| &statements.take_stopped)
            .await?;
        Ok(!taken.is_empty())
    }

    async fn renew(&self, lease: &LeaseRef, ttl: Duration) -> BackendResult<Renewed> {
        let (key, token) = (lease.key.as_str(), stored_token(lease));
        let (ttl, grace) = (millis(ttl), millis(grace(ttl)));
        let (renewed, _) = self
            .session
            .run(|link, statements| async move {
                statements
                    .renew
                    .query(&link.client, &[&key, &lease.lease_id, &token, &ttl, &grace])
                    .await
            })
            .await
            .map_err(BackendError::Unavailable)?;
        if renewed.is_empty() {
            return Err(BackendError::LeaseMismatch);
        }
        Ok(Renewed::ByThisCall)
    }

    async fn end(&self, lease: &LeaseRef, ending: &Ending) -> BackendResult<()> {
        let (key, token) = (lease.key.as_str(), stored_token(lease));
        // The event as the statement writes it: its kind and why.
        let (kind, reason) = match ending.kind() {
            Some((kind, why)) => (Some(kind.name()), why),
            None => (None, ""),
        };
        // No row freed: the lease was already someone else's, or freed; nothing to do.
        self.session
            .run(|link, statements| async move {
                let args: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
                    [&key, &lease.lease_id, &token, &kind, &reason];
                statements.release.query(&link.client, &args).await
            })
            .await
            .map_err(BackendError::Unavailable)?;
        Ok(())
    }

    async fn inspect(&self, key: &Key) -> BackendResult<KeyRecord> {
        match self.row_of(key, |statements| &statements.inspect).await? {
            Some(row) => Ok(self.shown(key, &row)?.0),
            None => Ok(KeyRecord::free(key, Scope::Global)),
        }
    }

    /// One statement a page: the rows whose key starts with `prefix`, after
    /// `from.after`, in byte order.
    async fn list(&self, ask: PageAsk<'_>) -> BackendResult<ListPage> {
        let (prefix, from, limit) = (ask.prefix, ask.from, ask.limit);
        let pattern = sql::like_prefix(prefix);
        let after = from.after.as_deref();
        // One more than the page, to tell whether another follows.
        let asked = i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1);
        let (rows, _) = self
            .session
            .run(|link, statements| {
                let pattern = &pattern;
                async move {
                    statements
                        .list
                        .query(&link.client, &[pattern, &after, &asked])
                        .await
                }
            })
            .await
            .map_err(BackendError::Unavailable)?;
        let more = rows.len() > limit;
        let mut records = Vec::with_capacity(rows.len().min(limit));
        for row in rows.iter().take(limit) {
            let name: String = column(row, 6)?;
            let read = Key::parse_record(&name)
                .map_err(|e| {
                    format!(
                        "the row of {name:?} in {} names no valid key: {e}",
                        self.table
                    )
                })
                .and_then(|key| self.shown(&key, row).map_err(|e| e.to_string()));
            records.push(Listed { name, read });
        }
        let next = more.then(|| ListFrom {
            after: records.last().map(|listed| listed.name.clone()),
            ..ListFrom::default()
        });
        Ok(ListPage { records, next })
    }

    async fn history(&self, key: &Key) -> BackendResult<Vec<KeyEvent>> {
        match self.row_of(key, |statements| &statements.history).await? {
            Some(row) => self.history_of(key, column(&row, 0)?),
            None => Ok(Vec::new()),
        }
    }

    async fn adopt(&self, lease: &LeaseRef, by: &Adopter) -> BackendResult<Adopted> {
        let (key, token) = (lease.key.as_str(), stored_token(lease));
        let (agent_id, uid) = (by.agent_id.as_str(), i64::from(by.uid));
        let (row, sent) = self
            .session
            .run(|link, statements| async move {
                statements
                    .adopt
                    .query_opt(
                        &link.client,
                        &[&key, &lease.lease_id, &token, &agent_id, &uid],
                    )
                    .await
            })
            .await
            .map_err(BackendError::Unavailable)?;
        let row = row.ok_or(BackendError::LeaseMismatch)?;
        let (holder, ttl_ms): (Option<String>, i64) = (column(&row, 0)?, column(&row, 1)?);
        let holder = self.holder(&lease.key, holder)?.ok_or_else(|| {
            BackendError::Corrupt(format!(
                "the row of {:?} in {} is held but names no holder",
                lease.key, self.table
            ))
        })?;
        Ok(Adopted::new(
            holder,
            sent,
            Duration::from_millis(u64::try_from(ttl_ms).unwrap_or(0)),
        ))
    }
}

#[async_trait]
impl Reports for PostgresBackend {
    async fn put_report(&self, agent: &ReportName, body: Vec<u8>) -> BackendResult<()> {
        let agent = agent.as_str();
        let report = String::from_utf8(body)
            .map_err(|_| BackendError::Corrupt("a report must be UTF-8 JSON".to_string()))?;
        let report = &report;
        self.session
            .run(|link, statements| async move {
                statements
                    .put_report
                    .query(&link.client, &[&agent, report])
                    .await
            })
            .await
            .map_err(BackendError::Unavailable)?;
        Ok(())
    }

    /// One statement for every report.
    async fn reports(&self) -> BackendResult<Vec<StoredReport>> {
        let (rows, _) = self
            .session
            .run(
                |link, statements| async move { statements.reports.query(&link.client, &[]).await },
            )
            .await
            .map_err(BackendError::Unavailable)?;
        let mut reports = Vec::with_capacity(rows.len());
        for row in &rows {
            let (agent, report): (String, String) = Columns::of(row)?;
            // A row no agent wrote (its id is no agent's) is none of ours to show.
            if let Some(agent) = ReportName::new(&agent) {
                reports.push(StoredReport::read(agent, report.into_bytes()));
            }
        }
        Ok(reports)
    }

    async fn remove_report(&self, agent: &ReportName) -> BackendResult<()> {
        let agent = agent.as_str();
        self.session
            .run(|link, statements| async move {
                statements
                    .remove_report
                    .query(&link.client, &[&agent])
                    .await
            })
            .await
            .map_err(BackendError::Unavailable)?;
        Ok(())
    }
}
