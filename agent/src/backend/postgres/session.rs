//! The backend's connection: made on first use (creating the schema and
//! table when a statement finds them missing), `LISTEN`ing for releases
//! unless a pooler is in front, closed once idle (`link.rs`), remade after
//! it drops. Every operation runs through [`Session::run`], which bounds it
//! in time and retries transient failures on a fresh connection.

use super::errors::{classify, denied, missing_table, Failure};
use super::link::{InUse, Kept, Link};
use super::settings::Settings;
use super::sql::{Sql, Statements};
use crate::backend::retry::{RetryBudget, TIMEOUTS, TRANSIENT};
use crate::backend::StoreContext;
use futures::StreamExt;
use runlock_protocol::Key;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_postgres::AsyncMessage;

/// The server gives up on a statement after this long (a row lock held by a stuck session).
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(3);
/// Release notices that may wait for a slow waiter before it misses some (and polls).
const NOTICE_BACKLOG: usize = 256;

/// The backend's connection, and what it needs to remake it.
pub struct Session {
    settings: Settings,
    sql: Sql,
    statements: Arc<Statements>,
    /// `LISTEN` for releases: as the options say, or, when they are silent,
    /// unless a pooler is in front (its connections are not ours to keep).
    listen: Option<bool>,
    link: Kept,
    released: broadcast::Sender<Key>,
    sent: AtomicU64,
    /// Where the connection's driver and idle close run; told of overload.
    context: StoreContext,
}

impl Session {
    /// A session that connects on first use, in `context`; `listen` as the
    /// options say.
    pub fn new(
        settings: Settings,
        sql: Sql,
        listen: Option<bool>,
        context: &StoreContext,
    ) -> Session {
        Session {
            settings,
            statements: Arc::new(sql.statements()),
            sql,
            listen,
            link: Kept::default(),
            released: broadcast::channel(NOTICE_BACKLOG).0,
            sent: AtomicU64::new(0),
            context: context.clone(),
        }
    }

    /// Whether connections `LISTEN` for releases (known once connected).
    fn listens(&self) -> bool {
        self.listen.unwrap_or(!self.settings.behind_pooler())
    }

    /// Keys released through any agent, as the server announces them; `None`
    /// when this session does not listen.
    pub fn releases(&self) -> Option<broadcast::Receiver<Key>> {
        self.release_sender().map(|sender| sender.subscribe())
    }

    /// Where [`Session::releases`] come from, for the backend's profile.
    pub fn release_sender(&self) -> Option<broadcast::Sender<Key>> {
        (self.listen != Some(false)).then(|| self.released.clone())
    }

    /// Statements sent by operations so far (not counting connection set-up).
    pub fn statements_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Connects and checks the table (creating it if missing): the start-up check.
    pub async fn connect_now(&self) -> Result<(), String> {
        let check = self
            .run(|link, statements| async move { statements.check.query(&link.client, &[]).await });
        match tokio::time::timeout(TIMEOUTS.operation, check).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(message)) => Err(message),
            Err(_) => Err(format!(
                "PostgreSQL at {} did not answer within {}s",
                self.settings.shown(),
                TIMEOUTS.operation.as_secs()
            )),
        }
    }

    /// Runs `op` on a live connection within `TIMEOUTS.operation`, each try on
    /// a fresh connection if the last one failed: at most [`TRANSIENT`]'s tries,
    /// but a server that is only out of connections (SQLSTATE class 53) is
    /// tried again until the time is up; no try starts that a pause would
    /// push past it. A statement that finds the table
    /// missing creates it and tries again. Returns the result and when the
    /// successful statement was sent.
    pub async fn run<T, F, Fut>(&self, op: F) -> Result<(T, Instant), String>
    where
        F: Fn(InUse, Arc<Statements>) -> Fut,
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let deadline = Instant::now() + TIMEOUTS.operation;
        let op = &op;
        let ran = UNTIL_THE_DEADLINE
            .run_paced(
                Some(deadline),
                |_| async move {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let bound = left.min(TIMEOUTS.attempt);
                    let link = match tokio::time::timeout(bound, self.link()).await {
                        Ok(Ok(link)) => link,
                        Ok(Err((Failure::Refused(message), _))) => {
                            return Err(Tried::Stop(message))
                        }
                        Ok(Err((failure, overloaded))) => {
                            return Err(Tried::Again {
                                why: failure.message(),
                                overloaded,
                            })
                        }
                        Err(_) => return Err(Tried::again(self.no_answer(bound))),
                    };
                    self.sent.fetch_add(1, Ordering::Relaxed);
                    let sent = Instant::now();
                    let used = Arc::clone(&link);
                    let answer =
                        tokio::time::timeout(bound, op(link, self.statements.clone())).await;
                    match answer {
                        Ok(Ok(value)) => Ok((value, sent)),
                        Ok(Err(err)) if missing_table(&err) => match self.ensure().await {
                            Ok(()) => Err(Tried::again(self.explain(&err).message())),
                            Err(failure) => Err(Tried::Stop(failure.message())),
                        },
                        Ok(Err(err)) => {
                            let failure = self.explain(&err);
                            if !failure.is_transient() {
                                return Err(Tried::Stop(failure.message()));
                            }
                            self.link.forget(&used).await;
                            Err(Tried::Again {
                                why: failure.message(),
                                overloaded: overloaded(&err),
                            })
                        }
                        Err(_) => {
                            self.link.forget(&used).await;
                            Err(Tried::again(self.no_answer(bound)))
                        }
                    }
                },
                |tried, count| match tried {
                    Tried::Again { overloaded, .. }
                        if count < TRANSIENT.attempts || *overloaded =>
                    {
                        Some(TRANSIENT.pause(count))
                    }
                    _ => None,
                },
            )
            .await;
        ran.map_err(|tried| match tried {
            Tried::Stop(why) | Tried::Again { why, .. } => why,
        })
    }

    fn no_answer(&self, within: Duration) -> String {
        format!(
            "PostgreSQL at {} did not answer within {:.1}s",
            self.settings.shown(),
            within.as_secs_f64()
        )
    }

    /// Classifies `err`, with what this role lacks when it was refused permission.
    fn explain(&self, err: &tokio_postgres::Error) -> Failure {
        let failure = classify(err, &self.settings, self.context.observer.as_ref());
        if !denied(err) {
            return failure;
        }
        Failure::Refused(format!(
            "{}: role {:?} needs USAGE on schema {} and SELECT, INSERT, UPDATE on {} \
             (or CREATE on database {:?}, to create them)",
            failure.message(),
            self.settings.user(),
            super::sql::quote_ident(self.sql.schema()),
            self.sql.table(),
            self.settings.dbname(),
        ))
    }

    /// The current connection, or a new one; a failure says whether the
    /// server is out of connections.
    async fn link(&self) -> Result<InUse, (Failure, bool)> {
        self.link.get(&self.context, || self.connect()).await
    }

    async fn connect(&self) -> Result<Link, (Failure, bool)> {
        let failed = |err: tokio_postgres::Error| (self.explain(&err), overloaded(&err));
        let (client, connection) = self.settings.connect().await.map_err(failed)?;
        // Dropping the client on an error below ends the connection and its driver.
        let driver = self
            .context
            .spawn_until_closing(drive(connection, self.released.clone()))
            .abort_handle();
        if self.listens() {
            client
                .batch_execute(&self.sql.listen())
                .await
                .map_err(failed)?;
        }
        Ok(Link::new(client, driver))
    }

    /// Creates the schema and the table, or what they lack.
    async fn ensure(&self) -> Result<(), Failure> {
        let link = self.link().await.map_err(|(failure, _)| failure)?;
        link.client
            .batch_execute(&self.sql.ensure())
            .await
            .map_err(|err| self.explain(&err))?;
        tracing::info!(table = %self.sql.table(), "created (or completed) the lock table");
        Ok(())
    }
}

/// [`TRANSIENT`]'s pauses, for as many tries as the time allows: how many
/// [`Session::run`] makes is its own to decide.
const UNTIL_THE_DEADLINE: RetryBudget = RetryBudget {
    attempts: u32::MAX,
    ..TRANSIENT
};

/// How one try of [`Session::run`] failed.
enum Tried {
    /// No other try will mend it.
    Stop(String),
    /// Another may work: within [`TRANSIENT`]'s tries, or, when the
    /// server is only `overloaded` (out of connections), until the time is up.
    Again { why: String, overloaded: bool },
}

impl Tried {
    fn again(why: String) -> Tried {
        Tried::Again {
            why,
            overloaded: false,
        }
    }
}

/// Whether the server is out of connections or memory (SQLSTATE class 53):
/// another try, once others have let theirs go, will do.
fn overloaded(err: &tokio_postgres::Error) -> bool {
    err.code().is_some_and(|code| code.code().starts_with("53"))
}

/// Drives a connection until it ends, passing on the keys `NOTIFY` names.
async fn drive<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    released: broadcast::Sender<Key>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite + Unpin,
{
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    while let Some(message) = messages.next().await {
        match message {
            Ok(AsyncMessage::Notification(notice)) => {
                if let Ok(key) = Key::parse_record(notice.payload()) {
                    let _ = released.send(key); // nobody waiting is fine
                }
            }
            Ok(_) => {}
            Err(err) => {
                tracing::debug!("PostgreSQL connection ended: {err}");
                return;
            }
        }
    }
}
