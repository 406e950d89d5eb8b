//! Meltano's own duplicate-run check, kept while pipelines move to runlock: a
//! key is not granted while Meltano's system database records a live
//! `RUNNING` run with that state ID (`runs.job_name`), since such a run is not
//! wrapped by runlock and so holds no lease (issue 5's migration guard).
//!
//! "Live" is Meltano's own rule (`meltano.core.job.job.Job.is_stale`): a run
//! with a heartbeat is stale once it is older than 5 minutes, one without once
//! it started more than 24 hours ago. Both columns are naive UTC, so the
//! comparison uses the database's clock, not the agent's.
//!
//! The check is a backend decorator, [`MeltanoGuard`], around the lease
//! store: it refuses an acquire with [`BackendError::HeldOutside`], which
//! carries the run as the peer is shown it, in this guard's words.
//!
//! The check and the grant are not atomic: a legacy `meltano run` that starts
//! between the two is not seen. That gap closes once every run is wrapped.

use crate::backend::forwarding::{Forwarding, Hooks};
use crate::backend::postgres::{Kept, Settings};
use crate::backend::{
    redact_uri, AcquireSpec, Backend, BackendError, BackendResult, Grant, Outsider,
    ProfiledBackend, StoreContext,
};
use async_trait::async_trait;
use runlock_protocol::{Holder, Key};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// The `host` of a holder that is a legacy Meltano run, not a runlock lease.
pub const HOLDER_HOST: &str = "meltano system database";
/// How long one check may take before the database counts as unavailable.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long SQLite waits for a writer (Meltano itself) to let go.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(1);

const SQLITE_QUERY: &str = "\
SELECT CASE typeof(run_id) WHEN 'blob' THEN lower(hex(run_id)) ELSE CAST(run_id AS TEXT) END,
       strftime('%Y-%m-%d %H:%M:%S', started_at),
       CAST(round((julianday(started_at) - 2440587.5) * 86400000) AS INTEGER)
FROM runs
WHERE job_name = ?1 AND state = 'RUNNING'
  AND CASE WHEN last_heartbeat_at IS NOT NULL
           THEN julianday(last_heartbeat_at) > julianday('now', '-5 minutes')
           ELSE julianday(started_at) > julianday('now', '-24 hours') END
ORDER BY started_at DESC
LIMIT 1";

const POSTGRES_QUERY: &str = "\
SELECT run_id::text,
       to_char(started_at, 'YYYY-MM-DD HH24:MI:SS'),
       (extract(epoch FROM started_at) * 1000)::bigint
FROM runs
WHERE job_name = $1 AND state::text = 'RUNNING'
  AND CASE WHEN last_heartbeat_at IS NOT NULL
           THEN last_heartbeat_at > (now() AT TIME ZONE 'utc') - interval '5 minutes'
           ELSE started_at > (now() AT TIME ZONE 'utc') - interval '24 hours' END
ORDER BY started_at DESC
LIMIT 1";

/// A `RUNNING` row of Meltano's system database that Meltano would not call
/// stale: a run that holds its state ID without a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyRun {
    /// Meltano's id of the run.
    pub run_id: String,
    /// When it started, if recorded.
    pub started_at_ms: Option<i64>,
    /// The run as a holder is shown to peers.
    pub holder: Holder,
}

impl LegacyRun {
    /// The run as the lease layer hands it to a refused peer.
    pub fn outsider(self) -> Outsider {
        Outsider {
            what: "a legacy Meltano run",
            explanation: explain(&self),
            holder: self.holder,
        }
    }
}

/// Meltano's system database, as `legacy_meltano_systemdb` names it.
pub struct MeltanoSystemDb {
    target: Target,
    /// The setting with any secret removed: the only form that is printed.
    shown: String,
}

enum Target {
    Sqlite(PathBuf),
    Postgres {
        /// Where and how to connect, as the backend reads a URI (`PG*`
        /// variables, TLS); holds the password, if any: never printed.
        settings: Box<Settings>,
        /// One connection, reused across checks, closed once idle and
        /// remade after an error.
        link: Kept,
    },
}

impl std::fmt::Debug for MeltanoSystemDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("MeltanoSystemDb").field(&self.shown).finish()
    }
}

impl MeltanoSystemDb {
    /// Reads the setting: `/path/meltano.db`, `sqlite:///path/meltano.db`, or
    /// a `postgresql://` URI (SQLAlchemy's `postgresql+DRIVER://` too).
    pub fn parse(setting: &str) -> Result<MeltanoSystemDb, String> {
        let shown = redact_uri(setting);
        if let Some(rest) = setting.strip_prefix("sqlite://") {
            // SQLAlchemy writes an absolute path with four slashes; take
            // three or four alike as absolute (the agent has no useful cwd).
            let path = format!("/{}", rest.trim_start_matches('/'));
            if path == "/" {
                return Err(format!("{shown:?} names no database file"));
            }
            return Ok(MeltanoSystemDb {
                target: Target::Sqlite(PathBuf::from(path)),
                shown,
            });
        }
        if let Some((scheme, rest)) = setting.split_once("://") {
            let base = scheme.split_once('+').map_or(scheme, |(base, _)| base);
            if base != "postgresql" && base != "postgres" {
                return Err(format!(
                    "{shown:?}: scheme {scheme:?} is not supported \
                     (use a SQLite path, sqlite:///PATH or postgresql://...)"
                ));
            }
            let uri = format!("postgresql://{rest}");
            let settings = Settings::from_uri(&uri, Some(CHECK_TIMEOUT))
                .map_err(|err| format!("{shown:?} is not a usable PostgreSQL URI: {err}"))?;
            return Ok(MeltanoSystemDb {
                target: Target::Postgres {
                    settings: Box::new(settings),
                    link: Kept::default(),
                },
                shown,
            });
        }
        if !setting.starts_with('/') {
            return Err(format!(
                "{shown:?} is not an absolute path (nor a sqlite:// or postgresql:// URI)"
            ));
        }
        Ok(MeltanoSystemDb {
            target: Target::Sqlite(PathBuf::from(setting)),
            shown,
        })
    }

    /// The setting with any secret removed.
    pub fn describe(&self) -> &str {
        &self.shown
    }

    /// `HeldOutside` if Meltano records `key` as running, `Unavailable`
    /// if the database cannot be read; a connection's tasks run in `context`.
    pub async fn check(&self, key: &Key, context: &StoreContext) -> BackendResult<()> {
        let found = match tokio::time::timeout(CHECK_TIMEOUT, self.find(key, context)).await {
            Ok(found) => found,
            Err(_) => Err(format!("no answer within {}s", CHECK_TIMEOUT.as_secs())),
        };
        match found {
            Ok(None) => Ok(()),
            Ok(Some(run)) => Err(BackendError::HeldOutside(Box::new(run.outsider()))),
            Err(problem) => {
                tracing::warn!(systemdb = %self.shown, key = %key, "cannot read Meltano's system database: {problem}");
                Err(BackendError::Unavailable(format!(
                    "cannot check Meltano's system database {} for a running {key:?}: {problem}",
                    self.shown
                )))
            }
        }
    }

    async fn find(&self, key: &Key, context: &StoreContext) -> Result<Option<LegacyRun>, String> {
        match &self.target {
            Target::Sqlite(path) => {
                let (path, key) = (path.clone(), key.to_string());
                tokio::task::spawn_blocking(move || find_sqlite(&path, &key))
                    .await
                    .map_err(|err| format!("the check failed: {err}"))?
            }
            Target::Postgres { settings, link } => {
                find_postgres(settings, link, key.as_str(), context).await
            }
        }
    }
}

/// Opens the file read-only per check: simple, and never creates it.
fn find_sqlite(path: &std::path::Path, key: &str) -> Result<Option<LegacyRun>, String> {
    use rusqlite::{OpenFlags, OptionalExtension};
    if !path.exists() {
        return Err(format!("{} does not exist", path.display()));
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let db = rusqlite::Connection::open_with_flags(path, flags)
        .map_err(|err| format!("opening {}: {err}", path.display()))?;
    db.busy_timeout(SQLITE_BUSY_TIMEOUT)
        .map_err(|err| format!("{}: {err}", path.display()))?;
    db.query_row(SQLITE_QUERY, [key], |row| {
        let run_id = row.get::<_, Option<String>>(0)?.unwrap_or_default();
        Ok(legacy_run(run_id, row.get(2)?))
    })
    .optional()
    .map_err(|err| format!("reading the runs table in {}: {err}", path.display()))
}

async fn find_postgres(
    settings: &Settings,
    kept: &Kept,
    key: &str,
    context: &StoreContext,
) -> Result<Option<LegacyRun>, String> {
    let link = kept.get(context, || settings.link(context)).await?;
    // Unnamed (one round trip, nothing prepared): it works through a pooler too.
    let rows = link
        .client
        .query_typed(POSTGRES_QUERY, &[(&key, tokio_postgres::types::Type::TEXT)])
        .await;
    let row = match rows {
        Ok(rows) => rows.into_iter().next(),
        Err(err) => {
            kept.forget(&link).await; // reconnect next time
            return Err(format!("reading the runs table: {err}"));
        }
    };
    Ok(row.map(|row| {
        legacy_run(
            row.get::<_, Option<String>>(0).unwrap_or_default(),
            row.get(2),
        )
    }))
}

/// The run, and the holder peers are shown for it.
fn legacy_run(run_id: String, started_at_ms: Option<i64>) -> LegacyRun {
    let holder = Holder {
        slot: None,
        slots: None,
        host: HOLDER_HOST.to_string(),
        agent_id: String::new(),
        pid: 0,
        uid: 0,
        gid: 0,
        user: String::new(),
        command: format!("meltano run {run_id} (legacy, not wrapped by runlock)"),
        acquired_at_ms: started_at_ms
            .and_then(|ms| u64::try_from(ms).ok())
            .unwrap_or(0),
        token: 0,
    };
    LegacyRun {
        run_id,
        started_at_ms,
        holder,
    }
}

/// What a peer refused for `run` is told after "key … is held": who holds
/// it, and what to do.
fn explain(run: &LegacyRun) -> String {
    let since = match run.holder.acquired_at_ms {
        0 => "an unknown time".to_string(),
        ms => {
            let at = UNIX_EPOCH + Duration::from_millis(ms);
            humantime::format_rfc3339_seconds(at).to_string()
        }
    };
    format!(
        "by a Meltano run recorded as RUNNING in the system database since {since} \
         (run id {}), not wrapped by runlock; wait for it to end, or pass --force \
         if it is gone",
        run.run_id
    )
}

/// What a guarded backend does in front of the store's: it refuses a key
/// while Meltano's system database records a live run of it, unless the
/// acquire forces the key (as `meltano run --force` skips Meltano's own
/// check); everything else goes to the store, unchanged.
pub struct MeltanoGuard {
    db: Arc<MeltanoSystemDb>,
    context: StoreContext,
}

impl MeltanoGuard {
    /// `store`'s backend, guarded by `db`, whose connection's tasks run in
    /// `context`; what the store is stays as it was.
    pub fn wrap(
        store: ProfiledBackend,
        db: Arc<MeltanoSystemDb>,
        context: &StoreContext,
    ) -> ProfiledBackend {
        Arc::new(Forwarding {
            inner: store,
            hooks: MeltanoGuard {
                db,
                context: context.clone(),
            },
        })
        .into()
    }
}

#[async_trait]
impl Hooks for MeltanoGuard {
    async fn acquire(&self, inner: &dyn Backend, spec: &AcquireSpec) -> BackendResult<Grant> {
        if !spec.force {
            self.db.check(&spec.key, &self.context).await?;
        }
        inner.acquire(spec).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_never_show_a_password() {
        for (setting, path) in [
            ("/p/meltano.db", "/p/meltano.db"),
            ("sqlite:///p/meltano.db", "/p/meltano.db"),
            ("sqlite:////p/meltano.db", "/p/meltano.db"),
        ] {
            let db = MeltanoSystemDb::parse(setting).expect(setting);
            assert!(matches!(&db.target, Target::Sqlite(p) if p == std::path::Path::new(path)));
        }
        let db = MeltanoSystemDb::parse("postgresql+psycopg://u:pa55@db:5432/meltano")
            .expect("postgres");
        assert!(matches!(&db.target, Target::Postgres { settings, .. }
            if settings.dbname() == "meltano" && settings.user() == "u"));
        assert!(!db.describe().contains("pa55"));
        assert!(!format!("{db:?}").contains("pa55"));
        for bad in ["meltano.db", "sqlite://", "mysql://u:pa55@db/m"] {
            let err = MeltanoSystemDb::parse(bad).expect_err(bad);
            assert!(!err.contains("pa55"), "{err}");
        }
    }

    #[test]
    fn a_legacy_run_is_explained() {
        let explained = explain(&legacy_run("0b1c".to_string(), Some(1_000)));
        assert!(explained.contains("run id 0b1c"), "{explained}");
        assert!(explained.contains("1970-01-01T00:00:01Z"), "{explained}");
        let unknown = explain(&legacy_run("0b1c".to_string(), None));
        assert!(unknown.contains("since an unknown time"), "{unknown}");
    }

    #[test]
    fn a_legacy_run_is_named_after_the_held_text() {
        let outsider = legacy_run("0b1c".to_string(), Some(1_000)).outsider();
        assert_eq!(outsider.holder.host, HOLDER_HOST);
        assert_eq!(
            outsider.holder.command,
            "meltano run 0b1c (legacy, not wrapped by runlock)"
        );
        assert_eq!(outsider.holder.acquired_at_ms, 1_000);
        // As the lease layer words a refusal by a holder that is no lease.
        let held = crate::lease::LeaseError::Held {
            holders: Vec::new(),
            slots: 1,
            key: Key::new("k").expect("valid"),
            waited: Duration::ZERO,
            holder: Some(Box::new(outsider.holder)),
            unrecorded: Some(outsider.explanation),
            incident: None,
        };
        assert_eq!(
            held.to_string(),
            "key \"k\" is held: by a Meltano run recorded as RUNNING in the system database \
             since 1970-01-01T00:00:01Z (run id 0b1c), not wrapped by runlock; wait for it \
             to end, or pass --force if it is gone"
        );
        assert_eq!(
            BackendError::HeldOutside(Box::new(legacy_run("0b1c".to_string(), None).outsider()))
                .to_string(),
            "held by a legacy Meltano run"
        );
    }
}
