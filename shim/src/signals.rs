//! The signals the shim passes on to the run: INT, TERM, HUP, QUIT, USR1, USR2.

use nix::sys::signal::Signal;
use std::task::Poll;
use tokio::signal::unix::{signal, SignalKind};

const FORWARDED: [Signal; 6] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// Handlers for every forwarded signal. Installed before the lock is asked for,
/// so that no signal kills the shim (leaving the run unforwarded) once it starts.
pub struct Signals {
    handlers: Vec<(Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    pub fn install() -> std::io::Result<Signals> {
        let handlers = FORWARDED
            .into_iter()
            .map(|sig| Ok((sig, signal(SignalKind::from_raw(sig as i32))?)))
            .collect::<std::io::Result<_>>()?;
        Ok(Signals { handlers })
    }

    /// The next signal received.
    pub async fn next(&mut self) -> Signal {
        std::future::poll_fn(|cx| {
            for (sig, handler) in &mut self.handlers {
                if let Poll::Ready(Some(())) = handler.poll_recv(cx) {
                    return Poll::Ready(*sig);
                }
            }
            Poll::Pending
        })
        .await
    }
}
