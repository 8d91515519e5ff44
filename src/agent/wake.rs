//! What wakes the daemon's loop, and in which order: signals, the watchdog, the shutdown
//! deadline and the timer before the two message queues, which take turns (issue 11: a flood of
//! reports must starve neither the timer nor an operator's `status`).

use std::time::Duration;

use tokio::sync::mpsc;

use super::inbox::ShellMsg;

/// What woke the loop.
// One value at a time, on the loop's stack for one turn and never stored: boxing the message
// would cost an allocation per message for nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Wake {
    Msg(ShellMsg),
    /// SIGTERM/SIGINT; true from the second one on.
    Stop(bool),
    Hangup,
    Watchdog,
    Tick,
    /// The shutdown's last deadline passed with replicas still alive.
    Deadline,
    /// A step of `upgrade`: the new binary checked, or the answer written (re-execute now).
    Upgrade(super::upgrade::UpgradeStep),
}

/// Where the loop's wake-ups come from, and in which order it takes them when several are ready.
pub(super) struct Sources {
    pub(super) stop: mpsc::Receiver<bool>,
    pub(super) hup: mpsc::Receiver<()>,
    pub(super) watchdog: Option<tokio::time::Interval>,
    /// Reports and the workers' events.
    pub(super) inbox: mpsc::Receiver<ShellMsg>,
    /// Operators' requests (status, scale, watch…) and metrics snapshots.
    pub(super) operators: mpsc::Receiver<ShellMsg>,
    /// Which of the two queues goes first next time: they take turns.
    pub(super) operators_first: bool,
    /// After a shutdown began: exit even if replicas are still alive.
    pub(super) deadline: Option<tokio::time::Instant>,
    /// The steps of `upgrade`.
    pub(super) upgrade: mpsc::Receiver<super::upgrade::UpgradeStep>,
}

impl Sources {
    /// The next wake-up. Signals, the watchdog, the shutdown deadline and the timer come before
    /// the queues: each is due at most once per period, so they cannot starve the queues, while
    /// a steady stream of requests would otherwise starve them (the timer drives probes,
    /// timeouts, SIGKILL after stop_grace, scrapes and scale-down). The two queues take turns,
    /// so a flood of reports delays an operator's `status` by one event, not by the flood.
    pub(super) async fn next(&mut self, tick: &mut tokio::time::Interval) -> Wake {
        let operators_first = self.operators_first;
        self.operators_first = !operators_first;
        // Written out twice: `select!` takes its branches in the order written.
        if operators_first {
            tokio::select! {
                biased;
                Some(immediate) = self.stop.recv() => Wake::Stop(immediate),
                Some(()) = self.hup.recv() => Wake::Hangup,
                // A loop busy with a flood of reports is turning, not stuck.
                _ = tick_opt(&mut self.watchdog) => Wake::Watchdog,
                _ = sleep_opt(self.deadline) => Wake::Deadline,
                _ = tick.tick() => Wake::Tick,
                Some(step) = self.upgrade.recv() => Wake::Upgrade(step),
                Some(msg) = self.operators.recv() => Wake::Msg(msg),
                Some(msg) = self.inbox.recv() => Wake::Msg(msg),
            }
        } else {
            tokio::select! {
                biased;
                Some(immediate) = self.stop.recv() => Wake::Stop(immediate),
                Some(()) = self.hup.recv() => Wake::Hangup,
                _ = tick_opt(&mut self.watchdog) => Wake::Watchdog,
                _ = sleep_opt(self.deadline) => Wake::Deadline,
                _ = tick.tick() => Wake::Tick,
                Some(step) = self.upgrade.recv() => Wake::Upgrade(step),
                Some(msg) = self.inbox.recv() => Wake::Msg(msg),
                Some(msg) = self.operators.recv() => Wake::Msg(msg),
            }
        }
    }
}

pub(super) fn ticker(period: Duration) -> tokio::time::Interval {
    let mut t = tokio::time::interval(period);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

/// A deadline that may not be set: never, then.
async fn sleep_opt(d: Option<tokio::time::Instant>) {
    match d {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The next tick of a timer that may not exist (no watchdog): never, then.
async fn tick_opt(t: &mut Option<tokio::time::Interval>) {
    match t {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::inbox;
    use crate::core::Event;

    fn sources() -> (Sources, inbox::Sender, inbox::Sender) {
        let (_stop_tx, stop) = mpsc::channel(1);
        let (_hup_tx, hup) = mpsc::channel(1);
        let (tx, rx) = inbox::channel();
        let (otx, orx) = inbox::channel();
        let (_upgrade_tx, upgrade) = mpsc::channel(1);
        let s = Sources {
            stop,
            hup,
            watchdog: None,
            inbox: rx,
            operators: orx,
            operators_first: true,
            deadline: None,
            upgrade,
        };
        (s, tx, otx)
    }

    fn is_event(w: &Wake) -> bool {
        matches!(w, Wake::Msg(ShellMsg::Event(_)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_inbox_starves_neither_the_timer_nor_the_deadline_nor_operators() {
        let (mut s, tx, otx) = sources();
        for _ in 0..1000 {
            tx.try_send(ShellMsg::Event(Event::Tick)).unwrap();
        }
        let mut tick = ticker(Duration::from_millis(20));
        assert!(matches!(s.next(&mut tick).await, Wake::Tick), "first tick");
        assert!(is_event(&s.next(&mut tick).await));
        // The timer is due again: it comes before the 998 messages still queued.
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(matches!(s.next(&mut tick).await, Wake::Tick));
        assert!(is_event(&s.next(&mut tick).await));
        // The shutdown's deadline, too, whatever the timer does.
        s.deadline = Some(tokio::time::Instant::now());
        assert!(matches!(s.next(&mut tick).await, Wake::Deadline));
        s.deadline = None;
        // An operator's request behind the queued reports: served within two wake-ups.
        let (reply, _rx) = tokio::sync::oneshot::channel();
        otx.try_send(ShellMsg::Snapshot { reply }).unwrap();
        let mut before = 0;
        loop {
            match s.next(&mut tick).await {
                Wake::Msg(ShellMsg::Snapshot { .. }) => break,
                _ => before += 1,
            }
        }
        assert!(before <= 1, "{before} wake-ups first");
    }
}
