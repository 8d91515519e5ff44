//! A closed-loop burst at one llama.cpp replica: each client sends its next completion as soon as
//! the last is answered, until told to stop. The queue it builds behind the server's slots lasts
//! as long as the test needs it to, however fast the machine is at the moment; a one-shot burst
//! sized by a probe does not (a probe slowed by a busy neighbour sizes requests that then drain
//! before hearth has seen two scrapes of them).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::http::llama_complete;

/// What one completion answered: status, tokens generated, body.
pub type Answer = (u16, u64, String);

pub struct Burst {
    stop: Arc<AtomicBool>,
    clients: Vec<JoinHandle<Vec<Answer>>>,
}

impl Burst {
    /// `clients` threads sending completions of `n_predict` tokens to `addr`, one after the
    /// other, until `stop` or until `longest` has passed (so that a test that fails before it
    /// stops the burst leaves no load behind for long).
    pub fn start(addr: &str, n_predict: u32, clients: usize, longest: Duration) -> Burst {
        let stop = Arc::new(AtomicBool::new(false));
        let clients = (0..clients)
            .map(|_| {
                let (addr, stop) = (addr.to_string(), Arc::clone(&stop));
                std::thread::spawn(move || {
                    let deadline = Instant::now() + longest;
                    let mut answers = Vec::new();
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        answers.push(llama_complete(&addr, n_predict).expect("request"));
                    }
                    answers
                })
            })
            .collect();
        Burst { stop, clients }
    }

    /// No client sends another request; those in progress go on.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Stops, waits for the requests in progress, and returns every answer.
    pub fn answers(mut self) -> Vec<Answer> {
        self.stop();
        std::mem::take(&mut self.clients)
            .into_iter()
            .flat_map(|h| h.join().expect("a client of the burst"))
            .collect()
    }
}

impl Drop for Burst {
    fn drop(&mut self) {
        self.stop();
    }
}
