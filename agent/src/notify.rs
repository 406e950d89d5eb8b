//! What the agent tells its service manager (`NOTIFY_SOCKET`, `Type=notify`):
//! READY=1, a STATUS= line kept current, WATCHDOG=1 pings while it serves, and
//! STOPPING=1 as soon as it begins to stop. Without `NOTIFY_SOCKET` it does nothing.

use crate::lease::Registry;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixListener;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

/// How often the lease count is looked at for the STATUS= line.
const STATUS_PERIOD: Duration = Duration::from_secs(1);
/// The bounds of the watchdog ping period.
const MIN_PING: Duration = Duration::from_millis(1);
const MAX_PING: Duration = Duration::from_secs(3600);

/// The notifier task; [`Notifier::finish`] waits until STOPPING=1 is sent.
pub struct Notifier {
    task: Option<JoinHandle<()>>,
}

impl Notifier {
    /// Sends READY=1 and the first STATUS= line, then, until `shutdown`, pings
    /// the watchdog (when one is set) and updates STATUS= when the number of
    /// leases changes. At `shutdown` it sends STOPPING=1 and a last STATUS=.
    pub fn start(
        listener: &UnixListener,
        registry: Arc<Registry>,
        shutdown: CancellationToken,
    ) -> Notifier {
        if std::env::var_os("NOTIFY_SOCKET").is_none() {
            return Notifier { task: None };
        }
        let socket = listener
            .local_addr()
            .ok()
            .and_then(|a| a.as_pathname().map(|p| p.display().to_string()))
            .unwrap_or_else(|| "an unnamed socket".to_string());
        let backend = registry.backend_description();
        let watchdog = watchdog_period(
            std::env::var("WATCHDOG_USEC").ok().as_deref(),
            std::env::var("WATCHDOG_PID").ok().as_deref(),
            std::process::id(),
        );
        let status = move |leases: usize| {
            format!(
                "serving on {socket}, backend {backend}, {leases} lease{} held",
                if leases == 1 { "" } else { "s" }
            )
        };
        let task = tokio::spawn(async move {
            let mut leases = registry.lease_count();
            send(&[
                sd_notify::NotifyState::Ready,
                sd_notify::NotifyState::Status(&status(leases)),
            ]);
            match watchdog {
                Some(period) => tracing::info!(
                    every = %humantime::format_duration(period),
                    "pinging the systemd watchdog"
                ),
                None => tracing::debug!("no systemd watchdog"),
            }
            // Without a watchdog the ping branch is disabled and this never ticks.
            let mut pings = tokio::time::interval(watchdog.unwrap_or(STATUS_PERIOD));
            pings.set_missed_tick_behavior(MissedTickBehavior::Delay);
            let mut checks = tokio::time::interval(STATUS_PERIOD);
            checks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = pings.tick(), if watchdog.is_some() => {
                        send(&[sd_notify::NotifyState::Watchdog]);
                    }
                    _ = checks.tick() => {
                        let now = registry.lease_count();
                        if now != leases {
                            leases = now;
                            send(&[sd_notify::NotifyState::Status(&status(leases))]);
                        }
                    }
                }
            }
            let leases = registry.lease_count();
            send(&[
                sd_notify::NotifyState::Stopping,
                sd_notify::NotifyState::Status(&format!(
                    "stopping: {leases} lease{} held",
                    if leases == 1 { "" } else { "s" }
                )),
            ]);
        });
        Notifier { task: Some(task) }
    }

    /// Waits (after `shutdown`) until STOPPING=1 has been sent.
    pub async fn finish(self) {
        if let Some(task) = self.task {
            let _ = task.await;
        }
    }
}

/// Whether the last notification found the service manager's queue full.
static DROPPING: AtomicBool = AtomicBool::new(false);

/// Sends one notification without waiting: a service manager that is not
/// reading (its queue full) costs the notification, never the agent, which
/// would otherwise block a runtime thread and then its own shutdown.
/// sd_notify::notify sends on a blocking socket, hence this.
fn send(states: &[sd_notify::NotifyState<'_>]) {
    let message: String = states.iter().map(|state| format!("{state}\n")).collect();
    match send_now(message.as_bytes()) {
        Ok(()) => {
            if DROPPING.swap(false, Ordering::Relaxed) {
                tracing::info!("the service manager reads its notify socket again");
            }
        }
        Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
            if !DROPPING.swap(true, Ordering::Relaxed) {
                tracing::warn!("the service manager is not reading its notify socket; notifications are dropped until it does");
            }
        }
        // A service manager that went away is no reason to stop serving.
        Err(err) => tracing::debug!(error = %err, "cannot notify the service manager"),
    }
}

fn send_now(message: &[u8]) -> std::io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(());
    };
    // "@name" is a socket in the abstract namespace (sd_notify(3)).
    let address = match path.as_bytes().strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name)?,
        None => SocketAddr::from_pathname(&path)?,
    };
    let socket = UnixDatagram::unbound()?;
    socket.set_nonblocking(true)?;
    socket.send_to_addr(message, &address)?;
    Ok(())
}

/// The ping period for `WATCHDOG_USEC`/`WATCHDOG_PID`: half the interval, as
/// sd_watchdog_enabled(3) advises. Like libsystemd (and unlike sd-notify 0.4,
/// which insists on it) a missing `WATCHDOG_PID` means the watchdog is ours.
fn watchdog_period(usec: Option<&str>, pid: Option<&str>, own_pid: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok()? != own_pid {
            return None;
        }
    }
    // At least 1 ms (a zero period makes an interval panic) and at most an
    // hour (a far one could overflow the clock); pinging early does no harm.
    Some(Duration::from_micros(usec / 2).clamp(MIN_PING, MAX_PING))
}

#[cfg(test)]
mod tests {
    use super::watchdog_period;
    use std::time::Duration;

    #[test]
    fn watchdog_pings_at_half_the_interval_for_this_process_only() {
        assert_eq!(
            watchdog_period(Some("30000000"), Some("42"), 42),
            Some(Duration::from_secs(15))
        );
        assert_eq!(
            watchdog_period(Some("200000"), None, 42),
            Some(Duration::from_millis(100))
        );
        assert_eq!(watchdog_period(Some("30000000"), Some("43"), 42), None);
        assert_eq!(watchdog_period(None, Some("42"), 42), None);
    }

    #[test]
    fn odd_watchdog_values_never_panic() {
        assert_eq!(watchdog_period(Some("0"), None, 1), None);
        assert_eq!(watchdog_period(Some("-5"), None, 1), None);
        assert_eq!(watchdog_period(Some("soon"), None, 1), None);
        assert_eq!(watchdog_period(Some("30000000"), Some("x"), 1), None);
        assert_eq!(
            watchdog_period(Some("1"), None, 1),
            Some(Duration::from_millis(1))
        );
        assert_eq!(
            watchdog_period(Some(&u64::MAX.to_string()), None, 1),
            Some(Duration::from_secs(3600))
        );
    }
}
