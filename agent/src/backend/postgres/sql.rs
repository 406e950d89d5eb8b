//! The lock table and the one statement each operation is.
//!
//! One row per key, in a schema of runlock's own (never Meltano's tables):
//!
//! | column | meaning |
//! | --- | --- |
//! | `key` | the key (primary key) |
//! | `state` | `held` or `free`: a release keeps the row, so tokens keep growing |
//! | `token` | the last fencing token issued; +1 on every acquisition |
//! | `lease_id` | the holding lease, while held |
//! | `holder` | the holder (jsonb, with its `token`), while held |
//! | `ttl_ms`, `grace_ms` | the holder's TTL, and how long past it others wait |
//! | `written` | when the row was last written, by the **database's** clock |
//! | `forced_from` | the token this holder took the key from with `--force` |
//! | `history` | the key's latest events (jsonb array, oldest first, at most 32), by the database's clock |
//!
//! A held row is expired once the database's `now()` has passed `written +
//! ttl_ms + grace_ms`; no agent's clock is ever consulted. Writes stamp
//! `clock_timestamp()` and checks read `now()` (the statement's start): both
//! err toward a later expiry.

use tokio_postgres::types::ToSql;
use tokio_postgres::types::Type as T;
use tokio_postgres::{Client, Row};

/// The name of the table inside the schema.
pub const TABLE: &str = "locks";
/// The table where the agent of a run taken over says the run has stopped.
pub const STOPPED: &str = "stopped";
/// The table of agents' reports: their waiters and refusals.
pub const AGENTS: &str = "agents";

/// `ident` as a quoted SQL identifier.
pub fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// `text` as a quoted SQL string literal.
pub fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// A `LIKE` pattern (escape `!`) for the text that starts with `prefix`.
pub fn like_prefix(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '!' | '%' | '_') {
            pattern.push('!');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}

/// The statements of one schema.
#[derive(Debug, Clone)]
pub struct Sql {
    table: String,
    stopped: String,
    agents: String,
    schema: String,
    channel: String,
}

/// One statement: its text and its parameters' types. It is sent unnamed
/// with every use (`query_typed`, one round trip): nothing is prepared on a
/// connection, so the backend works through a transaction pooler, where the
/// next transaction may run on another server connection.
pub struct Statement {
    text: String,
    types: &'static [T],
}

impl Statement {
    fn new(text: String, types: &'static [T]) -> Statement {
        Statement { text, types }
    }

    /// Runs it with `args` (one per parameter, in order); returns its rows.
    pub async fn query(
        &self,
        client: &Client,
        args: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let params: Vec<(&(dyn ToSql + Sync), T)> = args
            .iter()
            .zip(self.types)
            .map(|(arg, ty)| (*arg, ty.clone()))
            .collect();
        client.query_typed(&self.text, &params).await
    }

    /// [`Statement::query`], for a statement with at most one row.
    pub async fn query_opt(
        &self,
        client: &Client,
        args: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, tokio_postgres::Error> {
        Ok(self.query(client, args).await?.into_iter().next())
    }
}

/// The statements of one schema.
pub struct Statements {
    /// `$1 key, $2 lease_id, $3 holder json, $4 ttl_ms, $5 grace_ms, $6 force,
    /// $7 breaking` → `(taken bool, token bigint, holder text, history text)`:
    /// the taken row (no history), or the holder's row.
    pub acquire: Statement,
    /// `$1 key, $2 lease_id, $3 token, $4 ttl_ms, $5 grace_ms` → one row if renewed.
    pub renew: Statement,
    /// `$1 key, $2 lease_id, $3 token, $4 event kind (NULL: none), $5 reason`
    /// → one row if it freed the key.
    pub release: Statement,
    /// `$1 key` → `(state, token, holder, expired, expires_in_ms, history)`, or no row.
    pub inspect: Statement,
    /// `$1` a [`like_prefix`] pattern, `$2` the key the page starts after
    /// (NULL: the first), `$3` how many rows at most → inspect's columns
    /// and `key`, in byte order of the key.
    pub list: Statement,
    /// `$1 key` → `(history)`, or no row.
    pub history: Statement,
    /// `$1 key, $2 lease_id, $3 token, $4 agent_id` → `(holder, ttl_ms)` if adopted.
    pub adopt: Statement,
    /// `$1 key, $2 token`: the run of that lease, taken over, has stopped.
    pub stopped: Statement,
    /// `$1 key, $2 token` → one row if its run was said to have stopped
    /// (the word is removed).
    pub take_stopped: Statement,
    /// No parameter, no row: fails if a table or a column the others use is
    /// missing, or this role may not read them. (Not the reports' table: a
    /// role without it still locks, and says why its reports fail.)
    pub check: Statement,
    /// `$1 agent_id, $2 report`: writes the agent's report over its last.
    pub put_report: Statement,
    /// → `(agent_id, report)` of every agent.
    pub reports: Statement,
    /// `$1 agent_id`: removes the agent's report.
    pub remove_report: Statement,
}

/// When a held row stops protecting its holder, by the database's clock.
const EXPIRES: &str = "l.written + (l.ttl_ms + l.grace_ms) * interval '1 millisecond'";

/// How many events a row's history keeps (`MAX_HISTORY_EVENTS`).
const KEPT: usize = runlock_protocol::MAX_HISTORY_EVENTS;

/// An event about `token`, done by `who` (a holder as jsonb, whose command
/// line is never kept), now by the database's clock.
fn event(kind: &str, who: &str, token: &str, more: &str) -> String {
    format!(
        "(({who}) - 'command' - 'gid' - 'acquired_at_ms' - 'token') || jsonb_build_object(
             'kind', {kind}, 'clock', 'store', 'token', {token},
             'at_ms', (extract(epoch FROM clock_timestamp()) * 1000)::bigint{more})"
    )
}

/// `history`, a jsonb array, cut to its latest [`KEPT`] elements.
fn kept(history: &str) -> String {
    format!(
        "(SELECT coalesce(jsonb_agg(e ORDER BY i), '[]') FROM jsonb_array_elements({history})
              WITH ORDINALITY AS t(e, i)
          WHERE i > jsonb_array_length({history}) - {KEPT})"
    )
}

impl Sql {
    /// The statements for `schema`; releases are announced on `channel`.
    pub fn new(schema: &str, channel: &str) -> Sql {
        Sql {
            table: format!("{}.{}", quote_ident(schema), quote_ident(TABLE)),
            stopped: format!("{}.{}", quote_ident(schema), quote_ident(STOPPED)),
            agents: format!("{}.{}", quote_ident(schema), quote_ident(AGENTS)),
            schema: schema.to_string(),
            channel: channel.to_string(),
        }
    }

    /// The schema's name.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The schema-qualified table, quoted.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates the schema and the table if missing. Agents starting together
    /// take turns on a transaction-scoped advisory lock, since concurrent
    /// `CREATE … IF NOT EXISTS` can still fail on a unique index of the
    /// catalog. The batch is one implicit transaction, so the lock lasts for
    /// all of it and is gone at its end.
    pub fn ensure(&self) -> String {
        format!(
            "SELECT pg_advisory_xact_lock(hashtext({turn}));
             CREATE SCHEMA IF NOT EXISTS {schema};
             CREATE TABLE IF NOT EXISTS {table} (
                 key         text PRIMARY KEY,
                 state       text NOT NULL CHECK (state IN ('held', 'free')),
                 token       bigint NOT NULL CHECK (token > 0),
                 lease_id    text,
                 holder      jsonb,
                 ttl_ms      bigint NOT NULL,
                 grace_ms    bigint NOT NULL,
                 written     timestamptz NOT NULL,
                 forced_from bigint,
                 history     jsonb NOT NULL DEFAULT '[]'
             );
             -- A table made before the history was kept; older agents leave it as it is.
             ALTER TABLE {table} ADD COLUMN IF NOT EXISTS history jsonb NOT NULL DEFAULT '[]';
             -- A forced row: the holder and TTL of the lease it took over.
             ALTER TABLE {table} ADD COLUMN IF NOT EXISTS displaced jsonb;
             CREATE TABLE IF NOT EXISTS {stopped} (
                 key   text NOT NULL,
                 token bigint NOT NULL,
                 at    timestamptz NOT NULL DEFAULT now(),
                 PRIMARY KEY (key, token)
             );
             COMMENT ON TABLE {stopped} IS
                 'runlock: runs taken over with --force that have stopped, until their forcer reads it';
             COMMENT ON TABLE {table} IS
                 'runlock lock records, one row per key: written by runlockd, read them freely';
             CREATE TABLE IF NOT EXISTS {agents} (
                 agent_id text PRIMARY KEY,
                 report   text NOT NULL,
                 written  timestamptz NOT NULL DEFAULT now()
             );
             COMMENT ON TABLE {agents} IS
                 'runlock: each agent''s waiters and refusals, for listings across the fleet';",
            turn = quote_literal(&format!("runlock schema {}", self.schema)),
            schema = quote_ident(&self.schema),
            table = self.table,
            stopped = self.stopped,
            agents = self.agents,
        )
    }

    /// `LISTEN` for releases.
    pub fn listen(&self) -> String {
        format!("LISTEN {}", quote_ident(&self.channel))
    }

    /// Every statement.
    pub fn statements(&self) -> Statements {
        let table = &self.table;
        // Taken when the key is new, free, expired, forced, or already ours (an
        // earlier attempt of this same acquire landed but its answer was lost:
        // then the token stays). Otherwise the second branch reads the holder,
        // in the same round trip.
        let granted = event("'granted'", "CAST($3 AS jsonb)", "1", "");
        let next = "l.token + 1";
        let taken_over = event(
            "CASE WHEN $7 THEN 'broken' ELSE 'forced' END",
            "CAST($3 AS jsonb)",
            next,
            ", 'from_token', l.token",
        );
        let expired = event(
            "'expired'",
            "coalesce(l.holder, '{}')",
            "l.token",
            ", 'pid', 0, 'reason', 'not renewed for its TTL and grace, by the database''s clock'",
        );
        let granted_next = event("'granted'", "CAST($3 AS jsonb)", next, "");
        let history = kept(&format!(
            "l.history || CASE
                 WHEN l.lease_id = EXCLUDED.lease_id THEN '[]'::jsonb
                 WHEN l.state = 'held' AND {EXPIRES} > now() THEN jsonb_build_array({taken_over})
                 WHEN l.state = 'held' THEN jsonb_build_array({expired}, {granted_next})
                 ELSE jsonb_build_array({granted_next})
             END"
        ));
        let acquire = format!(
            "WITH taken AS (
                 INSERT INTO {table} AS l (key, state, token, lease_id, holder, ttl_ms, grace_ms,
                                           written, history)
                 VALUES ($1, 'held', 1, $2, CAST($3 AS jsonb) || jsonb_build_object('token', 1),
                         $4, $5, clock_timestamp(), jsonb_build_array({granted}))
                 ON CONFLICT (key) DO UPDATE SET
                     state = 'held',
                     token = CASE WHEN l.lease_id = EXCLUDED.lease_id THEN l.token ELSE l.token + 1 END,
                     lease_id = EXCLUDED.lease_id,
                     holder = CAST($3 AS jsonb) || jsonb_build_object('token',
                         CASE WHEN l.lease_id = EXCLUDED.lease_id THEN l.token ELSE l.token + 1 END),
                     ttl_ms = EXCLUDED.ttl_ms,
                     grace_ms = EXCLUDED.grace_ms,
                     written = clock_timestamp(),
                     forced_from = CASE
                         WHEN l.lease_id = EXCLUDED.lease_id THEN l.forced_from
                         WHEN l.state = 'held' AND {EXPIRES} > now() THEN l.token
                     END,
                     displaced = CASE
                         WHEN l.lease_id = EXCLUDED.lease_id THEN l.displaced
                         WHEN l.state = 'held' AND {EXPIRES} > now()
                         THEN jsonb_build_object('holder', l.holder, 'ttl_ms', l.ttl_ms)
                     END,
                     history = {history}
                 WHERE l.state = 'free' OR l.lease_id = EXCLUDED.lease_id OR $6
                    OR {EXPIRES} <= now()
                 RETURNING l.token, l.holder::text, l.displaced::text
             )
             SELECT true, token, holder, NULL::text, displaced FROM taken
             UNION ALL
             SELECT false, token, holder::text, history::text, NULL::text FROM {table}
             WHERE key = $1 AND NOT EXISTS (SELECT FROM taken)"
        );
        let renew = format!(
            "UPDATE {table} AS l SET written = clock_timestamp(), ttl_ms = $4, grace_ms = $5
             WHERE key = $1 AND lease_id = $2 AND token = $3 AND state = 'held'
               AND {EXPIRES} > now()
             RETURNING 1"
        );
        // NOTIFY inside the release's own statement: waiters hear of it once it commits.
        let ended = event("$4::text", "l.holder", "l.token", ", 'reason', $5::text");
        let ended = kept(&format!("l.history || jsonb_build_array({ended})"));
        let release = format!(
            "WITH freed AS (
                 UPDATE {table} AS l SET state = 'free', lease_id = NULL, holder = NULL,
                     forced_from = NULL, displaced = NULL, written = clock_timestamp(),
                     history = CASE WHEN $4::text IS NULL THEN l.history ELSE {ended} END
                 WHERE key = $1 AND lease_id = $2 AND token = $3 AND state = 'held'
                 RETURNING key
             )
             SELECT pg_notify({channel}, key) FROM freed",
            channel = quote_literal(&self.channel),
        );
        // A row as `inspect` reports it; `list` reads the same columns first.
        let shown = format!(
            "state, token, holder::text, {EXPIRES} <= now(),
             (extract(epoch FROM l.written + l.ttl_ms * interval '1 millisecond' - now())
              * 1000)::bigint,
             history::text"
        );
        let inspect = format!("SELECT {shown} FROM {table} AS l WHERE key = $1");
        // Byte order (collation "C"), whatever the database's: the order in
        // which a page starts after `$2`, and the agent's own. The escape is
        // `!`, not `\`, so that the pattern reads the same whatever
        // `standard_conforming_strings` says.
        let list = format!(
            "SELECT {shown}, key FROM {table} AS l
             WHERE key LIKE $1 ESCAPE '!' AND ($2 IS NULL OR key COLLATE \"C\" > $2)
             ORDER BY key COLLATE \"C\" LIMIT $3"
        );
        let history = format!("SELECT history::text FROM {table} WHERE key = $1");
        let adopted = event(
            "'adopted'",
            "jsonb_set(l.holder, '{agent_id}', to_jsonb($4::text))",
            "l.token",
            "",
        );
        let adopted = kept(&format!("l.history || jsonb_build_array({adopted})"));
        let adopt = format!(
            "UPDATE {table} AS l
             SET holder = jsonb_set(holder, '{{agent_id}}', to_jsonb($4::text)),
                 history = {adopted},
                 written = clock_timestamp()
             WHERE key = $1 AND lease_id = $2 AND token = $3 AND state = 'held'
               AND {EXPIRES} > now() AND l.holder -> 'uid' = to_jsonb($5::int8)
             RETURNING holder::text, ttl_ms"
        );
        // A word nobody read (its forcer gave up waiting) goes a day later.
        let stopped = format!(
            "WITH old AS (DELETE FROM {stopped} WHERE at < now() - interval '1 day')
             INSERT INTO {stopped} (key, token) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            stopped = self.stopped
        );
        let take_stopped = format!(
            "DELETE FROM {} WHERE key = $1 AND token = $2 RETURNING token",
            self.stopped
        );
        let check = format!(
            "SELECT l.key, l.state, l.token, l.lease_id, l.holder, l.ttl_ms, l.grace_ms,
                    l.written, l.forced_from, l.history, l.displaced, s.key, s.token, s.at
             FROM {table} AS l, {stopped} AS s WHERE false",
            stopped = self.stopped
        );
        let agents = &self.agents;
        let put_report = format!(
            "INSERT INTO {agents} (agent_id, report) VALUES ($1, $2)
             ON CONFLICT (agent_id) DO UPDATE SET report = EXCLUDED.report, written = now()"
        );
        let reports = format!("SELECT agent_id, report FROM {agents} ORDER BY agent_id");
        let remove_report = format!("DELETE FROM {agents} WHERE agent_id = $1");
        const KEY: &[T] = &[T::TEXT];
        const KEY_TOKEN: &[T] = &[T::TEXT, T::INT8];
        Statements {
            acquire: Statement::new(
                acquire,
                &[
                    T::TEXT,
                    T::TEXT,
                    T::TEXT,
                    T::INT8,
                    T::INT8,
                    T::BOOL,
                    T::BOOL,
                ],
            ),
            renew: Statement::new(renew, &[T::TEXT, T::TEXT, T::INT8, T::INT8, T::INT8]),
            release: Statement::new(release, &[T::TEXT, T::TEXT, T::INT8, T::TEXT, T::TEXT]),
            inspect: Statement::new(inspect, KEY),
            list: Statement::new(list, &[T::TEXT, T::TEXT, T::INT8]),
            history: Statement::new(history, KEY),
            adopt: Statement::new(adopt, &[T::TEXT, T::TEXT, T::INT8, T::TEXT, T::INT8]),
            stopped: Statement::new(stopped, KEY_TOKEN),
            take_stopped: Statement::new(take_stopped, KEY_TOKEN),
            check: Statement::new(check, &[]),
            put_report: Statement::new(put_report, &[T::TEXT, T::TEXT]),
            reports: Statement::new(reports, &[]),
            remove_report: Statement::new(remove_report, KEY),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_and_literals_are_quoted() {
        assert_eq!(quote_ident("run\"lock"), "\"run\"\"lock\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(Sql::new("runlock", "c").table(), "\"runlock\".\"locks\"");
    }

    #[test]
    fn a_prefix_pattern_escapes_wildcards_and_the_escape() {
        assert_eq!(like_prefix(""), "%");
        assert_eq!(like_prefix("dev:tap-a"), "dev:tap-a%");
        assert_eq!(like_prefix("50%_off!"), "50!%!_off!!%");
        assert_eq!(like_prefix("a\\b"), "a\\b%");
    }
}
