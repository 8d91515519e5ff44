//! What the client receives: a whole small answer the router made (errors, models, metrics), or a
//! replica's answer relayed frame by frame as it arrives, with no buffering. The relay holds the
//! request's slot: it is given back the moment the replica's answer ends, or when the client
//! leaves (the relay is dropped, and with it the connection to the replica, which cancels the
//! request there).
//!
//! Once a byte has reached the client a failure cannot be retried: an event stream (SSE) ends
//! with an OpenAI-style error event, anything else is cut off, so the client sees an incomplete
//! answer rather than a wrong one.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};

use super::pool::Conn;
use super::router::{Lease, Router};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub enum RouteBody {
    Full(Option<Bytes>),
    Relay(Box<Relay>),
}

impl RouteBody {
    pub fn full(b: impl Into<Bytes>) -> RouteBody {
        RouteBody::Full(Some(b.into()))
    }

    pub fn empty() -> RouteBody {
        RouteBody::Full(None)
    }
}

/// A replica's answer on its way to the client.
pub struct Relay {
    router: Arc<Router>,
    model: usize,
    status: u16,
    /// The first frame, read before the answer was committed to (so that a replica that fails
    /// before it can still be retried).
    first: Option<Frame<Bytes>>,
    upstream: Option<Incoming>,
    /// The replica connection, back to the pool when the answer was read to its end.
    conn: Option<Conn>,
    lease: Option<Lease>,
    sse: bool,
    /// The last two bytes sent, to end an event cut off mid-way before the error event.
    tail: [u8; 2],
    arrived: Instant,
    sent_upstream: Instant,
    first_byte_seen: bool,
    finished: bool,
}

impl Relay {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        router: Arc<Router>,
        model: usize,
        status: u16,
        first: Option<Frame<Bytes>>,
        upstream: Option<Incoming>,
        conn: Conn,
        lease: Lease,
        sse: bool,
        arrived: Instant,
        sent_upstream: Instant,
    ) -> Relay {
        let mut r = Relay {
            router,
            model,
            status,
            first,
            upstream,
            conn: Some(conn),
            lease: Some(lease),
            sse,
            tail: *b"\n\n",
            arrived,
            sent_upstream,
            first_byte_seen: false,
            finished: false,
        };
        if r.upstream.is_none() {
            // The whole answer is already here: the replica is done with it.
            r.upstream_done(true);
        }
        r
    }

    fn sent(&mut self, data: &Bytes) {
        if data.is_empty() {
            return;
        }
        if !self.first_byte_seen {
            self.first_byte_seen = true;
            self.router
                .metrics
                .first_byte(self.model, self.arrived.elapsed().as_secs_f64());
        }
        match data.len() {
            1 => self.tail = [self.tail[1], data[0]],
            n => self.tail = [data[n - 2], data[n - 1]],
        }
    }

    /// The replica's answer ended (completely, or not): the slot goes back now.
    fn upstream_done(&mut self, complete: bool) {
        self.upstream = None;
        self.lease = None;
        let conn = self.conn.take();
        if complete {
            if let Some(c) = conn {
                c.reuse();
            }
            self.router
                .metrics
                .upstream(self.model, self.sent_upstream.elapsed().as_secs_f64());
        }
    }

    fn finish(&mut self, status: u16) {
        if !self.finished {
            self.finished = true;
            self.router.metrics.request(Some(self.model), status);
        }
    }

    fn error_event(&self, message: &str) -> Bytes {
        // Close an event cut off mid-line or mid-event first, so the error is an event of its
        // own.
        let lead = event_lead(self.tail);
        let body = serde_json::json!({"error": {
            "message": message,
            "type": "server_error",
            "code": "upstream_failed",
        }});
        Bytes::from(format!("{lead}data: {body}\n\n"))
    }
}

impl Body for RouteBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            RouteBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            RouteBody::Relay(r) => r.poll(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RouteBody::Full(b) => b.is_none(),
            RouteBody::Relay(r) => r.ended(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RouteBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            RouteBody::Full(None) => SizeHint::with_exact(0),
            RouteBody::Relay(_) => SizeHint::default(),
        }
    }
}

impl Relay {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(f) = self.first.take() {
            if let Some(d) = f.data_ref() {
                let d = d.clone();
                self.sent(&d);
            }
            return Poll::Ready(Some(Ok(f)));
        }
        let Some(up) = self.upstream.as_mut() else {
            self.finish(self.status);
            return Poll::Ready(None);
        };
        match Pin::new(up).poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    let d = d.clone();
                    self.sent(&d);
                }
                // With a length, the server stops polling after the last byte: the end is
                // noticed here, not by a further poll.
                if self.upstream.as_ref().is_some_and(|u| u.is_end_stream()) {
                    self.upstream_done(true);
                }
                Poll::Ready(Some(Ok(f)))
            }
            Poll::Ready(None) => {
                self.upstream_done(true);
                self.finish(self.status);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                let replica = self
                    .lease
                    .as_ref()
                    .map(|l| l.grant.id.to_string())
                    .unwrap_or_default();
                let why = super::upstream::describe(&e);
                tracing::warn!(
                    model = %self.router.settings.models[self.model].name,
                    replica = %replica,
                    "answer cut off after bytes reached the client (not retried): {why}"
                );
                self.upstream_done(false);
                // The client got the status it got; the metric says the answer failed.
                self.finish(502);
                if self.sse {
                    let ev = self.error_event(&format!(
                        "the replica's answer was cut off mid-stream: {why}"
                    ));
                    return Poll::Ready(Some(Ok(Frame::data(ev))));
                }
                Poll::Ready(Some(Err(e.into())))
            }
        }
    }
}

impl Relay {
    /// Everything the client is to get has been handed over.
    fn ended(&self) -> bool {
        self.first.is_none() && self.upstream.is_none()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if self.ended() {
            self.finish(self.status);
        } else {
            // Dropped before the end: the client left. The lease and the replica connection go
            // with the relay (the replica sees its connection close and stops the request).
            self.finish(499);
        }
    }
}

/// What must precede an event so that it starts on an event boundary, after a stream whose last
/// two bytes were `tail`.
fn event_lead(tail: [u8; 2]) -> &'static str {
    match tail {
        [b'\n', b'\n'] => "",
        [_, b'\n'] => "\n",
        _ => "\n\n",
    }
}

#[cfg(test)]
mod tests {
    use super::event_lead;

    #[test]
    fn error_events_start_on_an_event_boundary() {
        assert_eq!(event_lead(*b"\n\n"), "");
        assert_eq!(event_lead(*b"}\n"), "\n");
        assert_eq!(event_lead(*b"ho"), "\n\n");
    }
}
