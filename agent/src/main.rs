//! runlockd: parse the command line, start logging, open the backend, bind the
//! socket, and serve until SIGINT or SIGTERM.

use anyhow::Context;
use clap::Parser;
use runlock_agent::config::{Args, Config};
use runlock_agent::registry::{Identity, Registry};
use runlock_agent::{backend, listener, metrics, serve, telemetry};
use std::process::ExitCode;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    let args = Args::parse();
    telemetry::init(args.log_format);
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
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("runlockd: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let config = Config::from_args(&args)?;
    let shutdown = CancellationToken::new();
    let mut backend = backend::from_uri(&config.backend).await?;
    if let Some(addr) = config.metrics {
        metrics::start(addr, shutdown.child_token()).await?;
        backend = metrics::instrument(backend);
    }
    let identity = Identity {
        host: nix::unistd::gethostname()
            .context("reading the host name")?
            .to_string_lossy()
            .into_owned(),
        agent_id: uuid::Uuid::new_v4().to_string(),
        uid: nix::unistd::geteuid().as_raw(),
    };
    let capabilities = backend.capabilities();
    let registry = Registry::new(backend, identity.clone(), config.ttl);
    let (listener, _guard) = listener::bind(&config.socket)?;

    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
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
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);
    serve(listener, registry.clone(), shutdown).await;
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
    Ok(())
}
