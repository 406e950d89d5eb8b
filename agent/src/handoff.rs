//! Sends a frame with descriptors riding on its bytes (`SCM_RIGHTS`): how the
//! run receives the kernel locks it holds itself (SPEC 5.4).

use runlock_protocol::MAX_LOCKS_PER_MESSAGE;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use tokio::io::Interest;
use tokio::net::UnixStream;

/// Writes all of `frame`, passing `fds` with its first bytes: at most
/// [`MAX_LOCKS_PER_MESSAGE`] per message, one byte per message while more
/// remain, so that every batch has bytes of this frame to ride on.
pub async fn send_with_fds(stream: &UnixStream, frame: &[u8], fds: &[OwnedFd]) -> io::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let mut batches = raw.chunks(MAX_LOCKS_PER_MESSAGE).peekable();
    let mut sent = 0;
    while sent < frame.len() {
        let batch = batches.next().unwrap_or(&[]);
        let end = if batches.peek().is_some() {
            sent + 1
        } else {
            frame.len()
        };
        sent += send_part(stream, &frame[sent..end], batch).await?;
    }
    Ok(())
}

async fn send_part(stream: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    loop {
        stream.writable().await?;
        let written = stream.try_io(Interest::WRITABLE, || {
            let iov = [IoSlice::new(bytes)];
            let rights = [ControlMessage::ScmRights(fds)];
            let control: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
            sendmsg::<()>(
                stream.as_raw_fd(),
                &iov,
                control,
                MsgFlags::MSG_NOSIGNAL,
                None,
            )
            .map_err(io::Error::from)
        });
        match written {
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
            result => return result,
        }
    }
}
