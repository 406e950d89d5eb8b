//! Lease requests for the backends' tests (here and, through `testing`, in
//! tests/), one shape for every store: the holder names its lease
//! (`host-of-l1`), so a test reads who won.

use super::{AcquireSpec, Adopter, Holder, Key, LeaseRef};
use std::time::Duration;

/// The user every fixture holder runs as.
pub const OWNER_UID: u32 = 1000;

pub fn spec(key: &str, lease: &str, force: bool, ttl: Duration) -> AcquireSpec {
    AcquireSpec {
        key: Key::new(key).expect("a valid key"),
        lease_id: lease.into(),
        holder: Holder {
            slot: None,
            slots: None,
            host: format!("host-of-{lease}"),
            agent_id: format!("agent-of-{lease}"),
            pid: 7,
            uid: OWNER_UID,
            gid: OWNER_UID,
            user: "etl".into(),
            command: "meltano run tap target".into(),
            acquired_at_ms: 1,
            token: 0,
        },
        ttl,
        force,
        breaking: false,
    }
}

pub fn lease(key: &str, lease_id: &str, token: u64) -> LeaseRef {
    LeaseRef {
        key: Key::new(key).expect("a valid key"),
        lease_id: lease_id.into(),
        token,
    }
}

/// Agent `agent_id` adopting for the fixture holders' user.
pub fn adopter(agent_id: &str) -> Adopter {
    Adopter {
        agent_id: agent_id.into(),
        uid: OWNER_UID,
    }
}

/// A test's plain acquire of a key it expects to be free.
#[cfg(test)]
#[async_trait::async_trait]
pub trait Take {
    /// Takes `key` for `lease` (no force), panicking if it is not free.
    async fn take(&self, key: &str, lease: &str, ttl: Duration) -> super::Grant;
}

#[cfg(test)]
#[async_trait::async_trait]
impl<B: super::Backend + ?Sized> Take for B {
    async fn take(&self, key: &str, lease: &str, ttl: Duration) -> super::Grant {
        self.acquire(&spec(key, lease, false, ttl))
            .await
            .unwrap_or_else(|err| panic!("{key} is not free for {lease}: {err:?}"))
    }
}

/// A service-account key's JSON with a fresh RSA key (made by openssl) whose
/// token service is `token_uri`, and one line of the private key, to look
/// for in what the agent shows.
#[cfg_attr(not(feature = "gcs"), allow(dead_code))]
pub fn service_account_key(token_uri: &str) -> (String, String) {
    let pem = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ])
        .output()
        .expect("openssl runs");
    assert!(pem.status.success(), "openssl genpkey failed: {pem:?}");
    let pem = String::from_utf8(pem.stdout).expect("PEM is text");
    let key_line = pem.lines().nth(5).expect("a key line").to_string();
    let json = serde_json::json!({"type": "service_account", "project_id": "p",
        "private_key": pem, "client_email": "runlock@p.iam.gserviceaccount.com",
        "token_uri": token_uri});
    (json.to_string(), key_line)
}

/// `backend`'s history of `key`, an event a line: `Granted 1 host-of-l1`
/// (its kind, token and host), for a test to compare whole.
#[cfg(test)]
pub async fn history_lines<B: super::Backend + ?Sized>(backend: &B, key: &str) -> Vec<String> {
    let key = Key::new(key).expect("a valid key");
    let events = backend.history(&key).await.expect("history");
    events
        .iter()
        .map(|e| format!("{:?} {} {}", e.kind, e.token, e.host))
        .collect()
}

/// A port on 127.0.0.1 where nothing listens (bound, then closed): a store
/// there refuses every connection.
#[cfg(all(test, any(object_store, feature = "etcd")))]
pub fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a local port");
    listener.local_addr().expect("its address").port()
}
