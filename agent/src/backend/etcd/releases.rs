//! The keys deleted under the prefix, through any agent, as one watch on
//! the prefix reports them: what waiters wake on instead of polling.

use super::*;

/// Released keys queued for a slow waiter before it is told it missed some.
const RELEASED_BACKLOG: usize = 256;

impl EtcdBackend {
    /// Keys deleted under the prefix through any agent (released, expired or
    /// forced out), as one watch reports them; `None` with `?watch=false`.
    pub fn releases(&self) -> Option<broadcast::Receiver<Key>> {
        self.release_sender().map(|sender| sender.subscribe())
    }

    /// Whether the watch on the prefix is established now.
    #[cfg(feature = "test-support")]
    pub(crate) fn watching(&self) -> bool {
        self.watched.is_up()
    }

    /// Where [`EtcdBackend::releases`] come from; the watch starts on first use.
    pub(super) fn release_sender(&self) -> Option<broadcast::Sender<Key>> {
        if !self.watch {
            return None;
        }
        let sender = self.released.get_or_init(|| {
            let (sender, _) = broadcast::channel(RELEASED_BACKLOG);
            self.context.spawn(watch_releases(
                self.connection.clone(),
                sender.clone(),
                self.watched.clone(),
                self.stop.clone(),
            ));
            sender
        });
        Some(sender.clone())
    }
}
