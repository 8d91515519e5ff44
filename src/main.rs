//! The `hearth` binary: the daemon, the operator's verbs and the toy server in one.
#![forbid(unsafe_code)]

use std::path::Path;
use std::process::ExitCode;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use hearth::agent::{
    account::Accounts, control, daemon::Daemon, inventory, metrics, paths, reach,
    replica_log::ReplicaLogs,
};
use hearth::cli::{client_verb, Cli, Command};
use hearth::config::Checks;
use hearth::service::{logging, notify::Notifier};

fn main() -> ExitCode {
    let cli = Cli::parse_args();
    let socket = cli.socket_path();
    match cli.command {
        Command::Daemon { config } => daemon(&config),
        Command::CheckConfig { file, no_binaries } => {
            let checks = if no_binaries {
                Checks::Deployment
            } else {
                Checks::Host
            };
            check_config(&file, checks)
        }
        Command::ToyServer(args) => {
            let rt = runtime();
            match rt.block_on(hearth::toy_server::run(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("toy-server: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Simulate(args) => hearth::sim::main(args),
        Command::Route(args) => hearth::route::cmd::main(args),
        other => runtime().block_on(client_verb(other, socket)),
    }
}

/// `hearth check-config`: what the daemon would accept (less the programs, with `--no-binaries`).
fn check_config(file: &Path, checks: Checks) -> ExitCode {
    match reach::load(file, checks) {
        Ok(cfg) => {
            let unchecked = if checks < Checks::Host {
                "; commands not looked up"
            } else {
                ""
            };
            println!(
                "{}: ok ({} model(s){unchecked})",
                file.display(),
                cfg.models.len()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(1)
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Validates everything before starting anything: a bad file or an unusable inventory exits 1
/// with nothing spawned and no socket bound.
fn daemon(path: &Path) -> ExitCode {
    let config = match reach::load(path, Checks::Host) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("hearth: {e}");
            return ExitCode::from(1);
        }
    };
    let log = logging::init(&config.daemon.log_level);
    let inventory = match inventory::open(&config.gpus) {
        Ok(i) => i,
        Err(e) => {
            logging::fatal("hearth", &e);
            return ExitCode::from(1);
        }
    };
    // Taken before anything can replace the binary on disk: what a panic re-executes.
    let reexec = hearth::agent::upgrade::Reexec::current();
    let panics_before = hearth::agent::upgrade::panic_reexecs();
    let faults = match hearth::agent::fault::Faults::from_env() {
        Ok(f) => f,
        Err(e) => {
            logging::fatal("hearth", &e);
            return ExitCode::from(1);
        }
    };
    if faults.any() {
        tracing::warn!("{faults}");
    }
    let started = std::time::Instant::now();
    let rt = runtime();
    let path = path.to_path_buf();
    // The daemon runs as a task of the runtime rather than on this thread: a connection's task
    // and the core's task can then share a worker, and a report handed to the core (and its
    // answer handed back) is a queue push on that worker, not a futex wake of this thread and
    // then of a worker. At idle, thread wake-ups are most of what a report costs: 0.48 → 0.35 %
    // of a core with 8 toy replicas reporting every 200 ms (benches/idle_footprint).
    let daemon_task = async move {
        // The metrics port first: if it is taken, nothing was created yet (no socket file).
        let metrics_listener = match config.daemon.metrics {
            Some(addr) => Some(metrics::bind(addr).await?),
            None => None,
        };
        // Models without `user` run as the default account: a root daemon with such a model
        // makes it where the host lacks it (never a shared account such as nobody), before
        // anything is created.
        match Accounts::lookup().ensure_for(&config) {
            Ok(Some(made)) => tracing::info!("{made}"),
            Ok(None) => {}
            Err(e) => anyhow::bail!(e),
        }
        // Before anything is created there: a directory another user could write in is refused.
        paths::secure_dir(&config.daemon.state_dir, 0o700, "daemon.state_dir")?;
        let logs = ReplicaLogs::choose(&config.daemon.state_dir)?;
        // After `hearth upgrade`, the previous binary's listening socket, still open: clients
        // that connected during the exec are answered, nobody sees the socket missing.
        let listener = match hearth::agent::upgrade::inherited_listener() {
            Some(l) => {
                l.set_nonblocking(true)?;
                tokio::net::UnixListener::from_std(l)?
            }
            None => control::bind(&config.daemon.socket)?,
        };
        tracing::info!("listening on {}", config.daemon.socket.display());
        let (stop_tx, stop_rx) = mpsc::channel(4);
        let (hup_tx, hup_rx) = mpsc::channel(4);
        // SIGTERM (systemd stop) and SIGINT (Ctrl-C) ask for an orderly shutdown: unroute,
        // drain, stop children. A second one means the operator will not wait: kill them now.
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::spawn(async move {
            let mut seen = false;
            loop {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
                if stop_tx.send(seen).await.is_err() {
                    break;
                }
                seen = true;
            }
        });
        // SIGHUP is systemd's ExecReload: re-read the configuration, keep the old one on error.
        // The handler only forwards it to the event loop, which owns the core and announces the
        // reload to systemd (RELOADING=1, then READY=1 once applied or refused). Installing it
        // here, before READY=1, means a reload cannot arrive while SIGHUP still kills us.
        let mut hup = signal(SignalKind::hangup())?;
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                if hup_tx.send(()).await.is_err() {
                    break;
                }
            }
        });
        let daemon = Daemon {
            config_path: path,
            config,
            inventory,
            notifier: Notifier::from_env(),
            log,
            faults,
            logs,
        };
        daemon
            .run(listener, metrics_listener, stop_rx, hup_rx)
            .await
    };
    let result = rt.block_on(async move {
        match tokio::spawn(daemon_task).await {
            Ok(r) => r,
            // A panic in the daemon ends in re-adoption, not in the replicas' deaths: the
            // binary re-executes itself and adopts them from the ledger it kept saving (after
            // a warm-up each: the state in memory is not trusted). Too many in a row and it
            // stays a panic of the process (the service manager's restart adopts them too).
            Err(e) if e.is_panic() => {
                hearth::agent::upgrade::after_panic(
                    reexec.as_ref(),
                    panics_before,
                    started,
                    faults,
                );
                std::panic::resume_unwind(e.into_panic())
            }
            Err(e) => Err(anyhow::anyhow!("the daemon's task ended: {e}")),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            logging::fatal("hearth", &format_args!("{e:#}"));
            ExitCode::from(1)
        }
    }
}
