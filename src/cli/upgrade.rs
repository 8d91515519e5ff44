//! `hearth upgrade` (issue 24, item 2): success only when the daemon then answers as the binary
//! that was checked and every replica kept its process. The daemon answers with the attempt
//! (the new binary passed `--version`), re-executes, and the binary that runs after says in
//! `status.daemon.upgrade` how that attempt ended: done, fallen back to the previous binary, or
//! failed before the exec. Anything but done with every replica kept exits 1 with the reason.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use crate::client::Client;
use crate::protocol::{Request, Response, UpgradeOutcome, UpgradePlan, UpgradeView};

/// How long the CLI waits for the attempt's outcome: adoption is a proof per replica, a new
/// binary that hangs must not keep the operator waiting for ever.
const OUTCOME_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);

/// After the daemon answered `upgrading`: waits for the attempt's outcome and says it.
pub async fn wait(socket: &Path, plan: UpgradePlan) -> ExitCode {
    eprintln!(
        "upgrading to hearth {} ({}), attempt {}",
        plan.version, plan.binary, plan.attempt
    );
    let deadline = tokio::time::Instant::now() + OUTCOME_TIMEOUT;
    loop {
        if let Some((view, version)) = outcome(socket, plan.attempt).await {
            return judge(&plan, &view, &version);
        }
        if tokio::time::Instant::now() > deadline {
            eprintln!(
                "hearth: upgrade failed: the daemon did not say how attempt {} ended within {} s \
                 (a binary older than this one does not; see `hearth status` and the daemon's \
                 log)",
                plan.attempt,
                OUTCOME_TIMEOUT.as_secs()
            );
            return ExitCode::from(1);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The outcome of `attempt` and the daemon's version, once the daemon that runs reports it.
async fn outcome(socket: &Path, attempt: u64) -> Option<(UpgradeView, String)> {
    let mut c = Client::connect(socket).await.ok()?;
    let Ok(Ok(Response::Status { status })) = c.ask(&Request::Status { model: None }).await else {
        return None;
    };
    let view = status.daemon.upgrade.filter(|u| u.attempt == attempt)?;
    Some((view, status.daemon.version))
}

/// What the outcome means for the operator: exit 0 only for the new binary with every replica.
fn judge(plan: &UpgradePlan, view: &UpgradeView, version: &str) -> ExitCode {
    let failed = |why: String| {
        eprintln!("hearth: upgrade failed: {why}");
        ExitCode::from(1)
    };
    match view.outcome {
        UpgradeOutcome::FellBack | UpgradeOutcome::Failed => failed(format!(
            "{}; hearth {version} runs, {} of {} replica(s) kept",
            view.reason, view.kept, view.handed_over
        )),
        UpgradeOutcome::Done if version != plan.version => failed(format!(
            "the daemon answers as hearth {version}, not as {} that {} said it is",
            plan.version, plan.binary
        )),
        UpgradeOutcome::Done if !view.not_kept.is_empty() || view.kept != view.handed_over => {
            failed(format!(
                "hearth {version} runs, but {} of {} replica(s) did not keep their process and \
                 role: {}",
                view.handed_over.saturating_sub(view.kept),
                view.handed_over,
                view.not_kept.join("; ")
            ))
        }
        UpgradeOutcome::Done => {
            println!(
                "upgraded: hearth {version} runs; {} replica(s) handed over, every one kept its \
                 process and role",
                view.handed_over
            );
            ExitCode::SUCCESS
        }
    }
}

/// A daemon older than this CLI answers a bare yes and reports no outcome: success when it
/// comes back as this CLI's own version (the binary on disk, as a rule).
pub async fn wait_legacy(socket: &Path) -> ExitCode {
    let want = env!("CARGO_PKG_VERSION");
    let deadline = tokio::time::Instant::now() + OUTCOME_TIMEOUT;
    loop {
        if let Ok(mut c) = Client::connect(socket).await {
            if let Ok(Ok(Response::Version { version, .. })) = c.ask(&Request::Version {}).await {
                if version == want {
                    println!(
                        "upgraded: hearth {version} answers (the daemon before it reports no \
                         outcome: check `hearth status` for the replicas)"
                    );
                    return ExitCode::SUCCESS;
                }
            }
        }
        if tokio::time::Instant::now() > deadline {
            eprintln!(
                "hearth: upgrade failed: the daemon did not answer as hearth {want} within {} s",
                OUTCOME_TIMEOUT.as_secs()
            );
            return ExitCode::from(1);
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> UpgradePlan {
        UpgradePlan {
            attempt: 7,
            version: "0.2.0".into(),
            binary: "/opt/hearth/hearth".into(),
        }
    }

    fn view(outcome: UpgradeOutcome, kept: u32, not_kept: &[&str]) -> UpgradeView {
        UpgradeView {
            attempt: 7,
            outcome,
            to_version: "0.2.0".into(),
            reason: "why".into(),
            handed_over: 3,
            kept,
            not_kept: not_kept.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn only_the_new_version_with_every_replica_kept_is_success() {
        let ok = ExitCode::SUCCESS;
        let bad = ExitCode::from(1);
        assert_eq!(
            judge(&plan(), &view(UpgradeOutcome::Done, 3, &[]), "0.2.0"),
            ok
        );
        assert_eq!(
            judge(&plan(), &view(UpgradeOutcome::Done, 3, &[]), "0.1.0"),
            bad
        );
        assert_eq!(
            judge(
                &plan(),
                &view(UpgradeOutcome::Done, 2, &["a-1: pid 1, now 2"]),
                "0.2.0"
            ),
            bad
        );
        assert_eq!(
            judge(&plan(), &view(UpgradeOutcome::FellBack, 3, &[]), "0.1.0"),
            bad
        );
        assert_eq!(
            judge(&plan(), &view(UpgradeOutcome::Failed, 0, &[]), "0.1.0"),
            bad
        );
    }
}
