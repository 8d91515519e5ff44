//! Request bodies, read whole before a request is queued (the model is in the body, and a retry
//! sends it again): at most `max_body` for one request, at most `max_buffered` for all of them
//! together and at most `max_buffered_per_client` for those of one client address (but a
//! trusted proxy's), counted as the bytes arrive and held until the request is done with its
//! body. A request that would cross a bound is refused at once rather than waiting: it holds a
//! connection, and the bytes it would wait for are other clients'. The bound per address keeps
//! a client that stalls its uploads from taking the whole budget from everyone else.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderMap};
use hyper::Response;
use tokio::sync::OwnedSemaphorePermit;

use super::api::Client;
use super::errors::{self, Failure};
use super::relay::RouteBody;
use super::router::Router;

/// A client has this long to send its whole body once its headers are in.
const BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// The shared bound is counted in units of this many bytes.
pub const UNIT: usize = 1024;

/// A body, and its share of `max_buffered` and of its client's bound (given back when
/// dropped).
pub struct Buffered {
    pub bytes: Bytes,
    _held: Option<OwnedSemaphorePermit>,
    _client: Option<ClientHold>,
}

impl Buffered {
    /// The same share of the bounds, for other bytes of about the same length (the body with
    /// its model renamed).
    pub fn replace(self, bytes: Bytes) -> Buffered {
        Buffered { bytes, ..self }
    }
}

/// What each client address holds of request bodies, in units; an address holding nothing has
/// no entry, so the table is never larger than the connections open.
pub struct ClientBodies {
    /// `max_buffered_per_client` in units.
    limit: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

impl ClientBodies {
    pub fn new(max_per_client: usize) -> Arc<ClientBodies> {
        Arc::new(ClientBodies {
            limit: max_per_client.div_ceil(UNIT),
            held: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        // Each holder changes one counter in one step: nothing is left half-done by a panic.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `units` more for `ip`, unless that takes the address over its bound.
    fn take(self: &Arc<Self>, hold: &mut Option<ClientHold>, ip: IpAddr, units: usize) -> bool {
        let mut held = self.lock();
        let now = held.get(&ip).copied().unwrap_or(0);
        if now + units > self.limit {
            return false;
        }
        held.insert(ip, now + units);
        drop(held);
        let h = hold.get_or_insert_with(|| ClientHold {
            table: self.clone(),
            ip,
            units: 0,
        });
        h.units += units;
        true
    }

    /// Units the address holds now.
    pub fn held_by(&self, ip: IpAddr) -> usize {
        self.lock().get(&ip).copied().unwrap_or(0)
    }
}

/// One body's units in its client's count.
struct ClientHold {
    table: Arc<ClientBodies>,
    ip: IpAddr,
    units: usize,
}

impl Drop for ClientHold {
    fn drop(&mut self) {
        let mut held = self.table.lock();
        if let Some(n) = held.get_mut(&self.ip) {
            *n = n.saturating_sub(self.units);
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

/// Reads the whole body within the bounds; the error is the answer to give.
pub async fn read(
    router: &Router,
    client: Client,
    headers: &HeaderMap,
    body: Incoming,
) -> Result<Buffered, Response<RouteBody>> {
    let max = router.settings.max_body;
    let too_large = || {
        errors::error(
            Failure::TooLarge,
            format!("the body is larger than {max} bytes"),
        )
    };
    // A declared length over the limit is refused before a byte of it is read.
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > max as u64 {
            return Err(too_large());
        }
    }
    let read = async {
        let mut body = body;
        // Most bodies come in one piece: a list only for the others.
        let mut first: Option<Bytes> = None;
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut len = 0usize;
        let mut held: Option<OwnedSemaphorePermit> = None;
        let mut client_held: Option<ClientHold> = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                errors::error(Failure::BadRequest, format!("reading the body: {e}"))
            })?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if len + data.len() > max {
                return Err(too_large());
            }
            len += data.len();
            let units = len.div_ceil(UNIT);
            let have = held.as_ref().map_or(0, |p| p.num_permits());
            if units > have {
                if !client.trusted
                    && !router
                        .client_bodies
                        .take(&mut client_held, client.ip, units - have)
                {
                    return Err(errors::client_overloaded(format!(
                        "this client address ({}) holds as many request bodies as one address \
                         may (route.max_buffered_per_client); retry when they are done",
                        client.ip
                    )));
                }
                let more = u32::try_from(units - have).unwrap_or(u32::MAX);
                let Ok(p) = router.body_budget.clone().try_acquire_many_owned(more) else {
                    return Err(errors::error(
                        Failure::Busy,
                        "the router holds as many request bodies as it may \
                         (route.max_buffered); retry later",
                    ));
                };
                match held.as_mut() {
                    Some(h) => h.merge(p),
                    None => held = Some(p),
                }
            }
            match first.take() {
                None if chunks.is_empty() => first = Some(data),
                f => {
                    chunks.extend(f);
                    chunks.push(data);
                }
            }
        }
        let bytes = match first {
            Some(b) => b,
            None if chunks.is_empty() => Bytes::new(),
            None => Bytes::from(chunks.concat()),
        };
        Ok(Buffered {
            bytes,
            _held: held,
            _client: client_held,
        })
    };
    // A small body usually came with the head: read at once, with no timer to set and cancel.
    let mut read = std::pin::pin!(read);
    if let Poll::Ready(r) = std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await {
        return r;
    }
    match tokio::time::timeout(BODY_TIMEOUT, read).await {
        Ok(r) => r,
        Err(_) => Err(errors::error(
            Failure::BodyTimeout,
            format!(
                "the body did not arrive within {}",
                crate::units::format_duration(BODY_TIMEOUT)
            ),
        )),
    }
}
