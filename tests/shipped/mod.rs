//! What ships beside the binaries, checked against them: the README's and
//! the book's commands, the man pages, the systemd units, the deployment
//! examples, the Rust client's example and the Debian package.

mod book;
mod client_example;
pub mod deploy;
mod man_pages;
mod package;
pub mod systemd;
