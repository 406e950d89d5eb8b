//! The pages whose commands are run as they are written, so that they cannot
//! drift from what the programs print: the README's tour, and the book's
//! "Meltano on two hosts sharing S3" (support/transcript runs them; a
//! missing Meltano or emulator fails the test, it is never skipped).

use crate::support::stores::{azure, Azure, Gcs, Postgres, Space, Store, S3};
use crate::support::transcript::Transcript;
use anyhow::Result;

/// The README's five-minute tour, on `file://`, one host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_tour_prints_what_it_shows() -> Result<()> {
    let mut tour = Transcript::section("README.md", "## A five-minute tour")?;
    tour.instead("cargo build --release", None);
    tokio::task::spawn_blocking(move || tour.run()).await?
}

/// The bucket (and container) the page names, in stores of the test's own,
/// so that the page's names are used as they are and every run starts empty.
const BUCKET: &str = "meltano-state";

/// Two hosts on one machine sharing moto as their S3; the last section's
/// stores on Azurite and fake-gcs-server of the test's own, and a fresh
/// database on the shared PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meltano_on_two_hosts_sharing_s3_goes_as_the_page_shows() -> Result<()> {
    let meltano = crate::support::meltano_installed("RUNLOCK_TEST_MELTANO")?;
    let (s3, azurite, gcs, postgres) = tokio::try_join!(
        S3.start_own(),
        Azure.start_own(),
        Gcs.start_own(),
        Space::create(Postgres, "book"),
    )?;
    tokio::try_join!(
        S3.create(&s3.endpoint, BUCKET),
        Azure.create(&azurite.endpoint, BUCKET),
        Gcs.create(&gcs.endpoint, BUCKET),
    )?;
    let azure_string = azure::connection_string_with_key(&azurite.endpoint.url, azure::KEY);

    let mut page = Transcript::page("docs/src/meltano-two-hosts.md")?;
    page.program("meltano", meltano)
        .env("MELTANO_SEND_ANONYMOUS_USAGE_STATS", "false")
        .env("MELTANO_DISABLE_TRACKING", "true");
    for (name, value) in S3.env(&s3.endpoint) {
        page.env(&name, &value);
    }
    // boto3 (Meltano's S3 store) takes its region from this one.
    page.env("AWS_DEFAULT_REGION", "us-east-1");
    for (name, value) in Gcs.env(&gcs.endpoint) {
        page.env(&name, &value);
    }
    let installed = None; // the test's builds and Meltano are on the PATH
    page.instead("pip install 'meltano[s3]'", installed)
        .instead("cargo build --release", installed)
        .instead("install -m 0755 target/release/", installed)
        // tests/scripts/meltano.sh installs this checkout's add-on into the test's Meltano.
        .instead("pip install clients/python clients/meltano", installed)
        .instead(
            "export MELTANO_STATE_BACKEND_AZURE_CONNECTION_STRING=",
            Some(&format!(
                "export MELTANO_STATE_BACKEND_AZURE_CONNECTION_STRING='{azure_string}'"
            )),
        )
        // fake-gcs-server (STORAGE_EMULATOR_HOST) takes no key.
        .instead("export GOOGLE_APPLICATION_CREDENTIALS=", None)
        .instead(
            "echo 'backend = \"postgresql://",
            Some(&format!(
                "echo 'backend = \"{}\"' > runlockd.toml",
                postgres.uri("")
            )),
        );
    let ran = tokio::task::spawn_blocking(move || page.run()).await?;
    drop((s3, azurite, gcs));
    ran
}
