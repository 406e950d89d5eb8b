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
//!
//! A held row is expired once the database's `now()` has passed `written +
//! ttl_ms + grace_ms`; no agent's clock is ever consulted. Writes stamp
//! `clock_timestamp()` and checks read `now()` (the statement's start): both
//! err toward a later expiry.

use tokio_postgres::types::Type as T;
use tokio_postgres::{Client, Statement};

/// The name of the table inside the schema.
pub const TABLE: &str = "locks";

/// `ident` as a quoted SQL identifier.
pub fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// `text` as a quoted SQL string literal.
pub fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The statements of one schema.
#[derive(Debug, Clone)]
pub struct Sql {
    table: String,
    schema: String,
    channel: String,
}

/// The statements, prepared on one connection.
pub struct Prepared {
    /// `$1 key, $2 lease_id, $3 holder json, $4 ttl_ms, $5 grace_ms, $6 force` →
    /// `(taken bool, token bigint, holder text)`: the taken row, or the holder's row.
    pub acquire: Statement,
    /// `$1 key, $2 lease_id, $3 token, $4 ttl_ms, $5 grace_ms` → rows affected.
    pub renew: Statement,
    /// `$1 key, $2 lease_id, $3 token` → one row if it freed the key.
    pub release: Statement,
    /// `$1 key` → `(state, token, holder, expired, expires_in_ms)`, or no row.
    pub inspect: Statement,
    /// `$1 key, $2 lease_id, $3 token, $4 agent_id` → `(holder, ttl_ms)` if adopted.
    pub adopt: Statement,
}

/// When a held row stops protecting its holder, by the database's clock.
const EXPIRES: &str = "l.written + (l.ttl_ms + l.grace_ms) * interval '1 millisecond'";

impl Sql {
    /// The statements for `schema`; releases are announced on `channel`.
    pub fn new(schema: &str, channel: &str) -> Sql {
        Sql {
            table: format!("{}.{}", quote_ident(schema), quote_ident(TABLE)),
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
                 forced_from bigint
             );
             COMMENT ON TABLE {table} IS
                 'runlock lock records, one row per key: written by runlockd, read them freely';",
            turn = quote_literal(&format!("runlock schema {}", self.schema)),
            schema = quote_ident(&self.schema),
            table = self.table,
        )
    }

    /// `LISTEN` for releases.
    pub fn listen(&self) -> String {
        format!("LISTEN {}", quote_ident(&self.channel))
    }

    /// Prepares every statement on `client` (pipelined: one wait, not five).
    pub async fn prepare(&self, client: &Client) -> Result<Prepared, tokio_postgres::Error> {
        let table = &self.table;
        // Taken when the key is new, free, expired, forced, or already ours (an
        // earlier attempt of this same acquire landed but its answer was lost:
        // then the token stays). Otherwise the second branch reads the holder,
        // in the same round trip.
        let acquire = format!(
            "WITH taken AS (
                 INSERT INTO {table} AS l (key, state, token, lease_id, holder, ttl_ms, grace_ms, written)
                 VALUES ($1, 'held', 1, $2, CAST($3 AS jsonb) || jsonb_build_object('token', 1),
                         $4, $5, clock_timestamp())
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
                     END
                 WHERE l.state = 'free' OR l.lease_id = EXCLUDED.lease_id OR $6
                    OR {EXPIRES} <= now()
                 RETURNING l.token, l.holder::text
             )
             SELECT true, token, holder FROM taken
             UNION ALL
             SELECT false, token, holder::text FROM {table}
             WHERE key = $1 AND NOT EXISTS (SELECT FROM taken)"
        );
        let renew = format!(
            "UPDATE {table} AS l SET written = clock_timestamp(), ttl_ms = $4, grace_ms = $5
             WHERE key = $1 AND lease_id = $2 AND token = $3 AND state = 'held'
               AND {EXPIRES} > now()"
        );
        // NOTIFY inside the release's own statement: waiters hear of it once it commits.
        let release = format!(
            "WITH freed AS (
                 UPDATE {table} SET state = 'free', lease_id = NULL, holder = NULL,
                     forced_from = NULL, written = clock_timestamp()
                 WHERE key = $1 AND lease_id = $2 AND token = $3 AND state = 'held'
                 RETURNING key
             )
             SELECT pg_notify({channel}, key) FROM freed",
            channel = quote_literal(&self.channel),
        );
        let inspect = format!(
            "SELECT state, token, holder::text, {EXPIRES} <= now(),
                    (extract(epoch FROM l.written + l.ttl_ms * interval '1 millisecond' - now())
                     * 1000)::bigint
             FROM {table} AS l WHERE key = $1"
        );
        let adopt = format!(
            "UPDATE {table} AS l
             SET holder = jsonb_set(holder, '{{agent_id}}', to_jsonb($4::text)),
                 written = clock_timestamp()
             WHERE key = $1 AND lease_id = $2 AND token = $3 AND state = 'held'
               AND {EXPIRES} > now()
             RETURNING holder::text, ttl_ms"
        );
        let types = (
            [T::TEXT, T::TEXT, T::TEXT, T::INT8, T::INT8, T::BOOL],
            [T::TEXT, T::TEXT, T::INT8, T::INT8, T::INT8],
            [T::TEXT, T::TEXT, T::INT8],
            [T::TEXT],
            [T::TEXT, T::TEXT, T::INT8, T::TEXT],
        );
        let (acquire, renew, release, inspect, adopt) = futures::try_join!(
            client.prepare_typed(&acquire, &types.0),
            client.prepare_typed(&renew, &types.1),
            client.prepare_typed(&release, &types.2),
            client.prepare_typed(&inspect, &types.3),
            client.prepare_typed(&adopt, &types.4),
        )?;
        Ok(Prepared {
            acquire,
            renew,
            release,
            inspect,
            adopt,
        })
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
}
