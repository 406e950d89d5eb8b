//! The accept loop: one task per connection, tracked so that shutdown can
//! tell each peer and wait (bounded) for them to finish.

use crate::connection::serve_connection;
use crate::registry::Registry;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long shutdown waits for connections to finish.
const DRAIN: Duration = Duration::from_secs(5);

/// Serves `listener` until `shutdown` is cancelled.
pub async fn serve(listener: UnixListener, registry: Arc<Registry>, shutdown: CancellationToken) {
    let tracker = TaskTracker::new();
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    // Out of descriptors and the like: back off rather than spin.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        tracker.spawn(serve_connection(
            stream,
            registry.clone(),
            shutdown.child_token(),
        ));
    }
    drop(listener);
    tracker.close();
    if tokio::time::timeout(DRAIN, tracker.wait()).await.is_err() {
        tracing::warn!(
            connections = tracker.len(),
            "connections still open after the drain period"
        );
    }
}
