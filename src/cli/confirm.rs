//! The line a verb that changes the daemon prints on stdout once the daemon answered `ok`: what
//! is now in force, so that an operator (or a script's log) sees that it worked without asking
//! `status`. Errors go to stderr as before; nothing here changes an exit code.

use crate::client::Client;
use crate::protocol::{Request, Response};

/// What a changing verb asked, kept for its confirmation.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Change {
    Scale { model: String },
    Drain { replica: String, force: bool },
    DrainModel { model: String },
    UndrainModel { model: String },
    Cordon { gpu: String, evacuate: bool },
    Uncordon { gpu: String },
    Reload,
}

impl Change {
    /// The change a request makes, for the requests that make one.
    pub(super) fn of(request: &Request) -> Option<Change> {
        Some(match request {
            Request::Scale { model, .. } => Change::Scale {
                model: model.clone(),
            },
            Request::Drain {
                replica: Some(replica),
                force,
                ..
            } => Change::Drain {
                replica: replica.clone(),
                force: *force,
            },
            Request::Drain {
                model: Some(model), ..
            } => Change::DrainModel {
                model: model.clone(),
            },
            Request::Undrain { model } => Change::UndrainModel {
                model: model.clone(),
            },
            Request::Cordon { gpu, evacuate, .. } => Change::Cordon {
                gpu: gpu.clone(),
                evacuate: *evacuate,
            },
            Request::Uncordon { gpu } => Change::Uncordon { gpu: gpu.clone() },
            Request::Reload {} => Change::Reload,
            _ => return None,
        })
    }
}

/// The confirmation of `change`, which the daemon accepted. A scale asks for the model's status
/// on the same connection to say what the bounds now are (overrides and file together); where
/// that fails the line says only that the change was taken.
pub(super) async fn line(change: &Change, client: &mut Client) -> String {
    match change {
        Change::Scale { model } => {
            let status = client
                .ask(&Request::Status {
                    model: Some(model.clone()),
                })
                .await;
            let view = match status {
                Ok(Ok(Response::Status { status })) => {
                    status.models.into_iter().find(|m| &m.name == model)
                }
                _ => None,
            };
            match view {
                Some(m) => format!(
                    "{model}: scaled: min {}, max {}, warm pool {}",
                    m.min, m.max, m.warm_pool
                ),
                None => format!("{model}: scaled"),
            }
        }
        Change::Drain { replica, force } => format!(
            "{replica}: draining{}: unrouted, it stops once its requests are done",
            if *force { " (forced)" } else { "" }
        ),
        Change::DrainModel { model } => format!(
            "{model}: drained off the balancers: front doors answer their agent checks `drain`; \
             its replicas keep serving what still arrives"
        ),
        Change::UndrainModel { model } => {
            format!("{model}: undrained: front doors answer their agent checks `ready` again")
        }
        Change::Cordon { gpu, evacuate } => format!(
            "{gpu}: cordoned: no new replica is placed on it{}",
            if *evacuate {
                "; its replicas are moving off"
            } else {
                ""
            }
        ),
        Change::Uncordon { gpu } => format!("{gpu}: uncordoned: replicas may be placed on it"),
        Change::Reload => "reloaded: the configuration file is in force".to_string(),
    }
}
