//! Opening the backend a URI names: one table of schemes, each opened and
//! checked once as the agent does at start, and one place that says what the
//! check found.

#[cfg(any(object_store, feature = "test-support"))]
use super::cas::{self, CasStore};
use super::{
    redact_uri, Backend, BackendOptions, FileBackend, MemoryBackend, Profiled, ProfiledBackend,
    StoreContext,
};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
#[cfg(any(network_store, feature = "test-support"))]
use std::time::Duration;

/// How long the start-up check of a network store may take.
#[cfg(any(network_store, feature = "test-support"))]
const PROBE_TIMEOUT: Duration = Duration::from_secs(6);

/// Whether a backend just opened can serve runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// It answered, and showed it can lock.
    Ready,
    /// It could not be checked now (down, unreachable, refusing us); runs get
    /// `unavailable` until it can.
    Unreachable(String),
    /// It answered and broke a guarantee a lock rests on: it grants nothing.
    Untrusted(String),
}

/// A backend, what it is, and what its first check found.
pub struct Opened {
    /// The backend and what it is.
    pub store: ProfiledBackend,
    /// What the check found.
    pub readiness: Readiness,
}

/// A scheme's opening: fails only on what it was given.
type Opening<'a> = Pin<Box<dyn Future<Output = anyhow::Result<Opened>> + Send + 'a>>;

/// Opens `uri` (which has the scheme; `rest` follows its `://`) in
/// `context` and checks it once.
type Opener = for<'a> fn(
    uri: &'a str,
    rest: &'a str,
    options: &'a BackendOptions,
    context: &'a StoreContext,
) -> Opening<'a>;

/// One URI scheme.
struct Scheme {
    /// The scheme, and any other name for it.
    names: &'static [&'static str],
    /// An example, for the error that names what is supported.
    example: &'static str,
    /// The cargo feature that builds it (file:// and memory:// are always built).
    feature: Option<&'static str>,
    /// How to open it; `None` where this build was made without its feature.
    open: Option<Opener>,
}

/// `Some(opener)` where this build has `feature`, else `None` (and the opener,
/// which names the feature's types, is not compiled).
macro_rules! built {
    ($feature:literal, $opener:expr) => {{
        #[cfg(feature = $feature)]
        let opener: Option<Opener> = Some($opener);
        #[cfg(not(feature = $feature))]
        let opener: Option<Opener> = None;
        opener
    }};
}

/// Every scheme, in the order errors list them.
const SCHEMES: &[Scheme] = &[
    Scheme {
        names: &["file"],
        example: "file:///path",
        feature: None,
        open: Some(|_, rest, _, _| Box::pin(async move { ready(open_file(rest)?) })),
    },
    Scheme {
        names: &["s3"],
        example: "s3://bucket/prefix",
        feature: Some("s3"),
        open: built!("s3", |uri, _, options, context| {
            Box::pin(async move {
                let store = cas::S3Store::open(uri, &options.s3, context).await?;
                on_object_store(store, options, context).await
            })
        }),
    },
    Scheme {
        names: &["azure"],
        example: "azure://container/prefix",
        feature: Some("azure"),
        open: built!("azure", |uri, _, options, context| {
            Box::pin(async move {
                let store = cas::AzureStore::open(uri, &options.azure, context)?;
                on_object_store(store, options, context).await
            })
        }),
    },
    Scheme {
        names: &["gs"],
        example: "gs://bucket/prefix",
        feature: Some("gcs"),
        open: built!("gcs", |uri, _, options, context| {
            Box::pin(async move {
                let store = cas::GcsStore::open(uri, &options.gcs, context)?;
                on_object_store(store, options, context).await
            })
        }),
    },
    Scheme {
        names: &["postgresql", "postgres"],
        example: "postgresql://…",
        feature: Some("postgres"),
        open: built!("postgres", |uri, _, options, context| {
            Box::pin(async move {
                let backend = super::PostgresBackend::open(uri, &options.postgres, context)?;
                let backend = Arc::new(backend);
                let readiness = within_probe_timeout(backend.probe()).await;
                Ok(Opened {
                    store: backend.into(),
                    readiness,
                })
            })
        }),
    },
    Scheme {
        names: &["etcd"],
        example: "etcd://host:port/prefix",
        feature: Some("etcd"),
        open: built!("etcd", |uri, _, options, context| {
            Box::pin(async move {
                let backend = Arc::new(super::EtcdBackend::open(uri, &options.etcd, context)?);
                let probe = async { backend.probe().await.map_err(|err| err.to_string()) };
                let readiness = within_probe_timeout(probe).await;
                Ok(Opened {
                    store: backend.into(),
                    readiness,
                })
            })
        }),
    },
    Scheme {
        names: &["memory"],
        example: "memory://",
        feature: None,
        open: Some(|_, _, _, _| Box::pin(async { ready(MemoryBackend::default()) })),
    },
];

/// Schemes for benchmarks and tests, never in a release build: the
/// object-store engine over an in-process store.
#[cfg(feature = "test-support")]
const TEST_SCHEMES: &[Scheme] = &[Scheme {
    names: &["memory-cas"],
    example: "memory-cas://",
    feature: Some("test-support"),
    // `memory-cas://racy`: a store the proof must refuse;
    // `memory-cas://racy-under-load`, one only check-config's can (cas/racy.rs).
    open: Some(|_, rest, options, context| {
        let racy = match rest {
            "racy" => Some(cas::RacyCasStore::default()),
            "racy-under-load" => Some(cas::RacyCasStore::under_load()),
            _ => None,
        };
        Box::pin(async move {
            match racy {
                Some(racy) => on_object_store(racy, options, context).await,
                None => on_object_store(cas::MemoryCasStore::new(), options, context).await,
            }
        })
    }),
}];
#[cfg(not(feature = "test-support"))]
const TEST_SCHEMES: &[Scheme] = &[];

/// Builds the backend a URI names in `context` and checks it once, as the
/// agent does at start: a network store must answer, and an object store
/// must show that it refuses conflicting writes (`cas::CasEngine::prove`).
/// Fails only on what it was given (a malformed URI, an unreadable file).
pub async fn open(
    uri: &str,
    options: &BackendOptions,
    context: &StoreContext,
) -> anyhow::Result<Opened> {
    let supported = || {
        SCHEMES
            .iter()
            .filter(|scheme| scheme.open.is_some())
            .map(|scheme| scheme.example)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some((name, rest)) = uri.split_once("://") else {
        anyhow::bail!(
            "backend {:?} is not a URI (expected {})",
            redact_uri(uri),
            supported()
        );
    };
    let mut every = SCHEMES.iter().chain(TEST_SCHEMES);
    match every.find(|scheme| scheme.names.contains(&name)) {
        Some(Scheme {
            open: Some(open), ..
        }) => open(uri, rest, options, context).await,
        Some(Scheme {
            feature: Some(feature),
            ..
        }) => anyhow::bail!(
            "backend scheme {name}:// is left out of this build: build runlockd with the \
             cargo feature {feature:?} (on by default) to use it (supported: {})",
            supported()
        ),
        _ => anyhow::bail!(
            "backend scheme {name:?} is not supported by this build (supported: {})",
            supported()
        ),
    }
}

/// [`open`], logging what its check found; the agent starts either way.
pub async fn from_uri(
    uri: &str,
    options: &BackendOptions,
    context: &StoreContext,
) -> anyhow::Result<ProfiledBackend> {
    let Opened { store, readiness } = open(uri, options, context).await?;
    match readiness {
        Readiness::Ready => {}
        Readiness::Unreachable(problem) => tracing::warn!(
            backend = %store.profile.description,
            "the backend cannot be used yet: {problem}; runs will fail as unavailable until it can"
        ),
        Readiness::Untrusted(problem) => tracing::error!(
            backend = %store.profile.description,
            "the backend cannot be trusted to lock: {problem}; every run will fail as unavailable"
        ),
    }
    Ok(store)
}

fn open_file(dir: &str) -> anyhow::Result<FileBackend> {
    if dir.is_empty() {
        anyhow::bail!("backend file:// needs a directory, as in file:///var/lib/runlock");
    }
    FileBackend::open(PathBuf::from(dir))
}

/// A backend with nothing to check: it is in this process, or on this host.
fn ready(backend: impl Backend + Profiled) -> anyhow::Result<Opened> {
    Ok(Opened {
        store: Arc::new(backend).into(),
        readiness: Readiness::Ready,
    })
}

/// The object-store lease engine over `store`: once the store's own check
/// passed, the engine's proof that it refuses conflicting writes.
#[cfg(any(object_store, feature = "test-support"))]
async fn on_object_store(
    store: impl CasStore,
    options: &BackendOptions,
    context: &StoreContext,
) -> anyhow::Result<Opened> {
    let probed = within_probe_timeout(async { store.probe().await.map_err(|e| e.to_string()) });
    let probed = probed.await;
    let engine = cas::CasEngine::new(Arc::new(store))
        .proving(options.proof)
        .within(context);
    let engine = Arc::new(engine);
    let readiness = match probed {
        Readiness::Ready => match tokio::time::timeout(PROBE_TIMEOUT, engine.prove()).await {
            Ok(Ok(())) => Readiness::Ready,
            Ok(Err(cas::Unproven::Lacks(what))) => Readiness::Untrusted(what),
            Ok(Err(cas::Unproven::Unanswered(why))) => Readiness::Unreachable(why),
            Err(_) => no_answer(),
        },
        not_ready => not_ready,
    };
    Ok(Opened {
        store: engine.into(),
        readiness,
    })
}

/// A backend's own check, bounded by [`PROBE_TIMEOUT`].
#[cfg(any(network_store, feature = "test-support"))]
async fn within_probe_timeout(
    probe: impl std::future::Future<Output = Result<(), String>>,
) -> Readiness {
    match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
        Ok(Ok(())) => Readiness::Ready,
        Ok(Err(problem)) => Readiness::Unreachable(problem),
        Err(_) => no_answer(),
    }
}

#[cfg(any(network_store, feature = "test-support"))]
fn no_answer() -> Readiness {
    Readiness::Unreachable(format!("no answer within {}s", PROBE_TIMEOUT.as_secs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn opened(uri: &str) -> anyhow::Result<ProfiledBackend> {
        from_uri(uri, &BackendOptions::default(), &StoreContext::default()).await
    }

    #[tokio::test]
    async fn a_scheme_left_out_of_the_build_is_named_with_its_feature() {
        for scheme in SCHEMES.iter().filter(|scheme| scheme.open.is_none()) {
            let uri = format!("{}://x/y", scheme.names[0]);
            let Err(err) = opened(&uri).await else {
                panic!("{uri} opened without its feature");
            };
            let feature = scheme.feature.expect("only a feature leaves a scheme out");
            assert!(err.to_string().contains("left out of this build"), "{err}");
            assert!(err.to_string().contains(&format!("{feature:?}")), "{err}");
        }
    }

    #[tokio::test]
    async fn unknown_scheme_is_named() {
        let Err(err) = opened("gopher://x").await else {
            panic!("gopher:// was accepted");
        };
        assert!(err.to_string().contains("\"gopher\""), "{err}");
        assert!(opened("file://").await.is_err());
        assert!(opened("not a uri").await.is_err());
        // Built or not, a bare object-store scheme is refused.
        for bare in ["s3://", "azure://", "gs://"] {
            assert!(opened(bare).await.is_err(), "{bare}");
        }
    }
}
