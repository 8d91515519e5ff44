//! The toy server's sleep endpoints, in the shapes of the servers hearth puts to sleep: vLLM's
//! sleep mode (`POST /sleep?level=N`, `POST /wake_up`, `GET /is_sleeping`, and the level-2
//! wake's `POST /collective_rpc` and `POST /reset_prefix_cache`) and SGLang's memory saver
//! (`POST /pause_generation`, `/release_memory_occupation`, `/resume_memory_occupation`,
//! `/continue_generation`). Falling asleep takes `--sleep-time` and waking `--wake-time`; while
//! asleep (or on the way) completions are refused with 503 and `/health` stays 200, as vLLM
//! does. `--hold-memory` is memory held (allocated and touched) while awake and freed while
//! asleep, so the process's RSS shows the difference a real server's weights make.

use std::sync::Mutex;
use std::time::Duration;

use hyper::{Method, Response, StatusCode};
use serde_json::json;

use super::api::failure;
use super::http::{json_response, ToyBody};
use super::State;

/// Bytes between the writes that make the kernel back held memory with real pages.
const PAGE: usize = 4096;

#[derive(Debug, Default)]
struct Phase {
    asleep: bool,
    /// Falling asleep or waking: neither serving nor asleep yet.
    moving: bool,
    /// SGLang's `pause_generation` until `continue_generation`.
    paused: bool,
    /// `--hold-memory`, while awake.
    held: Option<Vec<u8>>,
}

/// Whether the server sleeps, and what it holds while awake.
pub(super) struct Sleeper {
    sleep_time: Duration,
    wake_time: Duration,
    hold_bytes: usize,
    phase: Mutex<Phase>,
    /// One sleep or wake at a time, as a real server's engine does them.
    turn: tokio::sync::Mutex<()>,
}

impl Sleeper {
    pub(super) fn new(sleep_time: Duration, wake_time: Duration, hold_bytes: u64) -> Sleeper {
        Sleeper {
            sleep_time,
            wake_time,
            hold_bytes: usize::try_from(hold_bytes).unwrap_or(usize::MAX),
            phase: Mutex::new(Phase::default()),
            turn: tokio::sync::Mutex::new(()),
        }
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the `--hold-memory` (at start, and on each wake).
    pub(super) async fn hold(&self) {
        if self.hold_bytes == 0 || self.phase().held.is_some() {
            return;
        }
        let n = self.hold_bytes;
        let held = tokio::task::spawn_blocking(move || {
            let mut v = vec![0u8; n];
            // Zeroed pages are mapped lazily: a write to each makes them resident.
            v.iter_mut().step_by(PAGE).for_each(|b| *b = 1);
            v
        })
        .await
        .ok();
        self.phase().held = held;
    }

    /// Why completions are refused now, if they are.
    pub(super) fn refusal(&self) -> Option<&'static str> {
        let p = self.phase();
        if p.asleep {
            Some("the model is asleep")
        } else if p.moving {
            Some("the model is falling asleep or waking")
        } else if p.paused {
            Some("generation is paused")
        } else {
            None
        }
    }

    pub(super) fn asleep(&self) -> bool {
        self.phase().asleep
    }

    async fn fall_asleep(&self) {
        let _turn = self.turn.lock().await;
        {
            let mut p = self.phase();
            if p.asleep {
                return;
            }
            p.moving = true;
        }
        tokio::time::sleep(self.sleep_time).await;
        let mut p = self.phase();
        p.held = None;
        p.asleep = true;
        p.moving = false;
    }

    async fn wake(&self) {
        let _turn = self.turn.lock().await;
        {
            let mut p = self.phase();
            if !p.asleep {
                return;
            }
            p.moving = true;
        }
        tokio::time::sleep(self.wake_time).await;
        self.hold().await;
        let mut p = self.phase();
        p.asleep = false;
        p.moving = false;
    }
}

/// The answer to a sleep route, or None when `req` is not one.
pub(super) async fn route(
    state: &State,
    method: &Method,
    path: &str,
    query: Option<&str>,
) -> Option<Response<ToyBody>> {
    let s = &state.sleeper;
    let done = || json_response(StatusCode::OK, json!({}));
    Some(match (method, path) {
        (&Method::POST, "/sleep") => match level(query) {
            Ok(_) => {
                s.fall_asleep().await;
                done()
            }
            Err(why) => failure(
                StatusCode::BAD_REQUEST,
                &why,
                "invalid_request_error",
                Some("level"),
                None,
            ),
        },
        (&Method::POST, "/wake_up" | "/resume_memory_occupation") => {
            s.wake().await;
            done()
        }
        (&Method::GET, "/is_sleeping") => {
            json_response(StatusCode::OK, json!({"is_sleeping": s.asleep()}))
        }
        // A level-2 wake's steps: the toy's weights come back with it.
        (&Method::POST, "/collective_rpc" | "/reset_prefix_cache") => done(),
        (&Method::POST, "/pause_generation") => {
            s.phase().paused = true;
            done()
        }
        (&Method::POST, "/continue_generation") => {
            s.phase().paused = false;
            done()
        }
        (&Method::POST, "/release_memory_occupation") => {
            // SGLang releases only with nothing in flight.
            let q = state.queue.stats();
            if q.running + q.waiting > 0 {
                failure(
                    StatusCode::BAD_REQUEST,
                    "requests are in flight: pause generation and let them finish first",
                    "invalid_request_error",
                    None,
                    None,
                )
            } else {
                s.fall_asleep().await;
                done()
            }
        }
        _ => return None,
    })
}

/// vLLM's `level` (1 when absent).
fn level(query: Option<&str>) -> Result<u8, String> {
    let Some(v) = query
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("level="))
    else {
        return Ok(1);
    };
    match v {
        "1" => Ok(1),
        "2" => Ok(2),
        other => Err(format!("level must be 1 or 2, not {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_server::{args, Server};
    use super::*;
    use crate::toy_server::ToyArgs;
    use std::time::Instant;

    async fn post(s: &Server, path: &str) -> u16 {
        s.http
            .post(format!("{}{path}", s.base))
            .body("{}")
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    #[test]
    fn level_is_one_or_two() {
        assert_eq!(level(None), Ok(1));
        assert_eq!(level(Some("level=2")), Ok(2));
        assert_eq!(level(Some("x=1&level=1")), Ok(1));
        assert!(level(Some("level=3")).is_err());
    }

    #[tokio::test]
    async fn vllm_sleep_refuses_completions_keeps_health_and_wakes() {
        let s = Server::start(
            ToyArgs {
                service_time: Duration::from_millis(10),
                sleep_time: Duration::from_millis(300),
                wake_time: Duration::from_millis(400),
                hold_memory: 8 << 20,
                ..args()
            },
            None,
        )
        .await;
        assert_eq!(
            s.get("/is_sleeping").await.unwrap().1,
            r#"{"is_sleeping":false}"#
        );
        let t = Instant::now();
        assert_eq!(post(&s, "/sleep?level=1").await, 200);
        assert!(t.elapsed() >= Duration::from_millis(300));
        assert_eq!(
            s.get("/is_sleeping").await.unwrap().1,
            r#"{"is_sleeping":true}"#
        );
        assert_eq!(s.get("/health").await.unwrap().0, 200);
        assert_eq!(s.complete("{}").await.unwrap().0, 503);
        assert_eq!(post(&s, "/sleep?level=7").await, 400);
        let t = Instant::now();
        assert_eq!(post(&s, "/wake_up").await, 200);
        assert!(t.elapsed() >= Duration::from_millis(400));
        assert_eq!(
            s.get("/is_sleeping").await.unwrap().1,
            r#"{"is_sleeping":false}"#
        );
        assert_eq!(s.complete("{}").await.unwrap().0, 200);
        s.stop().await.unwrap();
    }

    #[tokio::test]
    async fn sglang_pauses_releases_resumes_and_continues() {
        let s = Server::start(
            ToyArgs {
                service_time: Duration::from_millis(10),
                ..args()
            },
            None,
        )
        .await;
        assert_eq!(post(&s, "/pause_generation").await, 200);
        assert_eq!(s.complete("{}").await.unwrap().0, 503);
        assert_eq!(post(&s, "/release_memory_occupation").await, 200);
        assert_eq!(
            s.get("/is_sleeping").await.unwrap().1,
            r#"{"is_sleeping":true}"#
        );
        assert_eq!(post(&s, "/resume_memory_occupation").await, 200);
        assert_eq!(s.complete("{}").await.unwrap().0, 503, "still paused");
        assert_eq!(post(&s, "/continue_generation").await, 200);
        assert_eq!(s.complete("{}").await.unwrap().0, 200);
        s.stop().await.unwrap();
    }
}
