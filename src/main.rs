//! The `hearth` binary: the daemon, the operator's verbs and the toy server in one.
#![forbid(unsafe_code)]

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use hearth::agent::{
    account::Accounts,
    control,
    daemon::Daemon,
    fault::Faults,
    handover::{self, Incoming},
    inventory, metrics, paths, reach,
    replica_log::ReplicaLogs,
    running_config::RunningConfig,
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
/// with nothing spawned and no socket bound. A process `hearth upgrade` started that fails
/// before it has adopted the hand-over falls back to the previous binary instead (handover.rs).
fn daemon(path: &Path) -> ExitCode {
    // First, before anything else reads the environment: what a previous binary handed over.
    let (incoming, document) = match Incoming::take() {
        Some((i, h)) => (Some(Arc::new(i)), Some(h)),
        None => (None, None),
    };
    let fail = |why: String, faults: &Faults| -> ExitCode {
        if let Some(i) = incoming.as_ref().filter(|i| i.can_fall_back()) {
            let reason = handover::failure(&why);
            logging::fatal(
                "hearth",
                &format_args!("{reason}: falling back to the previous binary"),
            );
            let err = i.fall_back(&reason, &faults.fallback_env());
            logging::fatal("hearth", &err);
        }
        logging::fatal("hearth", &why);
        ExitCode::from(1)
    };
    let faults = match Faults::from_env() {
        Ok(f) => f,
        Err(e) => return fail(e.to_string(), &Faults::default()),
    };
    let (handover, unusable) = match document {
        None => (None, None),
        Some(Ok(s)) => (Some(s), None),
        Some(Err(e)) => (None, Some(e)),
    };
    if let Some(e) = &unusable {
        if incoming.as_ref().is_some_and(|i| i.can_fall_back()) {
            return fail(e.to_string(), &faults);
        }
    }
    // After an upgrade, the configuration the previous binary ran, not the file: an edit not
    // reloaded stays for `reload` (running_config.rs).
    let carried = handover.as_ref().and_then(|s| s.config.as_ref());
    let mut notes = Vec::new();
    let loaded = match carried.map(|c| c.load()) {
        Some(Ok((config, running))) => {
            let differs = running.differs_on_disk();
            Ok((config, running, differs))
        }
        Some(Err(e)) if incoming.as_ref().is_some_and(|i| i.can_fall_back()) => {
            return fail(
                format!("it cannot run the configuration the previous binary ran: {e}"),
                &faults,
            )
        }
        other => {
            if let Some(Err(e)) = other {
                notes.push(format!(
                    "cannot run the configuration carried across the upgrade ({e}): reading {}",
                    path.display()
                ));
            }
            reach::load_text(path, Checks::Host)
                .map(|(config, text)| (config, RunningConfig::read_at_start(path, text), None))
        }
    };
    let (config, running, config_differs) = match loaded {
        Ok(l) => l,
        Err(e) => return fail(e.to_string(), &faults),
    };
    let log = logging::init(&config.daemon.log_level);
    if let Some(e) = unusable {
        tracing::warn!("{e}; adopting from the saved ledger after warm-ups");
    }
    for n in notes {
        tracing::warn!("{n}");
    }
    if let Some(why) = incoming.as_ref().and_then(|i| i.fell_back.as_deref()) {
        tracing::error!("back after a failed upgrade: {why}");
    }
    let inventory = match inventory::open(&config.gpus) {
        Ok(i) => i,
        Err(e) => return fail(e.to_string(), &faults),
    };
    // Taken before anything can replace the binary on disk: what a panic re-executes.
    let reexec = hearth::agent::upgrade::Reexec::current();
    let panics_before = hearth::agent::upgrade::panic_reexecs();
    if faults.any() {
        tracing::warn!("{faults}");
    }
    let started = std::time::Instant::now();
    let rt = runtime();
    let path = path.to_path_buf();
    let listener = incoming.as_ref().and_then(|i| i.take_listener());
    let incoming_task = incoming.clone();
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
        let listener = match listener {
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
            running,
            incoming: incoming_task,
            handover,
            config_differs,
        };
        daemon
            .run(listener, metrics_listener, stop_rx, hup_rx)
            .await
    };
    let falling_back = incoming.clone();
    let result = rt.block_on(async move {
        match tokio::spawn(daemon_task).await {
            Ok(r) => r,
            // A panic in the daemon ends in re-adoption, not in the replicas' deaths: the
            // binary re-executes itself and adopts them from the ledger it kept saving (after
            // a warm-up each: the state in memory is not trusted). Too many in a row and it
            // stays a panic of the process (the service manager's restart adopts them too).
            Err(e) if e.is_panic() => {
                let payload = e.into_panic();
                if let Some(i) = falling_back.as_ref().filter(|i| i.can_fall_back()) {
                    let reason =
                        handover::failure(&format!("it panicked: {}", panic_text(&*payload)));
                    tracing::error!("{reason}: falling back to the previous binary");
                    let err = i.fall_back(&reason, &faults.fallback_env());
                    tracing::error!("{err}");
                }
                hearth::agent::upgrade::after_panic(
                    reexec.as_ref(),
                    panics_before,
                    started,
                    faults,
                );
                std::panic::resume_unwind(payload)
            }
            Err(e) => Err(anyhow::anyhow!("the daemon's task ended: {e}")),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(format!("{e:#}"), &faults),
    }
}

/// What a panic said.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}
