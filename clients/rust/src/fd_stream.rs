//! The connection to the agent, read with `recvmsg` so that descriptors the
//! agent passes with a frame (the run's locks, SPEC 5.4) are kept, not
//! discarded by the kernel as a plain `read` would.

use runlock_protocol::MAX_LOCKS_PER_MESSAGE;
use std::collections::VecDeque;
use std::io::{self, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::UnixStream;

/// A Unix stream to the agent that keeps the descriptors passed with its bytes.
pub struct FdStream {
    stream: UnixStream,
    /// Descriptors in the order they arrived, for whoever expects them.
    pub(crate) received: VecDeque<OwnedFd>,
}

impl FdStream {
    pub(crate) fn new(stream: UnixStream) -> FdStream {
        FdStream {
            stream,
            received: VecDeque::new(),
        }
    }
}

impl AsRawFd for FdStream {
    fn as_raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }
}

/// One `recvmsg`: the bytes it read, its descriptors queued (close-on-exec).
fn receive(fd: RawFd, into: &mut [u8], received: &mut VecDeque<OwnedFd>) -> io::Result<usize> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut space = nix::cmsg_space!([RawFd; MAX_LOCKS_PER_MESSAGE]);
    let mut iov = [IoSliceMut::new(into)];
    let message = recvmsg::<()>(fd, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
    for control in message.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = control {
            // SAFETY: the kernel just installed these descriptors for us alone.
            received.extend(
                fds.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    Ok(message.bytes)
}

impl AsyncRead for FdStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            ready!(this.stream.poll_read_ready(cx))?;
            let fd = this.stream.as_raw_fd();
            let unfilled = buf.initialize_unfilled();
            let received = &mut this.received;
            match this
                .stream
                .try_io(Interest::READABLE, || receive(fd, unfilled, received))
            {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
                Err(err) => return Poll::Ready(Err(err)),
            }
        }
    }
}

impl AsyncWrite for FdStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
