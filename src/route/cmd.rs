//! `hearth route`: the process. Settings are read and checked before anything starts; then the
//! listener is bound, the daemon link started, and the service manager told it is ready.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::router::Router;
use super::settings::RouteSettings;
use super::{agent_listen, link, server};
use crate::config::Checks;
use crate::service::notify::Notifier;

#[derive(clap::Args, Debug, Clone)]
pub struct RouteArgs {
    /// The daemon's configuration file: its models (their slots and target waits), its socket,
    /// and the `[route]` table (listen, max_queue, queue_timeout, max_body, api_keys, aliases…;
    /// every key has a default)
    #[arg(long, default_value = "/etc/hearth/config.toml")]
    pub config: PathBuf,
}

/// Reads the settings; exits 1 naming file, line and key when they are wrong.
pub fn main(args: RouteArgs) -> ExitCode {
    let settings = match load(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("hearth route: {e}");
            return ExitCode::from(1);
        }
    };
    let _log = crate::service::logging::init("info");
    // The main thread's runtime serves connections too, and runs the listener, the daemon link
    // and the signals; `threads - 1` more threads serve connections (see server.rs).
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hearth route: a runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            crate::service::logging::fatal("hearth route", &format_args!("{e:#}"));
            ExitCode::from(1)
        }
    }
}

/// The file as the daemon reads it, less the host checks of the daemon's own work (the models'
/// programs need not exist where the front door runs).
pub fn load(args: &RouteArgs) -> Result<RouteSettings, crate::config::ConfigError> {
    let config = crate::config::load_with(&args.config, Checks::Deployment)?;
    Ok(RouteSettings::from_config(&config))
}

async fn run(settings: RouteSettings) -> anyhow::Result<()> {
    let listener = server::bind(settings.listen, settings.max_connections)
        .map_err(|e| anyhow::anyhow!("binding {}: {e}", settings.listen))?;
    let agent = match settings.agent_listen {
        Some(a) => Some(
            agent_listen::bind(a).map_err(|e| anyhow::anyhow!("binding agent_listen {a}: {e}"))?,
        ),
        None => None,
    };
    // SIGTERM (systemd stop) and SIGINT: with an agent, answer the balancers `drain` until
    // every one polling was told and no request came for drain_grace (drain_timeout at most);
    // then stop accepting, and let requests in progress finish within shutdown_grace. A second
    // one: leave now.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let grace = settings.shutdown_grace;
    let socket = settings.socket.clone();
    let addr = listener.local_addr()?;
    let threads = settings.threads.max(1);
    let router = Arc::new(Router::new(settings));
    // Worker threads run until every connection is done (or the grace is over).
    let stop_workers = CancellationToken::new();
    let mut workers = vec![tokio::runtime::Handle::current()];
    let mut joins = Vec::new();
    for i in 1..threads {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        workers.push(rt.handle().clone());
        let stop = stop_workers.clone();
        joins.push(
            std::thread::Builder::new()
                .name(format!("route-{i}"))
                .spawn(move || rt.block_on(stop.cancelled()))?,
        );
    }
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    let links = TaskTracker::new();
    links.spawn(link::follow(
        router.clone(),
        socket.clone(),
        shutdown.clone(),
    ));
    links.spawn(link::report(
        router.clone(),
        socket.clone(),
        shutdown.clone(),
    ));
    // Replicas passed over after a failed connection take waiting requests again once their
    // time is up, daemon or not.
    let ticker = {
        let (router, shutdown) = (router.clone(), shutdown.clone());
        async move {
            let mut every = tokio::time::interval(link::REPORT_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = every.tick() => router.tick(),
                }
            }
        }
    };
    links.spawn(ticker);
    links.close();
    let server = tokio::spawn(server::serve(
        listener,
        router.clone(),
        workers,
        shutdown.clone(),
        tracker.clone(),
    ));
    let models: Vec<&str> = router
        .settings
        .models
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    tracing::info!(
        "serving on http://{addr} with {threads} thread(s) for {} model(s) ({}); daemon socket {}{}",
        models.len(),
        models.join(", "),
        socket.display(),
        if router.settings.api_keys.is_empty() {
            "; no API keys: anyone who reaches the port may use it"
        } else {
            ""
        }
    );
    let stop_agent = CancellationToken::new();
    let agent_task = agent.map(|l| {
        let at = l.local_addr().ok();
        tracing::info!(
            "answering HAProxy agent checks on {}",
            at.map_or_else(|| "?".into(), |a| a.to_string())
        );
        tokio::spawn(agent_listen::serve(l, router.clone(), stop_agent.clone()))
    });
    let mut notifier = Notifier::from_env();
    notifier.ready(&format!("serving on {addr}"));
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    let mut leave_now = false;
    if agent_task.is_some() {
        let timeout = router.settings.drain_timeout;
        tracing::info!(
            "stopping: answering the balancers drain, serving until each polling was told and \
             no request came for {:?} ({timeout:?} at most)",
            router.settings.drain_grace
        );
        notifier.stopping("draining: telling the balancers");
        router.begin_stop();
        let drained = async {
            while !router.stop_drained() {
                tokio::time::sleep(link::REPORT_EVERY).await;
            }
        };
        tokio::select! {
            _ = drained => {}
            _ = term.recv() => leave_now = true,
            _ = int.recv() => leave_now = true,
        }
    }
    tracing::info!("stopping: no new connections; requests in progress have {grace:?}");
    notifier.stopping("finishing requests in progress");
    shutdown.cancel();
    let _ = server.await;
    tracker.close();
    if !leave_now {
        tokio::select! {
            _ = tracker.wait() => {}
            _ = tokio::time::sleep(grace) => {
                tracing::warn!("requests still in progress after {grace:?}; leaving");
            }
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
    stop_agent.cancel();
    if let Some(t) = agent_task {
        let _ = t.await;
    }
    // The daemon link ends with the cancel; a last report is not needed (the daemon ages
    // reports out after stale_after).
    let _ = tokio::time::timeout(Duration::from_secs(1), links.wait()).await;
    stop_workers.cancel();
    for j in joins {
        let _ = j.join();
    }
    Ok(())
}
