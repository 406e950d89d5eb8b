//! A mutex's data whether or not a holder panicked: the agent's mutexes
//! guard maps kept whole between statements, so a panic in one task is no
//! reason for every other to stop.

use std::sync::{Mutex, MutexGuard};

/// [`Mutex::lock`], poisoned or not.
pub trait Unpoisoned<T> {
    /// The guard of the data.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T> Unpoisoned<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|e| e.into_inner())
    }
}
