//! One connection to the server, kept up: made on first use (creating the
//! schema and table if missing), its statements prepared, `LISTEN`ing for
//! releases; remade after it drops. Every operation runs through
//! [`Session::run`], which bounds it in time and retries transient failures on
//! a fresh connection.

use super::errors::{classify, denied, missing_table, Failure};
use super::settings::Settings;
use super::sql::{Prepared, Sql};
use crate::backend::retry::{RetryBudget, TIMEOUTS};
use futures::StreamExt;
use runlock_protocol::Key;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_postgres::{AsyncMessage, Client};

/// The server gives up on a statement after this long (a row lock held by a stuck session).
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(3);
/// Attempts per operation (connecting, or one statement, each within
/// `TIMEOUTS.attempt`), and the pauses between them.
const RETRY: RetryBudget = RetryBudget {
    attempts: 4,
    first_pause: Duration::from_millis(50),
    longest_pause: Duration::from_millis(800),
};
/// Release notices that may wait for a slow waiter before it misses some (and polls).
const NOTICE_BACKLOG: usize = 256;

/// A live connection and its prepared statements.
pub struct Link {
    /// The client.
    pub client: Client,
    /// The statements, prepared on this connection.
    pub statements: Prepared,
    /// The task that drives the connection: stopped with the link, so a
    /// connection to a server that stopped answering does not linger.
    driver: tokio::task::AbortHandle,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// The backend's connection, and what it needs to remake it.
pub struct Session {
    settings: Settings,
    sql: Sql,
    listen: bool,
    link: tokio::sync::Mutex<Option<Arc<Link>>>,
    released: broadcast::Sender<Key>,
    statements: AtomicU64,
}

impl Session {
    /// A session that connects on first use; with `listen`, it hears releases.
    pub fn new(settings: Settings, sql: Sql, listen: bool) -> Session {
        Session {
            settings,
            sql,
            listen,
            link: tokio::sync::Mutex::new(None),
            released: broadcast::channel(NOTICE_BACKLOG).0,
            statements: AtomicU64::new(0),
        }
    }

    /// Keys released through any agent, as the server announces them; `None`
    /// when this session does not listen.
    pub fn releases(&self) -> Option<broadcast::Receiver<Key>> {
        self.release_sender().map(|sender| sender.subscribe())
    }

    /// Where [`Session::releases`] come from, for the backend's profile.
    pub fn release_sender(&self) -> Option<broadcast::Sender<Key>> {
        self.listen.then(|| self.released.clone())
    }

    /// Statements sent by operations so far (not counting connection set-up).
    pub fn statements_sent(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }

    /// Connects now if not connected: the start-up check.
    pub async fn connect_now(&self) -> Result<(), String> {
        match tokio::time::timeout(TIMEOUTS.operation, self.link()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(failure)) => Err(failure.message()),
            Err(_) => Err(format!(
                "PostgreSQL at {} did not answer within {}s",
                self.settings.shown(),
                TIMEOUTS.operation.as_secs()
            )),
        }
    }

    /// Runs `op` on a live connection: at most [`RETRY`]'s tries within
    /// `TIMEOUTS.operation`, each on a fresh connection if the last one
    /// failed. Returns the result and when the successful statement was sent.
    pub async fn run<T, F, Fut>(&self, op: F) -> Result<(T, Instant), String>
    where
        F: Fn(Arc<Link>) -> Fut,
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let deadline = Instant::now() + TIMEOUTS.operation;
        let mut last = String::new();
        for attempt in 0..RETRY.attempts {
            if attempt > 0 {
                RETRY.wait(attempt).await;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let bound = left.min(TIMEOUTS.attempt);
            let link = match tokio::time::timeout(bound, self.link()).await {
                Ok(Ok(link)) => link,
                Ok(Err(Failure::Refused(message))) => return Err(message),
                Ok(Err(Failure::Transient(message))) => {
                    last = message;
                    continue;
                }
                Err(_) => {
                    last = self.no_answer(bound);
                    continue;
                }
            };
            self.statements.fetch_add(1, Ordering::Relaxed);
            let sent = Instant::now();
            match tokio::time::timeout(bound, op(link.clone())).await {
                Ok(Ok(value)) => return Ok((value, sent)),
                Ok(Err(err)) => {
                    let failure = self.explain(&err);
                    if !failure.is_transient() {
                        return Err(failure.message());
                    }
                    last = failure.message();
                    self.forget(&link).await;
                }
                Err(_) => {
                    last = self.no_answer(bound);
                    self.forget(&link).await;
                }
            }
        }
        Err(last)
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
        let failure = classify(err, &self.settings);
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

    /// Drops `link` if it is still the current one, so the next attempt reconnects.
    async fn forget(&self, link: &Arc<Link>) {
        let mut slot = self.link.lock().await;
        if slot
            .as_ref()
            .is_some_and(|current| Arc::ptr_eq(current, link))
        {
            *slot = None;
        }
    }

    /// The current connection, or a new one.
    async fn link(&self) -> Result<Arc<Link>, Failure> {
        let mut slot = self.link.lock().await;
        if let Some(link) = slot.as_ref().filter(|l| !l.client.is_closed()) {
            return Ok(link.clone());
        }
        *slot = None;
        let link = Arc::new(self.connect().await?);
        *slot = Some(link.clone());
        Ok(link)
    }

    async fn connect(&self) -> Result<Link, Failure> {
        let (client, connection) = self
            .settings
            .connect()
            .await
            .map_err(|err| self.explain(&err))?;
        // Dropping the client on an error below ends the connection and its driver.
        let driver = tokio::spawn(drive(connection, self.released.clone())).abort_handle();
        let statements = match self.sql.prepare(&client).await {
            Ok(statements) => statements,
            Err(err) if missing_table(&err) => {
                client
                    .batch_execute(&self.sql.ensure())
                    .await
                    .map_err(|err| self.explain(&err))?;
                tracing::info!(table = %self.sql.table(), "created (or completed) the lock table");
                self.sql
                    .prepare(&client)
                    .await
                    .map_err(|err| self.explain(&err))?
            }
            Err(err) => return Err(self.explain(&err)),
        };
        if self.listen {
            client
                .batch_execute(&self.sql.listen())
                .await
                .map_err(|err| self.explain(&err))?;
        }
        Ok(Link {
            client,
            statements,
            driver,
        })
    }
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
