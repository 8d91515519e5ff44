//! Command-line verbs: parse, dispatch, print, and DESIGN's exit codes (0 ok, 1 an error
//! answer, 2 usage or no daemon).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use serde_json::Value;

use crate::client::{socket_path, Client};
use crate::protocol::{GpuView, ModelView, Report, Request, StatusView, WarmPoolSetting};

#[derive(Parser, Debug)]
#[command(
    name = "hearth",
    version,
    about = "Spawns, warms, pools, routes and autoscales model servers on a GPU host"
)]
pub struct Cli {
    /// Control socket of client verbs (default: $HEARTH_SOCKET, then /run/hearth/hearth.sock)
    #[arg(long, global = true)]
    pub socket: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the agent (under systemd, usually)
    Daemon {
        #[arg(long, default_value = "/etc/hearth/config.toml")]
        config: PathBuf,
    },
    /// Validate a configuration file without starting anything
    CheckConfig { file: PathBuf },
    /// Models, replicas and GPUs
    Status {
        model: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Stream routed-set, replica, scale and GPU events
    Watch { model: Option<String> },
    /// GPUs and what hearth has reserved on them
    Gpus {
        #[arg(long)]
        json: bool,
    },
    /// Report a queue (for a replica, or model-wide)
    Report {
        model: String,
        #[arg(long)]
        replica: Option<String>,
        #[arg(long = "wait-ms")]
        wait_ms: Option<f64>,
        #[arg(long)]
        depth: Option<u64>,
        #[arg(long = "in-flight")]
        in_flight: Option<u64>,
        #[arg(long)]
        arrived: Option<u64>,
        #[arg(long)]
        completed: Option<u64>,
    },
    /// Change a model's min, max or warm pool (kept across restarts)
    Scale {
        model: String,
        #[arg(long)]
        min: Option<u32>,
        #[arg(long)]
        max: Option<u32>,
        /// A count, or "auto"
        #[arg(long, value_parser = parse_warm)]
        warm: Option<WarmPoolSetting>,
    },
    /// Unroute a replica, let its work finish, stop it
    Drain { replica: String },
    /// Take no new replicas on a GPU (uuid or index)
    Cordon {
        gpu: String,
        #[arg(long)]
        reason: Option<String>,
        /// Move replicas off the device, keeping routed capacity at or above min
        #[arg(long)]
        evacuate: bool,
    },
    /// Let a GPU take replicas again (and clear an unhealthy mark)
    Uncordon { gpu: String },
    /// Re-read the configuration file
    Reload,
    /// A stand-in model server for demos and tests
    ToyServer(crate::toy_server::ToyArgs),
    /// The front door: an OpenAI-compatible HTTP entry point that queues for the daemon's replicas
    Route(crate::route::cmd::RouteArgs),
    /// Replay traffic against hearth's policy and published autoscalers
    Simulate(crate::sim::SimArgs),
}

fn parse_warm(s: &str) -> Result<WarmPoolSetting, String> {
    if s == "auto" {
        return Ok(WarmPoolSetting::Auto(crate::protocol::AutoTag::Auto));
    }
    s.parse()
        .map(WarmPoolSetting::Count)
        .map_err(|_| format!("{s:?}: a count or \"auto\""))
}

/// Runs a client verb against the daemon.
pub async fn client_verb(command: Command, socket: Option<PathBuf>) -> ExitCode {
    let (request, render): (Request, Render) = match command {
        Command::Status { model, json } => (
            Request::Status { model },
            if json {
                Render::Json("status")
            } else {
                Render::Status
            },
        ),
        Command::Gpus { json } => (
            Request::Gpus,
            if json {
                Render::Json("gpus")
            } else {
                Render::Gpus
            },
        ),
        Command::Watch { model } => (Request::Watch { model }, Render::Stream),
        Command::Report {
            model,
            replica,
            wait_ms,
            depth,
            in_flight,
            arrived,
            completed,
        } => (
            Request::Report(Report {
                model,
                replica,
                oldest_wait_ms: wait_ms,
                queue_depth: depth,
                in_flight,
                arrived,
                completed,
            }),
            Render::Quiet,
        ),
        Command::Scale {
            model,
            min,
            max,
            warm,
        } => (
            Request::Scale {
                model,
                min,
                max,
                warm_pool: warm,
            },
            Render::Quiet,
        ),
        Command::Drain { replica } => (Request::Drain { replica }, Render::Quiet),
        Command::Cordon {
            gpu,
            reason,
            evacuate,
        } => (
            Request::Cordon {
                gpu,
                reason,
                evacuate,
            },
            Render::Quiet,
        ),
        Command::Uncordon { gpu } => (Request::Uncordon { gpu }, Render::Quiet),
        Command::Reload => (Request::Reload, Render::Quiet),
        Command::Daemon { .. }
        | Command::CheckConfig { .. }
        | Command::ToyServer(_)
        | Command::Route(_)
        | Command::Simulate(_) => {
            unreachable!("not a client verb")
        }
    };
    let path = socket_path(socket);
    let mut client = match Client::connect(&path).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("hearth: {e}");
            return ExitCode::from(2);
        }
    };
    let answer = match client.call(&request).await {
        Ok(a) => a,
        Err(e) => {
            eprintln!("hearth: {e}");
            return ExitCode::from(2);
        }
    };
    if answer["ok"] != Value::Bool(true) {
        eprintln!(
            "hearth: {}: {}",
            answer["error"].as_str().unwrap_or("error"),
            answer["message"].as_str().unwrap_or("")
        );
        return ExitCode::from(1);
    }
    match render {
        Render::Quiet => {}
        Render::Json(key) => {
            let text = serde_json::to_string_pretty(&answer[key]).unwrap_or_default();
            print_out(&format!("{text}\n"));
        }
        Render::Status => match serde_json::from_value::<StatusView>(answer["status"].clone()) {
            Ok(s) => {
                print_out(&status_table(&s));
            }
            Err(e) => {
                eprintln!("hearth: unexpected status answer: {e}");
                return ExitCode::from(1);
            }
        },
        Render::Gpus => match serde_json::from_value::<Vec<GpuView>>(answer["gpus"].clone()) {
            Ok(g) => {
                print_out(&gpu_table(&g));
            }
            Err(e) => {
                eprintln!("hearth: unexpected gpus answer: {e}");
                return ExitCode::from(1);
            }
        },
        Render::Stream => {
            while let Some(ev) = client.next().await {
                if !print_out(&format!("{ev}\n")) {
                    break;
                }
            }
        }
    }
    ExitCode::SUCCESS
}

/// Writes to stdout; false once the reader went away (`hearth status --json | head` is not an
/// error worth a panic).
fn print_out(text: &str) -> bool {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|_| out.flush())
        .is_ok()
}

enum Render {
    Quiet,
    Json(&'static str),
    Status,
    Gpus,
    Stream,
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("-".to_string(), |v| v.to_string())
}

pub fn status_table(s: &StatusView) -> String {
    let mut out = String::new();
    if s.models.is_empty() {
        out.push_str("no models configured\n");
    }
    for m in &s.models {
        out.push_str(&model_block(m));
        out.push('\n');
    }
    if !s.gpus.is_empty() {
        out.push_str(&gpu_table(&s.gpus));
    }
    out
}

fn model_block(m: &ModelView) -> String {
    let mut out = format!(
        "{} (version {})  health {}{}\n",
        m.name,
        m.version,
        m.health,
        if m.health_reason.is_empty() {
            String::new()
        } else {
            format!(": {}", m.health_reason)
        }
    );
    out.push_str(&format!(
        "  routed {}/{}  warm {}/{}  starting {}  pending {}  draining {}  (min {}, max {}, pool {})\n",
        m.routed, m.desired_routed, m.warm, m.desired_warm, m.starting, m.pending, m.draining, m.min, m.max, m.warm_pool
    ));
    out.push_str(&format!(
        "  queue: oldest wait {} ms (target {} ms), depth {}, in flight {}, report age {} ms",
        opt(m.signal.oldest_wait_ms.map(|w| w.round())),
        m.target_wait_ms,
        opt(m.signal.queue_depth),
        opt(m.signal.in_flight),
        opt(m.signal.age_ms)
    ));
    if let Some(t) = m.time_to_ready_ms {
        out.push_str(&format!("; time to ready {:.1} s", t as f64 / 1000.0));
    }
    out.push('\n');
    if let Some(r) = &m.rollout {
        out.push_str(&format!("  rollout: {r}\n"));
    }
    if let Some(ls) = &m.last_scale {
        out.push_str(&format!(
            "  last scale: {} → {}: {}\n",
            ls.from, ls.to, ls.reason
        ));
    }
    if !m.replicas.is_empty() {
        out.push_str(&format!(
            "  {:<22} {:<9} {:>8} {:<21} {:>8} {:<10} {}\n",
            "REPLICA", "STATE", "PID", "ADDR", "RESTARTS", "GPUS", "REASON"
        ));
        for r in &m.replicas {
            out.push_str(&format!(
                "  {:<22} {:<9} {:>8} {:<21} {:>8} {:<10} {}\n",
                r.id,
                r.state,
                opt(r.pid),
                r.addr.clone().unwrap_or_else(|| "-".into()),
                r.restarts,
                if r.gpus.is_empty() {
                    "-".to_string()
                } else {
                    r.gpus.join(",")
                },
                r.reason
            ));
        }
    }
    out
}

pub fn gpu_table(gpus: &[GpuView]) -> String {
    if gpus.is_empty() {
        return "no GPUs\n".into();
    }
    let gib = |b: u64| format!("{:.1}", b as f64 / (1u64 << 30) as f64);
    let row = |cols: [&str; 11]| {
        format!(
            "{:<5} {:<40} {:<20} {:>9} {:>8} {:>8} {:>8} {:<7} {:<6} {:<20} {}\n",
            cols[0],
            cols[1],
            cols[2],
            cols[3],
            cols[4],
            cols[5],
            cols[6],
            cols[7],
            cols[8],
            cols[9],
            cols[10]
        )
    };
    let mut out = row([
        "INDEX",
        "UUID",
        "NAME",
        "TOTAL GiB",
        "RESERVED",
        "USED",
        "FOREIGN",
        "HEALTHY",
        "CORDON",
        "REPLICAS",
        "NOTE",
    ]);
    for g in gpus {
        let replicas = if g.replicas.is_empty() {
            "-".to_string()
        } else {
            g.replicas.join(",")
        };
        out.push_str(&row([
            &g.index.to_string(),
            &g.uuid,
            &g.name,
            &gib(g.memory_total),
            &gib(g.memory_reserved),
            &g.memory_used.map_or("-".into(), gib),
            &g.memory_foreign.map_or("-".into(), gib),
            if g.healthy { "yes" } else { "NO" },
            if g.cordoned { "yes" } else { "no" },
            &replicas,
            g.note.as_deref().unwrap_or(""),
        ]));
    }
    out
}

#[cfg(test)]
mod gpu_table_tests {
    use super::*;

    fn view(index: u32, used: Option<u64>, note: Option<&str>) -> GpuView {
        const GIB: u64 = 1 << 30;
        GpuView {
            index,
            uuid: format!("GPU-{index}"),
            name: "H100".into(),
            memory_total: 80 * GIB,
            memory_reserved: 30 * GIB,
            healthy: note.is_none(),
            cordoned: false,
            replicas: vec![format!("m-{index}")],
            memory_used: used,
            memory_foreign: used.map(|u| u - 20 * GIB),
            note: note.map(String::from),
            topology: None,
        }
    }

    #[test]
    fn the_gpu_table_shows_memory_in_use_foreign_memory_and_why_a_device_is_out() {
        const GIB: u64 = 1 << 30;
        let t = gpu_table(&[
            view(0, Some(50 * GIB), None),
            view(1, None, Some("critical XID 79")),
        ]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].contains("USED") && lines[0].contains("FOREIGN") && lines[0].contains("NOTE")
        );
        let cols: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            cols,
            ["0", "GPU-0", "H100", "80.0", "30.0", "50.0", "30.0", "yes", "no", "m-0"]
        );
        let cols: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            cols,
            [
                "1", "GPU-1", "H100", "80.0", "30.0", "-", "-", "NO", "no", "m-1", "critical",
                "XID", "79"
            ]
        );
    }
}
