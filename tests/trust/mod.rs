//! The trust boundary (DESIGN invariant 7, docs/src/threats.md): what a member
//! of the socket's group, a user of the host or a lock directory's neighbour
//! may and may not do, through the socket, the shim and the `file://` layout.

pub mod access;
mod attach;
mod file;
mod file_layout;
mod reattach;
mod secrets;
mod shim;
mod socket;
