//! The HTTP API: which path does what, and what a request must be before it is queued.
//!
//! - `POST /v1/chat/completions`, `/v1/completions`, `/v1/embeddings`: routed by the body's
//!   `model` (a model's name or an alias).
//! - `/m/{model}/{path}` (GET, POST): the model's server API, for the paths the model allows.
//! - `GET /v1/models`: the configured models (and aliases) and their state;
//!   `GET /v1/models/{id}`: one of them.
//! - `GET /metrics`, `GET /health`.
//!
//! With `api_keys`, everything but `/health` needs `Authorization: Bearer KEY`.

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use hyper::body::{Bytes, Incoming};
use hyper::header;
use hyper::{Method, Request, Response, StatusCode, Uri};
use serde_json::{json, Value};

use super::body;
use super::errors::{self, Failure};
use super::model_field::{model_of, replace_model};
use super::proxy;
use super::queue::ModelState;
use super::relay::RouteBody;
use super::router::Router;
use super::upstream;

const OPENAI_PATHS: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"];

/// Who sent a request: its address (canonical: an IPv4 client of a dual-stack listener is its
/// IPv4 address), and whether that is one of `trusted_proxies`.
#[derive(Debug, Clone, Copy)]
pub struct Client {
    pub ip: IpAddr,
    pub trusted: bool,
}

pub async fn handle(
    router: Arc<Router>,
    req: Request<Incoming>,
    client: Client,
) -> Result<Response<RouteBody>, Infallible> {
    let arrived = Instant::now();
    let path = req.uri().path();
    if path == "/health" {
        return Ok(health(&router, req.method()));
    }
    if !errors::authorized(
        &router.settings.api_keys,
        req.headers().get(header::AUTHORIZATION),
    ) {
        router.metrics.request(None, 401);
        return Ok(errors::error(
            Failure::Unauthorized,
            "a valid API key is required: Authorization: Bearer KEY",
        ));
    }
    let resp = match (req.method(), path) {
        (&Method::GET, "/metrics") => errors::text_response(
            StatusCode::OK,
            crate::openmetrics::CONTENT_TYPE,
            router.metrics.render(
                router.states(),
                router.is_daemon_connected(),
                router.drain_phases(),
            ),
        ),
        (&Method::GET, "/v1/models") => models(&router),
        (&Method::GET, p) if p.starts_with("/v1/models/") => {
            model(&router, &p["/v1/models/".len()..])
        }
        (&Method::POST, p) if OPENAI_PATHS.contains(&p) => {
            openai(&router, req, client, arrived).await
        }
        (_, p)
            if OPENAI_PATHS.contains(&p)
                || p == "/v1/models"
                || p.starts_with("/v1/models/")
                || p == "/metrics" =>
        {
            errors::error(
                Failure::MethodNotAllowed,
                format!("{p}: method not allowed"),
            )
        }
        (_, p) if p.starts_with("/m/") => prefix(&router, req, client, arrived).await,
        (_, p) => {
            router.metrics.request(None, 404);
            errors::error(Failure::NotFound, format!("no route for {p}"))
        }
    };
    Ok(resp)
}

fn health(router: &Router, method: &Method) -> Response<RouteBody> {
    if method != Method::GET && method != Method::HEAD {
        return errors::error(Failure::MethodNotAllowed, "/health: method not allowed");
    }
    let daemon = if router.is_daemon_connected() {
        "connected"
    } else {
        "disconnected"
    };
    // The router serves while the daemon is away (on the routed set it last saw): healthy.
    errors::json_response(StatusCode::OK, &json!({"status": "ok", "daemon": daemon}))
}

/// One entry of `/v1/models`: a model (or an alias of one) and its state here.
fn model_entry(router: &Router, states: &[ModelState], id: &str, model: usize) -> Value {
    let s = &states[model];
    let cap = router.capacity(model);
    let (warm, asleep) = cap.map_or((0, 0), |c| (c.warm, c.asleep));
    // Where a request finds it: awake and routed, ready in the pool (milliseconds), asleep (a
    // wake: seconds), or none of these (a cold start); unknown until the daemon said.
    let tier = match (s.routed, warm, asleep) {
        (1.., _, _) => "routed",
        (0, 1.., _) => "warm",
        (0, 0, 1..) => "asleep",
        _ if cap.is_none() => "unknown",
        _ => "cold",
    };
    let mut hearth = json!({
        "state": if s.routed > 0 { "serving" } else { "waiting" },
        "tier": tier,
        "warm": warm,
        "asleep": asleep,
        "routed": s.routed,
        "slots": s.slots,
        "in_flight": s.running,
        "queue_depth": s.queue_depth,
        "oldest_wait_ms": s.oldest_wait.as_millis() as u64,
    });
    if id != s.name {
        hearth["alias_of"] = Value::String(s.name.clone());
    }
    json!({
        "id": id,
        "object": "model",
        "created": router.started_unix,
        "owned_by": "hearth",
        "hearth": hearth,
    })
}

fn models(router: &Router) -> Response<RouteBody> {
    let states = router.states();
    let mut data: Vec<Value> = router
        .settings
        .models
        .iter()
        .enumerate()
        .map(|(i, m)| model_entry(router, &states, &m.name, i))
        .collect();
    for (alias, target) in &router.settings.aliases {
        if let Some(i) = router.settings.resolve(target) {
            data.push(model_entry(router, &states, alias, i));
        }
    }
    errors::json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{id}`: a model or an alias, as `/v1/models` lists it. The id is the rest of
/// the path, percent-decoded (ids may hold a slash, as Hugging Face names do).
fn model(router: &Router, id: &str) -> Response<RouteBody> {
    let id = percent_decode(id);
    match id
        .as_deref()
        .and_then(|id| Some((id, router.settings.resolve(id)?)))
    {
        Some((id, i)) => {
            let states = router.states();
            errors::json_response(StatusCode::OK, &model_entry(router, &states, id, i))
        }
        None => {
            router.metrics.request(None, 404);
            errors::error(
                Failure::UnknownModel,
                format!(
                    "the model {:?} does not exist",
                    id.as_deref().unwrap_or("(not UTF-8)")
                ),
            )
        }
    }
}

/// `%XX` escapes decoded; None when they do not make UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// An OpenAI endpoint: the body names the model.
async fn openai(
    router: &Arc<Router>,
    req: Request<Incoming>,
    client: Client,
    arrived: Instant,
) -> Response<RouteBody> {
    let (parts, body) = req.into_parts();
    let body = match body::read(router, client, &parts.headers, body).await {
        Ok(b) => b,
        Err(resp) => return counted(router, None, resp),
    };
    let (name, span) = match model_of(&body.bytes) {
        Ok(x) => x,
        Err(e) => return counted(router, None, errors::error(Failure::BadJson, e.to_string())),
    };
    let Some(model) = router.settings.resolve(&name) else {
        return counted(
            router,
            None,
            errors::error(
                Failure::UnknownModel,
                format!("the model {name:?} does not exist"),
            ),
        );
    };
    let canonical = &router.settings.models[model].name;
    let body = if canonical.as_str() != name {
        let renamed = Bytes::from(replace_model(&body.bytes, span, canonical));
        body.replace(renamed)
    } else {
        body
    };
    let uri = upstream::origin_form(&parts.uri);
    proxy::forward(
        router,
        model,
        parts.method,
        uri,
        parts.headers,
        body,
        arrived,
    )
    .await
}

/// `/m/{model}/{path}`: the model's own server API, for the paths it allows.
async fn prefix(
    router: &Arc<Router>,
    req: Request<Incoming>,
    client: Client,
    arrived: Instant,
) -> Response<RouteBody> {
    let path = req.uri().path();
    let rest = &path["/m/".len()..];
    let (name, server_path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let Some(model) = router.settings.resolve(name) else {
        return counted(
            router,
            None,
            errors::error(
                Failure::UnknownModel,
                format!("the model {name:?} does not exist"),
            ),
        );
    };
    if req.method() != Method::GET && req.method() != Method::POST {
        return counted(
            router,
            Some(model),
            errors::error(
                Failure::MethodNotAllowed,
                "the prefix route takes GET and POST",
            ),
        );
    }
    let m = &router.settings.models[model];
    if !m.paths.allows(server_path) {
        return counted(
            router,
            Some(model),
            errors::error(
                Failure::NotFound,
                format!(
                    "{server_path:?} is not a path /m/{}/ passes (allowed: {})",
                    m.name,
                    if m.paths.is_empty() {
                        "none".to_string()
                    } else {
                        m.paths.to_string()
                    }
                ),
            ),
        );
    }
    // `/m/{model}` alone asks for the server's root.
    let target = if server_path.is_empty() {
        "/"
    } else {
        server_path
    };
    let pq = match req.uri().query() {
        Some(q) => format!("{target}?{q}"),
        None => target.to_string(),
    };
    let uri = match Uri::try_from(pq) {
        Ok(u) => u,
        Err(e) => {
            return counted(
                router,
                Some(model),
                errors::error(Failure::BadRequest, format!("cannot forward: {e}")),
            )
        }
    };
    let (parts, body) = req.into_parts();
    let body = match body::read(router, client, &parts.headers, body).await {
        Ok(b) => b,
        Err(resp) => return counted(router, Some(model), resp),
    };
    proxy::forward(
        router,
        model,
        parts.method,
        uri,
        parts.headers,
        body,
        arrived,
    )
    .await
}

fn counted(
    router: &Router,
    model: Option<usize>,
    resp: Response<RouteBody>,
) -> Response<RouteBody> {
    router.metrics.request(model, resp.status().as_u16());
    resp
}
