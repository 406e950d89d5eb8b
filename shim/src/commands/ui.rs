//! `runlock ui [--listen ADDR]`: handed over to `runlock-ui`, the program
//! that serves the page, so that the shim every run starts links no HTTP
//! server. It is looked for beside this binary (a build, a wheel, a
//! tarball, `cargo install`), then where the Debian package puts it.

use crate::exit::{Failure, EXIT_SOFTWARE};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const PROGRAM: &str = "runlock-ui";

/// Replaces this process with `runlock-ui`; returns only if that failed.
pub fn run(socket: &Path, listen: SocketAddr) -> Failure {
    let places = match places() {
        Ok(places) => places,
        Err(failure) => return failure,
    };
    let Some(program) = places.iter().find(|place| place.is_file()) else {
        let looked: Vec<String> = places.iter().map(|p| p.display().to_string()).collect();
        return Failure::new(
            EXIT_SOFTWARE,
            format!(
                "runlock ui: {PROGRAM}, the program that serves the page, is not installed \
                 (looked for {})",
                looked.join(" and ")
            ),
        );
    };
    let err = Command::new(program)
        .arg("--socket")
        .arg(socket)
        .arg("--listen")
        .arg(listen.to_string())
        .exec();
    Failure::new(
        EXIT_SOFTWARE,
        format!("runlock ui: cannot start {}: {err}", program.display()),
    )
}

/// Where `runlock-ui` may be, in the order looked.
fn places() -> Result<Vec<PathBuf>, Failure> {
    let exe = std::env::current_exe().map_err(|err| {
        Failure::new(
            EXIT_SOFTWARE,
            format!("runlock ui: cannot find this program's path: {err}"),
        )
    })?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    Ok(vec![
        dir.join(PROGRAM),
        dir.join("../libexec/runlock").join(PROGRAM),
    ])
}
