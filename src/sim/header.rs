//! What a run says about itself before its figures: where its slots per replica came from, the
//! lines of the header (text output, Markdown, plot footer), and the refusal of a run that would
//! measure nothing.

use crate::config::{ModelConfig, WarmPool};

use super::engine::Asleep;
use super::workload::{self, Workload};
use super::{report, Setup};

/// Slots per replica when neither `--concurrency` nor the model's `slots` says.
pub const DEFAULT_SLOTS: u32 = 8;

/// Where a run's slots per replica (`--concurrency`) came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotsFrom {
    /// `--concurrency N`.
    Flag,
    /// The model's `slots` in the configuration file.
    Model,
    /// Neither: `DEFAULT_SLOTS`.
    Default,
}

impl SlotsFrom {
    fn says(self) -> &'static str {
        match self {
            SlotsFrom::Flag => "--concurrency",
            SlotsFrom::Model => "the model's `slots`",
            SlotsFrom::Default => "default: the model sets no `slots`",
        }
    }
}

/// Slots per replica: `--concurrency` where given, else the model's `slots` where the file sets
/// them, else `DEFAULT_SLOTS`.
pub fn slots_per_replica(flag: Option<u32>, m: &ModelConfig) -> (u32, SlotsFrom) {
    match flag {
        Some(n) => (n, SlotsFrom::Flag),
        None if m.slots_declared => (m.slots, SlotsFrom::Model),
        None => (DEFAULT_SLOTS, SlotsFrom::Default),
    }
}

/// Why the run would measure nothing, if it would: the figures count only requests that arrive
/// after the warm-up, so a workload that ends before it gives a table of zeros.
pub fn nothing_measured(w: &Workload, setup: &Setup) -> Option<String> {
    let warmup = setup.params.warmup;
    if report::measured(w, warmup).next().is_some() {
        return None;
    }
    Some(match w.requests.last() {
        None => format!("workload {} has no requests: nothing to measure", w.name),
        Some(last) => format!(
            "nothing to measure: the last request of {} arrives at {}, before the warm-up ends \
             at {} (--warmup; the figures count only requests that arrive after it): give a \
             shorter --warmup or a longer workload",
            w.name,
            workload::fmt_secs(last.t),
            workload::fmt_secs(warmup)
        ),
    })
}

/// The sleeping tier's parameters and the host-memory budget that bounds its sleepers.
fn sleep_note(setup: &Setup, a: Asleep) -> String {
    let p = &setup.params;
    let budget = match (setup.config.daemon.host_memory, p.max_asleep) {
        (Some(b), Some(n)) => format!(
            "host memory budget {} (--host-memory, else [daemon] host_memory): at most {n} \
             asleep at once",
            crate::units::short_bytes(b)
        ),
        (Some(b), None) => format!(
            "host memory budget {} (sleepers hold none of it: not bounded)",
            crate::units::short_bytes(b)
        ),
        (None, _) => "no host memory budget (--host-memory, [daemon] host_memory): sleepers \
                      not bounded"
            .to_string(),
    };
    format!(
        "sleeping tier: wake {}, fall asleep {}, a sleeper charged {:.1} % of a replica and \
         holding {} of host memory; {budget}",
        workload::fmt_secs(p.wake),
        workload::fmt_secs(p.fall_asleep),
        a.charge * 100.0,
        crate::units::short_bytes(a.host_memory)
    )
}

/// The lines that say what was simulated (text output, plot footer).
pub fn notes(setup: &Setup, w: &Workload, slots_from: SlotsFrom) -> Vec<String> {
    let p = &setup.params;
    let m = setup.config.model(&setup.model).expect("checked");
    let pool = match m.scaling.warm_pool {
        WarmPool::Fixed(n) => n.to_string(),
        WarmPool::Auto => "auto".into(),
    };
    let mut v = vec![
        format!("scenario {}: {}", w.name, w.description),
        format!(
            "model {}: {} slots per replica ({}), cold start {}, promotion delay {}, target \
             wait {}, min {}, max {}, warm pool {} (hearth; 0 for hearth-nopool and the \
             baselines), down_stabilization {}, down_step {} (hearth); figures from {} on",
            setup.model,
            p.concurrency,
            slots_from.says(),
            workload::fmt_secs(p.cold_start),
            workload::fmt_secs(p.promotion),
            workload::fmt_secs(p.target_wait),
            p.min,
            p.max,
            pool,
            m.scaling.down_stabilization,
            m.scaling.down_step,
            workload::fmt_secs(p.warmup)
        ),
        setup.target_notes(),
    ];
    if p.router == super::Router::FrontDoor {
        v.push(
            "router: front door (`--router front-door`): one FIFO for the model, a request \
             leaves it for a free slot, as `hearth route` serves; hearth reports as its front \
             door does"
                .into(),
        );
    }
    if let Some(a) = p.asleep {
        v.push(sleep_note(setup, a));
    }
    if let Some(a) = &w.attribution {
        v.push(format!("trace: {a}"));
    }
    v
}
