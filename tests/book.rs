//! The pages whose commands are run as they are written, so that they cannot
//! drift from what the programs print: the README's tour, and the book's
//! "Meltano on two hosts sharing S3" (support/transcript.rs runs them; a
//! missing Meltano or emulator fails the test, it is never skipped).

use crate::support::transcript::Transcript;
use anyhow::Result;

/// The README's five-minute tour, on `file://`, one host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_tour_prints_what_it_shows() -> Result<()> {
    let mut tour = Transcript::section("README.md", "## A five-minute tour")?;
    tour.instead("cargo build --release", None);
    tokio::task::spawn_blocking(move || tour.run()).await?
}
