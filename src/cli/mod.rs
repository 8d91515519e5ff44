//! Command-line verbs: parse, dispatch, print, and the exit codes of docs/design.md (0 ok, 1 an
//! error answer, 2 usage or no daemon). The tables are in render.rs.
#![forbid(unsafe_code)]

mod confirm;
mod render;
#[cfg(test)]
mod tests;
mod upgrade;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgGroup, Args, Parser, Subcommand};

use crate::client::{socket_path, Client};
use crate::protocol::{Report, Request, Response, WarmPoolSetting};

pub use render::{gpu_table, status_table};

#[derive(Parser, Debug)]
#[command(
    name = "hearth",
    version,
    about = "Spawns, warms, pools, routes and autoscales model servers on a GPU host"
)]
pub struct Cli {
    /// The client verbs' `--socket`, also accepted before the verb (as scripts written for
    /// earlier versions put it); the one after the verb wins.
    #[arg(long, value_name = "PATH", hide = true)]
    pub socket: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

/// Where the daemon listens, for the verbs that talk to it.
#[derive(Args, Debug, Clone, Default, PartialEq)]
pub struct Socket {
    /// The daemon's control socket [default: $HEARTH_SOCKET, then /run/hearth/hearth.sock]
    #[arg(long = "socket", value_name = "PATH")]
    pub path: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the agent (under systemd, usually)
    Daemon {
        /// The configuration file
        #[arg(long, value_name = "FILE", default_value = "/etc/hearth/config.toml")]
        config: PathBuf,
    },
    /// Validate a configuration file without starting anything
    CheckConfig {
        /// The configuration file to check
        file: PathBuf,
        /// Skip checking that each model's command exists on this host (for a file checked away
        /// from the host that will run it)
        #[arg(long)]
        no_binaries: bool,
    },
    /// Models, replicas and GPUs
    Status {
        /// Only this model
        model: Option<String>,
        /// Print the daemon's answer as JSON
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        socket: Socket,
    },
    /// Stream routed-set, replica, scale and GPU events (JSON lines)
    Watch {
        /// Only this model's events (GPU events come either way)
        model: Option<String>,
        #[command(flatten)]
        socket: Socket,
    },
    /// GPUs and what hearth has reserved on them
    Gpus {
        /// Print the daemon's answer as JSON
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        socket: Socket,
    },
    /// Report a queue (for a replica, or model-wide)
    Report {
        /// The model whose queue this is
        model: String,
        /// The replica whose own queue this is; without it, the model's (a router's) queue
        #[arg(long, value_name = "ID")]
        replica: Option<String>,
        /// How long the oldest waiting request has waited, in milliseconds
        #[arg(long = "wait-ms", value_name = "MS", allow_negative_numbers = true, value_parser = parse_wait_ms)]
        wait_ms: Option<f64>,
        /// Requests waiting
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        depth: Option<u64>,
        /// Requests waiting or being served
        #[arg(long = "in-flight", value_name = "N", allow_negative_numbers = true)]
        in_flight: Option<u64>,
        /// Requests arrived so far (a counter that only grows)
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        arrived: Option<u64>,
        /// Requests completed so far (a counter that only grows)
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        completed: Option<u64>,
        #[command(flatten)]
        socket: Socket,
    },
    /// Change a model's min, max or warm pool (kept across restarts), or clear what was changed
    #[command(group(ArgGroup::new("change").args(["min", "max", "warm", "reset"]).required(true).multiple(true)))]
    Scale {
        /// The model to change
        model: String,
        /// Fewest routed replicas
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        min: Option<u32>,
        /// Most replicas, routed and warm together
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        max: Option<u32>,
        /// Warm, unrouted replicas to keep: a count, or "auto"
        #[arg(long, value_name = "N|auto", allow_negative_numbers = true, value_parser = parse_warm)]
        warm: Option<WarmPoolSetting>,
        /// Clear the model's overrides first: the configuration file's values apply again (with
        /// --min, --max or --warm, those are then set anew)
        #[arg(long)]
        reset: bool,
        #[command(flatten)]
        socket: Socket,
    },
    /// Unroute a replica, let its work finish, stop it; or, with --model, take a model off
    /// the fleet's balancers (front doors answer their agent checks `drain`; replicas keep
    /// running, undone by `hearth undrain --model`)
    #[command(group(ArgGroup::new("what").args(["replica", "model"]).required(true)))]
    Drain {
        /// The replica, as status names it (MODEL-N)
        replica: Option<String>,
        /// The model to drain off this host's balancers
        #[arg(long, value_name = "MODEL", conflicts_with = "force")]
        model: Option<String>,
        /// Drain it even where routed would drop below min and no replacement can be placed
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        socket: Socket,
    },
    /// Put a model drained with `hearth drain --model` back in the balancers' rotation
    Undrain {
        /// The model
        #[arg(long, value_name = "MODEL")]
        model: String,
        #[command(flatten)]
        socket: Socket,
    },
    /// Take no new replicas on a GPU
    Cordon {
        /// The GPU: its uuid or its index
        gpu: String,
        /// Why, as status and gpus will show it
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
        /// Move replicas off the device, keeping routed capacity at or above min
        #[arg(long)]
        evacuate: bool,
        #[command(flatten)]
        socket: Socket,
    },
    /// Let a GPU take replicas again (and clear an unhealthy mark)
    Uncordon {
        /// The GPU: its uuid or its index
        gpu: String,
        #[command(flatten)]
        socket: Socket,
    },
    /// Re-read the configuration file (as SIGHUP does)
    Reload {
        #[command(flatten)]
        socket: Socket,
    },
    /// Replace the running daemon with the binary now on disk, without stopping a replica
    /// (same pid; every replica keeps its role, port and GPUs). `systemctl restart` stops them.
    Upgrade {
        #[command(flatten)]
        socket: Socket,
    },
    /// A stand-in model server for demos and tests
    ToyServer(crate::toy_server::ToyArgs),
    /// The front door: an OpenAI-compatible HTTP entry point that queues for the daemon's replicas
    Route(crate::route::cmd::RouteArgs),
    /// Replay traffic against hearth's policy and published autoscalers
    Simulate(crate::sim::SimArgs),
}

impl Command {
    /// The `--socket` of a verb that talks to the daemon; None for the others.
    pub fn socket(&self) -> Option<&Socket> {
        match self {
            Command::Status { socket, .. }
            | Command::Watch { socket, .. }
            | Command::Gpus { socket, .. }
            | Command::Report { socket, .. }
            | Command::Scale { socket, .. }
            | Command::Drain { socket, .. }
            | Command::Undrain { socket, .. }
            | Command::Cordon { socket, .. }
            | Command::Uncordon { socket, .. }
            | Command::Reload { socket }
            | Command::Upgrade { socket } => Some(socket),
            Command::Daemon { .. }
            | Command::CheckConfig { .. }
            | Command::ToyServer(_)
            | Command::Route(_)
            | Command::Simulate(_) => None,
        }
    }
}

impl Cli {
    /// Parses the command line; a `--socket` before a verb that takes none is a usage error
    /// (exit 2), as clap's own are.
    pub fn parse_args() -> Cli {
        use clap::CommandFactory;
        let cli = Cli::parse();
        if let Err(e) = cli.check() {
            Cli::command()
                .error(clap::error::ErrorKind::ArgumentConflict, e)
                .exit();
        }
        cli
    }

    fn check(&self) -> Result<(), String> {
        match (&self.socket, self.command.socket()) {
            (Some(_), None) => Err(
                "--socket is for the verbs that talk to the daemon (status, watch, gpus, report, \
                 scale, drain, undrain, cordon, uncordon, reload); the daemon takes its socket from the \
                 configuration"
                    .into(),
            ),
            _ => Ok(()),
        }
    }

    /// The socket a client verb talks to: its own `--socket`, then one given before the verb,
    /// then `HEARTH_SOCKET`, then the default.
    pub fn socket_path(&self) -> PathBuf {
        let flag = self
            .command
            .socket()
            .and_then(|s| s.path.clone())
            .or_else(|| self.socket.clone());
        socket_path(flag)
    }
}

fn parse_warm(s: &str) -> Result<WarmPoolSetting, String> {
    if s == "auto" {
        return Ok(WarmPoolSetting::AUTO);
    }
    s.parse()
        .map(WarmPoolSetting::Count)
        .map_err(|e| format!("{e}; a count, or \"auto\""))
}

fn parse_wait_ms(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        Ok(_) => Err("a wait is a finite number of milliseconds, 0 or more".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// What to print of the answer.
enum Render {
    Quiet,
    Status {
        json: bool,
    },
    Gpus {
        json: bool,
    },
    Stream,
    /// Wait for the re-executed daemon to answer.
    Upgrade,
}

/// The request a client verb sends and how its answer is shown; None for the other verbs.
fn request_of(command: Command) -> Option<(Request, Render)> {
    Some(match command {
        Command::Status { model, json, .. } => (Request::Status { model }, Render::Status { json }),
        Command::Gpus { json, .. } => (Request::Gpus {}, Render::Gpus { json }),
        Command::Watch { model, .. } => (Request::Watch { model }, Render::Stream),
        Command::Report {
            model,
            replica,
            wait_ms,
            depth,
            in_flight,
            arrived,
            completed,
            ..
        } => (
            Request::Report(Report {
                model,
                replica,
                oldest_wait_ms: wait_ms,
                queue_depth: depth,
                in_flight,
                arrived,
                completed,
                router: None,
            }),
            Render::Quiet,
        ),
        Command::Scale {
            model,
            min,
            max,
            warm,
            reset,
            ..
        } => (
            Request::Scale {
                model,
                min,
                max,
                warm_pool: warm,
                reset,
            },
            Render::Quiet,
        ),
        Command::Drain {
            replica,
            model,
            force,
            ..
        } => (
            Request::Drain {
                replica,
                model,
                force,
            },
            Render::Quiet,
        ),
        Command::Undrain { model, .. } => (Request::Undrain { model }, Render::Quiet),
        Command::Cordon {
            gpu,
            reason,
            evacuate,
            ..
        } => (
            Request::Cordon {
                gpu,
                reason,
                evacuate,
            },
            Render::Quiet,
        ),
        Command::Uncordon { gpu, .. } => (Request::Uncordon { gpu }, Render::Quiet),
        Command::Reload { .. } => (Request::Reload {}, Render::Quiet),
        Command::Upgrade { .. } => (Request::Upgrade {}, Render::Upgrade),
        Command::Daemon { .. }
        | Command::CheckConfig { .. }
        | Command::ToyServer(_)
        | Command::Route(_)
        | Command::Simulate(_) => return None,
    })
}

/// Runs a client verb against the daemon at `socket`.
pub async fn client_verb(command: Command, socket: PathBuf) -> ExitCode {
    let Some((request, render)) = request_of(command) else {
        eprintln!("hearth: not a verb that talks to the daemon");
        return ExitCode::from(2);
    };
    let change = confirm::Change::of(&request);
    let mut client = match Client::connect(&socket).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("hearth: {e}");
            return ExitCode::from(2);
        }
    };
    let response = match client.ask(&request).await {
        Ok(Ok(response)) => response,
        Ok(Err(failure)) => {
            eprintln!("hearth: {failure}");
            return ExitCode::from(1);
        }
        Err(e) => {
            eprintln!("hearth: {e}");
            return ExitCode::from(2);
        }
    };
    match (render, response) {
        // A report a front door's reports superseded: the daemon took it, counted nothing.
        (_, Response::Superseded { superseded_by }) => {
            eprintln!(
                "hearth: report not counted: the front door{} {} hold{} this model's queue \
                 signal, and reports from other sources are ignored while {} report{} \
                 (docs/front-door.md)",
                if superseded_by.len() == 1 { "" } else { "s" },
                superseded_by
                    .iter()
                    .map(|d| format!("{d:?}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                if superseded_by.len() == 1 { "s" } else { "" },
                if superseded_by.len() == 1 {
                    "it"
                } else {
                    "they"
                },
                if superseded_by.len() == 1 { "s" } else { "" },
            );
            return ExitCode::from(1);
        }
        (Render::Quiet, _) => {
            if let Some(change) = change {
                print_out(&format!("{}\n", confirm::line(&change, &mut client).await));
            }
        }
        (Render::Status { json: true }, Response::Status { status }) => print_json(&status),
        (Render::Status { json: false }, Response::Status { status }) => {
            print_out(&status_table(&status));
        }
        (Render::Gpus { json: true }, Response::Gpus { gpus }) => print_json(&gpus),
        (Render::Gpus { json: false }, Response::Gpus { gpus }) => {
            print_out(&gpu_table(&gpus));
        }
        // The new binary passed its check; the daemon re-executes, and says how that ended.
        (Render::Upgrade, Response::Upgrading { upgrading }) => {
            return upgrade::wait(&socket, upgrading).await;
        }
        (Render::Upgrade, Response::Done {}) => return upgrade::wait_legacy(&socket).await,
        (Render::Stream, _) => {
            while let Some(line) = client.next_line().await {
                if !print_out(&format!("{line}\n")) {
                    break;
                }
            }
        }
        (_, other) => {
            eprintln!("hearth: unexpected answer: {other:?}");
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}

fn print_json(v: &impl serde::Serialize) {
    let text = serde_json::to_string_pretty(v).unwrap_or_default();
    print_out(&format!("{text}\n"));
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
