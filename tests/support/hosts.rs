//! Two agents sharing their locks, as two hosts would, for a case that runs
//! on every backend: `file://` and the network stores with two agents,
//! `memory://` and `memory-cas://` with one (their locks live in it).

use crate::agent::{Backend, FileBackendDir};
use crate::stores::{Space, Store};
use crate::{AgentOptions, TestAgent};
use anyhow::Result;

/// A backend that lives in agents (`file://` on this host, `memory://`).
pub struct Local(pub Backend);

/// A shared store, through its emulator.
pub struct OnStore<S>(pub S);

/// [`test_matrix!`](crate::test_matrix) over every place: each case, an
/// `async fn case(impl Place)`, runs on the backends that live in agents and
/// on every store (the test `case::file`, `case::pgbouncer`, ...).
#[macro_export]
macro_rules! on_every_place {
    ($($case:ident),* $(,)?) => {
        $crate::test_matrix!(
            [
                file: $crate::hosts::Local($crate::agent::Backend::File),
                memory: $crate::hosts::Local($crate::agent::Backend::Memory),
                memory_cas: $crate::hosts::Local($crate::agent::Backend::MemoryCas),
                s3: $crate::hosts::OnStore($crate::stores::S3),
                ministack: $crate::hosts::OnStore($crate::stores::Ministack),
                azure: $crate::hosts::OnStore($crate::stores::Azure),
                gcs: $crate::hosts::OnStore($crate::stores::Gcs),
                postgres: $crate::hosts::OnStore($crate::stores::Postgres),
                pgbouncer: $crate::hosts::OnStore($crate::stores::PgBouncer),
                etcd: $crate::hosts::OnStore($crate::stores::Etcd),
            ];
            $($case),*
        );
    };
}

/// Where a case runs: two agents over one fresh space, as two hosts.
#[async_trait::async_trait]
pub trait Place: Send + 'static {
    /// Two agents (one where the locks live in the agent), started with `args`,
    /// over a fresh space named after `hint`.
    async fn hosts(self, hint: &str, args: &[&str]) -> Result<Hosts>;
}

/// Two agents sharing their locks. `memory://` and `memory-cas://` live in
/// one agent, so there B is A.
pub struct Hosts {
    /// The first agent.
    pub a: TestAgent,
    other: Option<TestAgent>,
    /// The lock directory of `file://`, kept while the agents use it.
    _locks: Option<FileBackendDir>,
}

impl Hosts {
    /// The second agent (the first, where there is one).
    pub fn b(&self) -> &TestAgent {
        self.other.as_ref().unwrap_or(&self.a)
    }

    /// Whether A and B are one agent (so `status` through A lists B's leases too).
    pub fn one_agent(&self) -> bool {
        self.other.is_none()
    }
}

#[async_trait::async_trait]
impl Place for Local {
    async fn hosts(self, _hint: &str, args: &[&str]) -> Result<Hosts> {
        let options = |uri: String| {
            let mut options = AgentOptions::new(uri);
            options.args = args.iter().map(|a| a.to_string()).collect();
            options
        };
        match self.0 {
            Backend::File => {
                let (locks, a, b) = FileBackendDir::with_two_agents_using(options).await?;
                Ok(Hosts {
                    a,
                    other: Some(b),
                    _locks: Some(locks),
                })
            }
            Backend::Memory | Backend::MemoryCas => {
                let uri = match self.0 {
                    Backend::Memory => "memory://",
                    _ => "memory-cas://",
                };
                let a = TestAgent::start_with(options(uri.to_string())).await?;
                Ok(Hosts {
                    a,
                    other: None,
                    _locks: None,
                })
            }
        }
    }
}

#[async_trait::async_trait]
impl<S: Store> Place for OnStore<S> {
    async fn hosts(self, hint: &str, args: &[&str]) -> Result<Hosts> {
        let space = Space::create(self.0, hint).await?;
        let a = space.agent("slots", args).await?;
        let b = space.agent("slots", args).await?;
        Ok(Hosts {
            a,
            other: Some(b),
            _locks: None,
        })
    }
}
