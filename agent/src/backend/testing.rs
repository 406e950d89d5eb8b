//! What the backend tests in `tests/` (run against the real stores'
//! emulators) need of the agent's insides, and nothing more: not an API.

pub use super::fixtures::{adopter, lease, service_account_key, spec, OWNER_UID};
pub use super::retry::TIMEOUTS;

/// A GCS store on the emulator at `endpoint`, as `STORAGE_EMULATOR_HOST`
/// would make it, without setting the variable for the whole test process.
#[cfg(feature = "gcs")]
pub fn gcs_on_emulator(uri: &str, endpoint: &str) -> anyhow::Result<super::cas::GcsStore> {
    super::cas::GcsStore::on_emulator(uri, endpoint)
}

/// Where an etcd backend marks a key it is forcing.
#[cfg(feature = "etcd")]
pub fn etcd_force_marker(backend: &super::EtcdBackend, key: &runlock_protocol::Key) -> String {
    backend.force_marker(key)
}

/// The etcd lease, in whole seconds, that a lease of `ttl` is bound to.
#[cfg(feature = "etcd")]
pub fn etcd_lease_seconds(ttl: std::time::Duration) -> i64 {
    super::etcd::lease_seconds(ttl)
}

/// The etcd client the backend talks through, for tests that read or write
/// beside it.
#[cfg(feature = "etcd")]
pub use super::etcd::rpc as etcd_rpc;

/// A client of the etcd at `url` (`http://host:port`), without a user.
#[cfg(feature = "etcd")]
pub async fn etcd_client(url: &str) -> Result<etcd_rpc::Client, etcd_rpc::Error> {
    etcd_rpc::Client::connect(etcd_rpc::Settings {
        endpoints: &[url.to_string()],
        tls: None,
        user: None,
        connect_timeout: TIMEOUTS.connect,
        timeout: TIMEOUTS.attempt,
        keep_alive: (
            std::time::Duration::from_secs(10),
            std::time::Duration::from_secs(5),
        ),
    })
    .await
}

/// Whether an etcd backend's watch on its prefix is established.
#[cfg(feature = "etcd")]
pub fn etcd_watching(backend: &super::EtcdBackend) -> bool {
    backend.watching()
}
