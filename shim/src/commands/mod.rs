//! One module per subcommand.

pub mod history;
pub mod inspect;
pub mod list;
pub mod release;
pub mod run;
pub mod status;
pub mod ui;

use crate::exit::{Failure, EXIT_USAGE};
use runlock_protocol::Key;

/// Checks a key before bothering the agent; the message names the broken rule.
pub fn valid_key(key: &str) -> Result<Key, Failure> {
    Key::new(key).map_err(|e| Failure::new(EXIT_USAGE, format!("{e}: {key:?}")))
}
