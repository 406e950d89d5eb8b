//! runlockd: parse the command line, start logging, open the backend, bind the
//! socket, and serve until SIGINT or SIGTERM.

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches};
use runlock_agent::config::{self, Args, Command, Config};
use runlock_agent::lease::{Identity, Policy, Registry};
use runlock_agent::meltano::guard::MeltanoGuard;
use runlock_agent::meltano::state_backend::StateBackend;
use runlock_agent::metrics::{self, Metrics};
use runlock_agent::{backend, limits, listener, notify, serve, telemetry};
use std::process::ExitCode;
use std::sync::Arc;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

fn main() -> ExitCode {
    let matches = Args::command().get_matches();
    let args = Args::from_arg_matches(&matches).unwrap_or_else(|err| err.exit());
    let exposed = config::secrets_on_command_line(&args, &matches);
    if let Some(Command::CheckConfig {
        from_meltano: Some(project),
    }) = &args.command
    {
        return from_meltano(project);
    }
    let config = match Config::load(&args) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("runlockd: error: {err:#}");
            return ExitCode::from(78); // EX_CONFIG
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("runlockd: error: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(Command::CheckConfig { .. }) = args.command {
        for warning in &exposed {
            eprintln!("runlockd: warning: {warning}");
        }
        print!("{}", config.to_redacted_toml());
        return runtime.block_on(check_backend(&config));
    }
    telemetry::init(config.log_format);
    for warning in &exposed {
        tracing::warn!("{warning}");
    }
    // On a worker, not on this thread: the accept loop then starts each
    // connection on the worker that accepted it, with no thread to wake.
    let served = match runtime.block_on(runtime.spawn(run(config))) {
        Ok(served) => served,
        Err(ended) => std::panic::resume_unwind(ended.into_panic()),
    };
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(Stop::Config(err)) => {
            eprintln!("runlockd: error: {err:#}");
            ExitCode::from(78) // EX_CONFIG
        }
        Err(Stop::Failed(err)) => {
            eprintln!("runlockd: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Prints the agent configuration matching a Meltano project's state
/// backend: 0, or 78 (EX_CONFIG) if the project names none the agent can use.
fn from_meltano(project: &std::path::Path) -> ExitCode {
    let env = |name: &str| std::env::var(name).ok();
    match StateBackend::read(project, &env).and_then(|found| found.to_agent_toml()) {
        Ok(toml) => {
            print!("{toml}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("runlockd: error: {err:#}");
            ExitCode::from(78)
        }
    }
}

/// Opens and checks the backend as the agent would at start (an object
/// store's proof racing more writers: a person asked), and says on
/// stderr whether it can serve runs: 0 if so, 69 (EX_UNAVAILABLE) if it
/// cannot be reached now, 78 (EX_CONFIG) if it cannot be used at all, as
/// given or because it broke a guarantee a lock rests on.
async fn check_backend(config: &Config) -> ExitCode {
    let options = backend::BackendOptions {
        proof: backend::cas::Proof::THOROUGH,
        ..config.backend_options.clone()
    };
    let opened = backend::open(
        config.backend.expose(),
        &options,
        &backend::StoreContext::default(),
    )
    .await;
    let backend::Opened { store, readiness } = match opened {
        Ok(opened) => opened,
        Err(err) => {
            eprintln!("runlockd: error: {err:#}");
            return ExitCode::from(78);
        }
    };
    match backend::credentials::source(config.backend.expose(), &config.backend_options) {
        Ok(source) => eprintln!("runlockd: credentials: {source}"),
        Err(err) => eprintln!("runlockd: credentials: cannot tell: {err:#}"),
    }
    let name = store.profile.description;
    match readiness {
        backend::Readiness::Ready => {
            eprintln!("runlockd: backend {name} is ready");
            ExitCode::SUCCESS
        }
        backend::Readiness::Unreachable(problem) => {
            eprintln!("runlockd: error: backend {name} cannot be used now: {problem}");
            ExitCode::from(69)
        }
        backend::Readiness::Untrusted(problem) => {
            eprintln!("runlockd: error: backend {name} cannot be trusted to lock: {problem}");
            ExitCode::from(78)
        }
    }
}

/// Why the agent stopped early: configuration it cannot use (exit 78, as a
/// bad file: a restart would not help), or a failure of the moment (exit 1).
enum Stop {
    Config(anyhow::Error),
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for Stop {
    fn from(err: anyhow::Error) -> Stop {
        Stop::Failed(err)
    }
}

async fn run(config: Config) -> Result<(), Stop> {
    let shutdown = CancellationToken::new();
    // The agent's own tasks beside the server's and the registry's: the
    // signal handler and the metrics server, waited for before the exit.
    let tasks = TaskTracker::new();
    // The one set of series, handed to all that report (served with --metrics).
    let metrics = Arc::new(Metrics::new());
    let stores = backend::StoreContext::new(metrics.clone());
    // Opening a backend fails only on what it was given (a malformed URI, an
    // unreadable key or certificate file); an unreachable store is a warning.
    let mut store = backend::from_uri(config.backend.expose(), &config.backend_options, &stores)
        .await
        .map_err(Stop::Config)?;
    if let Some(addr) = config.metrics {
        metrics::start(addr, metrics.clone(), shutdown.child_token(), &tasks).await?;
        store = metrics::instrument(store, metrics.clone());
    }
    let identity = Identity {
        host: nix::unistd::gethostname()
            .context("reading the host name")?
            .to_string_lossy()
            .into_owned(),
        agent_id: uuid::Uuid::new_v4().to_string(),
        uid: nix::unistd::geteuid().as_raw(),
    };
    let capabilities = store.profile.capabilities;
    if config.ttl < store.profile.min_ttl {
        return Err(Stop::Config(anyhow::anyhow!(
            "ttl {} is too short for {}: it needs at least {}",
            humantime::format_duration(config.ttl),
            store.profile.description,
            humantime::format_duration(store.profile.min_ttl)
        )));
    }
    let policy = Policy {
        default_ttl: config.ttl,
        on_unavailable: config.on_unavailable,
        access: config.access.clone(),
        poll_interval: config.poll_interval,
    };
    if let Some(db) = &config.legacy_meltano_systemdb {
        tracing::info!(
            systemdb = db.describe(),
            "checking Meltano's system database for legacy runs before each grant"
        );
        // Outermost, so that a legacy run's refusal is not timed as a store request.
        store = MeltanoGuard::wrap(store, db.clone(), &stores);
    }
    let registry = Registry::observed(store, identity.clone(), policy, metrics.clone());
    let descriptors = limits::raise_descriptor_limit();
    let admission = limits::Admission::new(config.limits, descriptors, identity.uid);
    if let Some(bound) = admission.descriptor_bound() {
        tracing::warn!(
            descriptors,
            connections = bound,
            configured = config.limits.connections,
            "the descriptor limit allows fewer connections than [limits] connections (raise LimitNOFILE)"
        );
    }
    let permissions = listener::Permissions {
        mode: config.socket_mode,
        group: config.socket_group,
    };
    let (listener, _guard) = listener::open(&config.socket, permissions)?;

    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let on_signal = shutdown.clone();
    tasks.spawn(async move {
        let name = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "stopping");
        on_signal.cancel();
    });

    tracing::info!(
        socket = %config.socket.display(),
        backend = %registry.backend_description(),
        scope = ?capabilities.scope,
        agent_id = %identity.agent_id,
        ttl = %humantime::format_duration(config.ttl),
        "runlockd ready"
    );
    let notifier = notify::Notifier::start(&listener, registry.clone(), shutdown.clone());
    serve(
        listener,
        registry.clone(),
        admission,
        metrics,
        stores,
        config.drain_timeout,
        shutdown,
    )
    .await;
    notifier.finish().await;
    tasks.close();
    tasks.wait().await;
    Ok(())
}
