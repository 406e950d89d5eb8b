//! What a failure talking to PostgreSQL means: worth another try (the
//! connection dropped, the server is starting) or not (wrong password, no such
//! database, no permission), said in words that name the server and what to
//! check, never the password.

use super::settings::Settings;
pub use crate::backend::failure::Failure;
use crate::backend::StoreObserver;
use std::error::Error as _;
use tokio_postgres::error::SqlState;

/// Whether `err` says the lock table, its schema or a column of it is missing.
#[cfg(feature = "postgres")]
pub fn missing_table(err: &tokio_postgres::Error) -> bool {
    // A missing column: a table made by an agent that kept no history.
    matches!(
        err.code(),
        Some(c) if *c == SqlState::UNDEFINED_TABLE
            || *c == SqlState::INVALID_SCHEMA_NAME
            || *c == SqlState::UNDEFINED_COLUMN
    )
}

/// Whether `err` says this role may not do something.
#[cfg(feature = "postgres")]
pub fn denied(err: &tokio_postgres::Error) -> bool {
    err.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE)
}

/// Classifies `err`, met while talking to the server `settings` names;
/// tells `observer` when the server is overloaded.
pub fn classify(
    err: &tokio_postgres::Error,
    settings: &Settings,
    observer: &dyn StoreObserver,
) -> Failure {
    let at = settings.shown();
    if let Some(db) = err.as_db_error() {
        let code = db.code();
        let said = db.message();
        let class = &code.code()[..2];
        return if *code == SqlState::INVALID_PASSWORD
            || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
        {
            Failure::Refused(format!(
                "PostgreSQL at {at} refused the login: {said}: check the user and password \
                 (in the URI, or PGUSER and PGPASSWORD) and the server's pg_hba.conf"
            ))
        } else if *code == SqlState::INVALID_CATALOG_NAME {
            Failure::Refused(format!(
                "PostgreSQL at {at}: {said}: create it, or name another database in the URI"
            ))
        } else if class == "08"
            || class == "53"
            || class == "57"
            || class == "40"
            || *code == SqlState::LOCK_NOT_AVAILABLE
            || *code == SqlState::UNDEFINED_TABLE
            || *code == SqlState::INVALID_SCHEMA_NAME
        {
            // Connection trouble, overload, shutdown or restart, a cancelled
            // statement, a serialization failure; or the table went away and
            // the next connection makes it again.
            if class == "53" {
                observer.throttled("postgresql");
            }
            Failure::Transient(format!("PostgreSQL at {at}: {said}"))
        } else {
            Failure::Refused(format!(
                "PostgreSQL at {at}: {said} (SQLSTATE {})",
                code.code()
            ))
        };
    }
    if err.is_closed() {
        return Failure::Transient(format!("the connection to PostgreSQL at {at} closed"));
    }
    // tokio-postgres's own words, and the cause beneath them (an I/O or TLS error).
    let mut said = err.to_string();
    if let Some(source) = err.source() {
        said = format!("{said}: {source}");
    }
    let io = err
        .source()
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .map(std::io::Error::kind);
    if said.contains("password missing") {
        return Failure::Refused(format!(
            "PostgreSQL at {at} asks for a password and none is given: put it in the URI or \
             set PGPASSWORD"
        ));
    }
    if said.contains("does not support TLS") {
        return Failure::Refused(format!(
            "PostgreSQL at {at} does not offer TLS, which sslmode asks for: use \
             sslmode=prefer or disable, or turn on ssl in the server"
        ));
    }
    if said.contains("TLS") || said.contains("certificate") {
        return Failure::Refused(format!(
            "TLS with PostgreSQL at {at} failed: {said}: check sslmode and sslrootcert"
        ));
    }
    match io {
        Some(std::io::ErrorKind::ConnectionRefused) => Failure::Transient(format!(
            "PostgreSQL at {at} refused the connection: check that the server runs and \
             listens there"
        )),
        Some(std::io::ErrorKind::NotFound) if at.contains(".s.PGSQL.") => {
            Failure::Transient(format!(
                "no PostgreSQL socket at {at}: check that the server runs, or set the host \
                 (the URI, or PGHOST)"
            ))
        }
        _ => Failure::Transient(format!("cannot reach PostgreSQL at {at}: {said}")),
    }
}
