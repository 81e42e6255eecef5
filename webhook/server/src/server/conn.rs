//! A header-read deadline that starts with a request's first byte.
//!
//! hyper's own `header_read_timeout` starts as soon as it waits for a request head, idle
//! keep-alive time included, so it can only serve as the idle timeout: the API server keeps
//! connections open between requests and must not be cut off. This wrapper adds the other half:
//! once a request's first bytes arrive, its head must be complete within `header_timeout`, which
//! bounds a client trickling a header (slowloris) without shortening the idle time.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

const IDLE: u8 = 0;
const HEAD: u8 = 1;
const BUSY: u8 = 2;

/// Where a connection is in its request cycle, shared by the I/O wrapper and the service, and
/// since when it has been idle (what the drain asks).
#[derive(Debug)]
pub(crate) struct RequestPhase {
    phase: AtomicU8,
    origin: Instant,
    /// Milliseconds from `origin` to the end of the last answer.
    idle_since: AtomicU64,
}

impl Default for RequestPhase {
    fn default() -> Self {
        RequestPhase {
            phase: AtomicU8::new(IDLE),
            origin: Instant::now(),
            idle_since: AtomicU64::new(0),
        }
    }
}

impl RequestPhase {
    /// hyper parsed a head and called the service: the header deadline no longer applies.
    pub(crate) fn busy(&self) {
        self.phase.store(BUSY, Ordering::Relaxed);
    }

    /// The service answered; the next bytes start a new request.
    pub(crate) fn idle(&self) {
        let since = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.idle_since.store(since, Ordering::Relaxed);
        self.phase.store(IDLE, Ordering::Relaxed);
    }

    /// How long the connection has waited for its next request; `None` while one is under way.
    pub(crate) fn idle_for(&self) -> Option<Duration> {
        if self.phase.load(Ordering::Relaxed) != IDLE {
            return None;
        }
        let since = Duration::from_millis(self.idle_since.load(Ordering::Relaxed));
        Some(self.origin.elapsed().saturating_sub(since))
    }
}

pub(crate) struct HeaderDeadline<S> {
    inner: S,
    phase: Arc<RequestPhase>,
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl<S> HeaderDeadline<S> {
    pub(crate) fn new(inner: S, phase: Arc<RequestPhase>, timeout: Duration) -> Self {
        HeaderDeadline {
            inner,
            phase,
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for HeaderDeadline<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before
                    && this
                        .phase
                        .phase
                        .compare_exchange(IDLE, HEAD, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok()
                {
                    this.deadline.as_mut().reset(Instant::now() + this.timeout);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                if this.phase.phase.load(Ordering::Relaxed) == HEAD
                    && this.deadline.as_mut().poll(cx).is_ready()
                {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the request head did not arrive in time",
                    )));
                }
                Poll::Pending
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for HeaderDeadline<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
