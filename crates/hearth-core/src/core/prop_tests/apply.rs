//! One hostile step applied to the world: each kind of event, request or reload as the shell
//! would hand it to the core, with the values the step carries.

use super::inputs::Step;
use super::*;

impl World {
    pub(super) fn step(&mut self, s: &Step) {
        match s.clone() {
            Step::Advance(ms) => {
                self.now = self.now + Duration::from_millis(ms);
                self.send(Event::Tick);
            }
            Step::Spawned(i) => {
                let r = replica(self, i);
                self.next_pid += 1;
                let pid = self.next_pid;
                self.send(Event::Spawned { replica: r, pid });
            }
            Step::SpawnFailed(i) => {
                let r = replica(self, i);
                self.send(Event::SpawnFailed {
                    replica: r,
                    error: crate::core::SpawnError::Exec {
                        program: "server".into(),
                        error: "No such file or directory (os error 2)".into(),
                    },
                });
            }
            Step::Exited(i) => {
                let r = replica(self, i);
                self.send(Event::Exited {
                    replica: r,
                    status: crate::core::ExitStatus::Code(1),
                });
            }
            Step::Probe {
                replica: i,
                kind,
                ok,
                not_ready,
            } => {
                let r = replica(self, i);
                let kind = [
                    ProbeKind::Warmup,
                    ProbeKind::Recheck,
                    ProbeKind::Liveness,
                    ProbeKind::Sleep,
                    ProbeKind::SleepState,
                    ProbeKind::Wake,
                ][usize::from(kind) % 6];
                if ok && kind == ProbeKind::Warmup {
                    self.warm_passed(&r);
                }
                self.send(Event::Probed {
                    replica: r,
                    kind,
                    outcome: ProbeOutcome {
                        ok,
                        not_ready: !ok && not_ready,
                        detail: "x".into(),
                    },
                });
            }
            Step::Scraped {
                replica: i,
                ok,
                depth,
                in_flight,
                wait,
                counter,
            } => {
                let r = replica(self, i);
                let outcome = if ok {
                    Ok(ScrapedQueue {
                        queue_depth: depth,
                        in_flight,
                        oldest_wait_ms: wait,
                        queue_time: counter.map(|c| QueueTime {
                            total_ms: wait.unwrap_or(1.0) * c as f64,
                            count: c,
                        }),
                        arrived: counter,
                        completed: counter.map(|c| c / 2),
                    })
                } else {
                    Err(crate::core::ScrapeError::Refused)
                };
                self.send(Event::Scraped {
                    replica: r,
                    outcome,
                });
            }
            Step::Report {
                model,
                replica: rep,
                wait,
                depth,
                in_flight,
                arrived,
                completed,
                peer: p,
            } => {
                let report = Report {
                    model: model_name(self, model),
                    replica: rep.map(|i| replica(self, i).0),
                    oldest_wait_ms: wait,
                    queue_depth: depth,
                    in_flight,
                    arrived,
                    completed,
                    // Now and then a front door's report, sometimes with a hostile name.
                    router: match p % 7 {
                        0 => Some("door".into()),
                        1 => Some("d\u{7}".repeat(100)),
                        _ => None,
                    },
                };
                let who = peer(self, p);
                self.request(who, Request::Report(report));
            }
            Step::Scale {
                model,
                min,
                max,
                warm,
                reset,
                peer: p,
            } => {
                let req = Request::Scale {
                    model: model_name(self, model),
                    min,
                    max,
                    warm_pool: warm
                        .map(|w| w.map_or(WarmPoolSetting::AUTO, WarmPoolSetting::Count)),
                    reset,
                };
                let who = peer(self, p);
                self.request(who, req);
            }
            Step::Drain {
                replica: i,
                force,
                peer: p,
            } => {
                let r = replica(self, i);
                let who = peer(self, p);
                self.request(
                    who,
                    Request::Drain {
                        replica: Some(r.0),
                        model: None,
                        force,
                    },
                );
            }
            Step::Cordon { gpu, on, evacuate } => {
                let gpu = gpu.to_string();
                let req = if on {
                    Request::Cordon {
                        gpu,
                        reason: None,
                        evacuate,
                    }
                } else {
                    Request::Uncordon { gpu }
                };
                self.request(Peer::trusted(), req);
            }
            Step::Xid(g, xid) => {
                let uuid = ["GPU-a", "GPU-b", "GPU-zz"][usize::from(g) % 3].to_string();
                // Hostile recovery actions too: unknown raw values and none at all.
                let recovery = (xid % 3 != 0).then(|| RecoveryAction::from_raw((xid % 11) as u32));
                self.send(Event::GpuXid {
                    uuid,
                    xid,
                    recovery,
                });
            }
            Step::Memory(g, used, by_group) => {
                let uuid = ["GPU-a", "GPU-b", "GPU-zz"][usize::from(g) % 3].to_string();
                // Processes the driver names, some with "Unavailable" memory (None).
                let processes = by_group
                    .into_iter()
                    .map(|(pid, bytes)| GpuProcess {
                        pid,
                        bytes: (bytes % 5 != 0).then_some(bytes),
                        replica: None,
                        leaders: vec![pid],
                    })
                    .collect();
                self.send(Event::GpuReading(GpuReading {
                    uuid,
                    used,
                    driver_reserved: used / 16,
                    processes,
                    recovery: None,
                }));
            }
            Step::Prefetch(i, done, total) => {
                let r = replica(self, i);
                self.send(Event::Prefetch {
                    replica: r,
                    done_bytes: done,
                    total_bytes: total,
                    missing: vec!["w*.bin".into()],
                });
            }
            Step::ReloadAsk(signal) => {
                if signal {
                    self.send(Event::ReloadSignal);
                } else {
                    self.request(Peer::trusted(), Request::Reload {});
                }
            }
            Step::ConfigRead(i) => {
                let n = self.configs.len();
                let read = match self.configs.get(usize::from(i) % (n + 1)) {
                    Some(c) => Ok(Box::new(NewConfig {
                        config: c.clone(),
                        warnings: vec![],
                        text: "".into(),
                    })),
                    None => Err(crate::core::harness::refused(
                        "prop.toml",
                        Some(1),
                        "x",
                        "bad",
                    )),
                };
                self.send(Event::ConfigRead(read));
            }
            Step::Read(op, m) => {
                let model = (m % 2 == 0).then(|| model_name(self, m));
                let req = match op {
                    0 => Request::Status { model },
                    1 => Request::Version {},
                    2 => Request::Gpus {},
                    _ => Request::Watch { model },
                };
                let who = peer(self, m);
                self.request(who, req);
            }
            Step::Shutdown(immediate) => {
                self.send(Event::Shutdown { immediate });
            }
            Step::Restart {
                handed_over,
                config,
            } => self.restart(handed_over, config),
        }
    }
}
