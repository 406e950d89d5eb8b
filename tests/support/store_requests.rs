//! Counts a store's requests at the store, however it lets them be counted:
//! a counting HTTP proxy in front of moto, Azurite and fake-gcs-server;
//! PostgreSQL's committed transactions (`pg_stat_database`); etcd's handled
//! gRPC calls (its `/metrics`). For the benches.

use crate::http;
use crate::rewriting_proxy::RewritingProxy;
use crate::stores::Space;
use anyhow::{bail, Context, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Counts the store's requests, however the store lets them be counted.
pub enum StoreRequests {
    /// The count, and the proxy that keeps it (stopped when dropped).
    Proxy(Arc<AtomicU64>, #[allow(dead_code)] RewritingProxy),
    Postgres(String),
    Etcd(String),
}

impl StoreRequests {
    /// The store's requests so far.
    pub async fn read(&self) -> Result<u64> {
        match self {
            StoreRequests::Proxy(count, _) => Ok(count.load(Ordering::Relaxed)),
            StoreRequests::Postgres(uri) => {
                // The agents may hold every connection the server has for a
                // moment (as they may: they wait theirs out): so may psql.
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    let out = tokio::process::Command::new("psql")
                        .args(["-XAtw", uri, "-c"])
                        .arg("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
                        .output()
                        .await
                        .context("running psql")?;
                    let text = String::from_utf8_lossy(&out.stdout);
                    // psql's own query is one transaction: not the agents'.
                    if let Ok(count) = text.trim().parse::<u64>() {
                        return Ok(count.saturating_sub(1));
                    }
                    if Instant::now() > deadline {
                        bail!("psql: {}", String::from_utf8_lossy(&out.stderr).trim());
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            StoreRequests::Etcd(url) => {
                let metrics = http::get(&format!("{url}/metrics"))
                    .await?
                    .success("etcd's metrics")?;
                Ok(metrics
                    .lines()
                    .filter(|l| l.starts_with("grpc_server_handled_total{"))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum::<f64>() as u64)
            }
        }
    }

    /// The store's requests per second over the next `window`.
    pub async fn per_second_over(&self, window: Duration) -> Result<f64> {
        let before = self.read().await?;
        tokio::time::sleep(window).await;
        let after = self.read().await?;
        Ok(after.saturating_sub(before) as f64 / window.as_secs_f64())
    }
}

impl StoreRequests {
    /// Starts counting the requests of agents on `space`; an object store's
    /// agents must be started after this, on the space's new endpoint.
    pub async fn count(space: &mut Space) -> Result<StoreRequests> {
        Ok(match space.store_name() {
            // Through PgBouncer too: psql's one simple query passes through it.
            "postgres" | "pgbouncer" => StoreRequests::Postgres(space.uri("")),
            "etcd" => StoreRequests::Etcd(space.at.url.clone()),
            _ => {
                let count = Arc::new(AtomicU64::new(0));
                let counted = count.clone();
                let proxy = RewritingProxy::start(
                    &space.at,
                    Arc::new(move |_| {
                        counted.fetch_add(1, Ordering::Relaxed);
                    }),
                )
                .await?;
                // Agents reach the store through the proxy from here on.
                space.at = proxy.endpoint.clone();
                StoreRequests::Proxy(count, proxy)
            }
        })
    }
}
