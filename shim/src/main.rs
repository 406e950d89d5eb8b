//! runlock, the shim: wraps a command in a lock held by this host's runlockd.

mod agent;
mod commands;
mod format;
mod host_config;
mod order;
mod signals;
mod wait_line;

use clap::Parser;
use runlock_shim::{cli, exit};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            return if err.use_stderr() {
                ExitCode::from(exit::EXIT_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let host = host_config::HostConfig::load();
    let socket = match runlock_protocol::socket_path::resolve(cli.socket, host.socket.clone()) {
        Ok(path) => path,
        Err(why) => return exit::Failure::new(exit::EXIT_USAGE, why).report(),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            return exit::Failure::new(exit::EXIT_SOFTWARE, format!("cannot start: {err}")).report()
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            cli::Command::Run(args) => commands::run::run(&socket, &host, args).await,
            cli::Command::Status { json } => commands::status::run(&socket, json).await,
            cli::Command::List { prefix, all, json } => {
                commands::list::run(&socket, &prefix, all, json).await
            }
            cli::Command::Inspect { key, json } => {
                commands::inspect::run(&socket, &key, json).await
            }
            cli::Command::History { key, limit, json } => {
                commands::history::run(&socket, &key, limit, json).await
            }
            cli::Command::Ui { listen } => commands::ui::run(&socket, listen).await,
            cli::Command::Release { key, slot } => {
                commands::release::run(&socket, &key, slot).await
            }
        }
    });
    match result {
        Ok(code) => code,
        Err(failure) => failure.report(),
    }
}
