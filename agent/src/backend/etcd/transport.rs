//! The connection to etcd, made at first use and kept: each request bounded
//! in time and retried while etcd cannot be reached, and the watch that
//! reports released keys.

use super::errors::{LeaseGone, Problem};
use super::record::EtcdRecord;
use super::rpc::{self, Client, Watch};
use super::watched::Watched;
use crate::backend::retry::{RetryBudget, TIMEOUTS, TRANSIENT};
use crate::backend::{BackendResult, Secret};
use runlock_protocol::Key;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tonic::transport::ClientTlsConfig;

/// The pauses between attempts to watch again after a failure.
const REWATCH: RetryBudget = RetryBudget {
    attempts: u32::MAX,
    first_pause: Duration::from_millis(200),
    longest_pause: Duration::from_millis(6400),
};
/// HTTP/2 pings find a dead connection (the watch's, above all); etcd refuses
/// pings more often than every 5 s.
const PING_INTERVAL: Duration = Duration::from_secs(10);
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// The client, made at first use (with authentication, making it is a request).
pub(super) struct Connection {
    pub(super) endpoints: Vec<String>,
    pub(super) user: Option<(String, Secret)>,
    pub(super) client: tokio::sync::Mutex<Option<Client>>,
    /// `None` for plain HTTP.
    pub(super) tls: Option<ClientTlsConfig>,
    /// `etcd at host:port,…`, for messages.
    pub(super) place: String,
    pub(super) prefix: String,
}
impl Connection {
    pub(super) async fn client(&self) -> Result<Client, rpc::Error> {
        let mut slot = self.client.lock().await;
        if let Some(client) = slot.as_ref() {
            return Ok(client.clone());
        }
        let client = Client::connect(rpc::Settings {
            endpoints: &self.endpoints,
            tls: self.tls.as_ref(),
            user: self.user.as_ref(),
            connect_timeout: TIMEOUTS.connect,
            timeout: TIMEOUTS.attempt,
            keep_alive: (PING_INTERVAL, PING_TIMEOUT),
        })
        .await?;
        *slot = Some(client.clone());
        Ok(client)
    }

    pub(super) fn who(&self) -> String {
        match &self.user {
            Some((user, _)) => format!("user {user:?}"),
            None => "a client without a user".to_string(),
        }
    }

    /// One request, attempted again (a bounded number of times) while etcd
    /// cannot be reached. Every request here may be repeated safely: a write
    /// whose answer was lost is recognised when it is read back.
    pub(super) async fn call<T, F, Fut>(&self, request: F) -> Result<T, Problem>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, rpc::Error>>,
    {
        let request = &request;
        TRANSIENT
            .run(
                |_| async move {
                    let answer = tokio::time::timeout(TIMEOUTS.attempt, async {
                        let client = self.client().await?;
                        request(client).await
                    })
                    .await;
                    match answer {
                        Ok(Ok(value)) => Ok(value),
                        Ok(Err(err)) => Err(self.classify(err)),
                        Err(_) => Err(Problem::Transient(format!(
                            "no answer within {} s",
                            TIMEOUTS.attempt.as_secs()
                        ))),
                    }
                },
                |problem| matches!(problem, Problem::Transient(_)),
            )
            .await
    }

    /// [`call`](Self::call), a failure said as the store being unavailable.
    pub(super) async fn request<T, F, Fut>(&self, request: F) -> BackendResult<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, rpc::Error>>,
    {
        self.call(request).await.map_err(|p| self.unavailable(p))
    }
}

/// Reports every key deleted under the prefix (released, expired or forced
/// out) until `stop`, to waiters (`released`) and to `watched` (the keys
/// this agent holds), reconnecting with backoff; after a gap it resumes from
/// the revision it last saw, so no release is missed unless etcd compacted it.
pub(super) async fn watch_releases(
    connection: Arc<Connection>,
    released: broadcast::Sender<Key>,
    watched: Arc<Watched>,
    stop: CancellationToken,
) {
    let mut next_revision = 0;
    let mut failures: u32 = 0;
    loop {
        let watching = tokio::select! {
            _ = stop.cancelled() => return,
            watching = watch_once(&connection, &released, &watched, &mut next_revision, &mut failures) =>
                watching,
        };
        watched.down();
        match watching {
            Ok(()) => {}
            Err(why) => {
                if failures == 0 {
                    tracing::warn!(
                        backend = %connection.place,
                        "watching for released keys failed ({why}); waiters poll until it is back"
                    );
                }
                failures += 1;
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = REWATCH.wait(failures) => {}
        }
    }
}

async fn watch_once(
    connection: &Connection,
    released: &broadcast::Sender<Key>,
    watched: &Watched,
    next_revision: &mut i64,
    failures: &mut u32,
) -> Result<(), String> {
    let describe = |err: rpc::Error| match connection.classify(err) {
        Problem::Transient(why) | Problem::Refused(why) => why,
        Problem::Expected(LeaseGone) => "lease gone".to_string(),
    };
    let watch = Watch::deletions_under(connection.prefix.as_str(), *next_revision);
    let mut stream = tokio::time::timeout(TIMEOUTS.attempt, async {
        let client = connection.client().await?;
        client.watch(watch).await
    })
    .await
    .map_err(|_| format!("no answer within {} s", TIMEOUTS.attempt.as_secs()))?
    .map_err(describe)?;
    while let Some(answer) = stream
        .message()
        .await
        .map_err(|status| describe(status.into()))?
    {
        if answer.canceled {
            if answer.compact_revision > 0 {
                *next_revision = 0; // what was missed is gone: watch from now
            }
            return Err(format!("etcd ended the watch: {}", answer.cancel_reason));
        }
        if answer.created {
            watched.up();
        }
        // Watching again: the next failure is news worth a warning.
        *failures = 0;
        for event in &answer.events {
            if !event.is_delete() {
                continue;
            }
            if let Some(kv) = &event.kv {
                *next_revision = kv.mod_revision() + 1;
            }
            if let Some(prev) = &event.prev_kv {
                if let Ok(name) = prev.key_str() {
                    watched.deleted(name, prev.create_revision());
                }
            }
            let key = event
                .prev_kv
                .as_ref()
                .and_then(|kv| serde_json::from_slice::<EtcdRecord>(kv.value()).ok())
                .and_then(|record| Key::parse_record(&record.key).ok());
            if let Some(key) = key {
                let _ = released.send(key);
            }
        }
    }
    Ok(())
}
