//! `runlock ui [--listen ADDR]`: a live page of the fleet on a loopback port,
//! for the user who runs it, fed through this host's agent's socket with
//! that user's rights (the agent gets no listener of its own for it).

mod runs;
mod server;
mod state;

use crate::exit::{Failure, EXIT_SOFTWARE, EXIT_USAGE};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

/// The token's length: 128 bits, beyond guessing from another local account.
const TOKEN_BYTES: usize = 16;

pub async fn run(socket: &Path, listen: SocketAddr) -> Result<ExitCode, Failure> {
    // Any address but loopback would show everyone on the network the
    // fleet's hosts and commands, and carry the token over plain HTTP.
    if !listen.ip().is_loopback() {
        return Err(Failure::new(
            EXIT_USAGE,
            format!(
                "--listen {listen}: runlock ui serves only on a loopback address (127.0.0.1 or ::1): \
                 the page shows the fleet's hosts and commands over plain HTTP; \
                 reach it from elsewhere through an SSH tunnel"
            ),
        ));
    }
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|err| Failure::new(EXIT_SOFTWARE, format!("cannot listen on {listen}: {err}")))?;
    let addr = listener
        .local_addr()
        .map_err(|err| Failure::new(EXIT_SOFTWARE, format!("reading the address bound: {err}")))?;
    let token = new_token()?;
    let site = server::Site::new(
        addr,
        token.clone(),
        state::StateSource::new(socket.to_path_buf()),
    );
    let mut terminate = signal(SignalKind::terminate())
        .map_err(|err| Failure::new(EXIT_SOFTWARE, format!("cannot watch SIGTERM: {err}")))?;
    // The address alone on stdout, for a script to read; the rest for people.
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "http://{addr}/?token={token}");
    let _ = stdout.flush();
    drop(stdout);
    eprintln!(
        "runlock ui: serving the page on {addr} through the agent at {}; Ctrl-C stops it",
        socket.display()
    );
    tokio::select! {
        () = server::serve(listener, Arc::new(site)) => {}
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    Ok(ExitCode::SUCCESS)
}

/// A fresh secret for the page's address, as hex.
fn new_token() -> Result<String, Failure> {
    let mut bytes = [0u8; TOKEN_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut bytes))
        .map_err(|err| Failure::new(EXIT_SOFTWARE, format!("reading /dev/urandom: {err}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
