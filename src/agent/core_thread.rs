//! The thread the core's loop runs on.

use std::time::Duration;

/// Runs the core's loop on a thread of its own, with a runtime of its own, and waits for it.
/// On the runtime's workers the loop would be one task among hundreds of reporters'
/// connections, each of its turns queued behind theirs: under 256 clients reporting at full
/// speed, an operator's `status` (accepted, read, answered by the loop, written) waited behind
/// them at each step (benches/hardening.rs). What the loop starts (processes, probes, reloads)
/// still runs on the workers: it enters their runtime for that. A panic on the thread comes
/// back here as a panic of the daemon's task, which main.rs turns into re-adoption.
pub(super) async fn on_own_thread(
    core: impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
) -> anyhow::Result<()> {
    let (done, finished) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("hearth-core".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = done.send(Ok(Err(anyhow::anyhow!("the core's runtime: {e}"))));
                    return;
                }
            };
            let ended =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.block_on(core)));
            // Name lookups of connections still under way are not waited for.
            rt.shutdown_timeout(Duration::from_secs(1));
            let _ = done.send(ended);
        })?;
    match finished.await {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => Err(anyhow::anyhow!("the core's thread ended without a word")),
    }
}
