//! How a component's response leaves the host, as in Spin's HTTP trigger.
//!
//! Spin hands the response head to the connection the moment the component calls
//! `response-outparam.set`, and streams the body as the component writes it; it sets no
//! `TCP_NODELAY` on accepted connections. So a component that sets its response first and
//! writes the body after (what spin-sdk's `#[http_component]` does for a returned response)
//! sends head and body as two TCP segments, and on a keep-alive connection the second waits
//! for the client's delayed ACK (Nagle): about 40 ms per answer on Linux.
//!
//! Whether the body reaches the connection before hyper flushes the head is a race in Spin; the
//! host settles it the way it goes under Spin: [`at_set`] takes what the body holds when the
//! response is set, and if the body was not finished then, the rest follows only after the head
//! has been flushed. A component that writes and finishes its body before setting the response
//! gets head and body in one write.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;
use wasmtime_wasi_http::Error;

/// A response body as it stood when the component set the response, then the rest.
pub struct SetBody {
    inner: HyperOutgoingBody,
    /// Frames the component had written before it set the response.
    ready: VecDeque<Frame<Bytes>>,
    /// An error the body had already ended with.
    failed: Option<Error>,
    /// The component had finished the body before it set the response.
    ended: bool,
    /// The rest has yet to wait for the head's flush.
    hold: bool,
}

/// Takes a response at `response-outparam.set`: the body's frames already written (without
/// waiting for more), and whether it was finished. Returns the response to serve and that flag.
pub fn at_set(
    response: hyper::Response<HyperOutgoingBody>,
) -> (hyper::Response<HyperOutgoingBody>, bool) {
    let (parts, mut inner) = response.into_parts();
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut ready = VecDeque::new();
    let mut failed = None;
    let mut ended = false;
    loop {
        match Pin::new(&mut inner).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => ready.push_back(frame),
            Poll::Ready(Some(Err(e))) => {
                failed = Some(e);
                break;
            }
            Poll::Ready(None) => {
                ended = true;
                break;
            }
            Poll::Pending => break,
        }
    }
    let complete = ended || failed.is_some();
    let body = SetBody {
        inner,
        ready,
        failed,
        ended,
        hold: !complete,
    };
    (
        hyper::Response::from_parts(parts, body.boxed_unsync()),
        complete,
    )
}

impl Body for SetBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        if let Some(frame) = self.ready.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if let Some(e) = self.failed.take() {
            return Poll::Ready(Some(Err(e)));
        }
        if self.ended {
            return Poll::Ready(None);
        }
        if self.hold {
            // The body was not finished at `set`: hyper flushes the head (and what was
            // written before) now, and polls again for the rest.
            self.hold = false;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.ready.is_empty() && self.failed.is_none() && self.ended
    }

    fn size_hint(&self) -> SizeHint {
        if self.ended || !self.ready.is_empty() {
            SizeHint::default()
        } else {
            self.inner.size_hint()
        }
    }
}
