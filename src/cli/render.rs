//! The tables `hearth status` and `hearth gpus` print. A value the daemon does not have (no fresh
//! queue report, no pid yet) is "—"; long GPU UUIDs are shortened (`--json` keeps them whole).

use std::collections::{BTreeMap, BTreeSet};

use crate::protocol::{
    ConfigFileState, DaemonView, GpuView, ModelView, StatusView, UpgradeOutcome,
};

/// What a table shows for a value there is none of.
pub(super) const NONE: &str = "—";

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| NONE.to_string(), |v| v.to_string())
}

/// `v` with its unit, or "—" alone.
fn with_unit<T: std::fmt::Display>(v: Option<T>, unit: &str) -> String {
    v.map_or_else(|| NONE.to_string(), |v| format!("{v} {unit}"))
}

/// UUIDs longer than this are shortened in tables.
const LONG_UUID: usize = 20;
/// Hex digits of a shortened UUID kept after its kind (`GPU-`, `MIG-`).
const UUID_HEAD: usize = 8;

/// A long GPU or MIG UUID as a table shows it: its kind, the first hex digits, and a MIG slice's
/// `/GI/CI` when it has one ("GPU-3f1b6c2e…", "MIG-GPU-3f1b6c2e…/1/0"). Short ones stay whole.
pub(super) fn short_uuid(uuid: &str) -> String {
    if uuid.chars().count() <= LONG_UUID {
        return uuid.to_string();
    }
    let (kind, rest) = ["MIG-GPU-", "GPU-", "MIG-"]
        .iter()
        .find_map(|k| uuid.strip_prefix(k).map(|rest| (*k, rest)))
        .unwrap_or(("", uuid));
    let (body, slice) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let head: String = body.chars().take(UUID_HEAD).collect();
    if head.len() == body.len() {
        return uuid.to_string();
    }
    format!("{kind}{head}…{slice}")
}

/// Each UUID's shortened form, or the whole UUID where two would shorten alike.
#[derive(Default)]
pub(super) struct Uuids(BTreeMap<String, String>);

impl Uuids {
    pub(super) fn new<'a>(all: impl IntoIterator<Item = &'a str>) -> Uuids {
        let all: BTreeSet<&str> = all.into_iter().collect();
        let mut by_short: BTreeMap<String, Vec<&str>> = BTreeMap::new();
        for u in &all {
            by_short.entry(short_uuid(u)).or_default().push(u);
        }
        let mut map = BTreeMap::new();
        for (short, uuids) in by_short {
            for u in &uuids {
                let shown = if uuids.len() == 1 {
                    short.clone()
                } else {
                    u.to_string()
                };
                map.insert(u.to_string(), shown);
            }
        }
        Uuids(map)
    }

    pub(super) fn show(&self, uuid: &str) -> String {
        self.0
            .get(uuid)
            .cloned()
            .unwrap_or_else(|| short_uuid(uuid))
    }
}

pub fn status_table(s: &StatusView) -> String {
    let uuids = Uuids::new(
        s.gpus.iter().map(|g| g.uuid.as_str()).chain(
            s.models
                .iter()
                .flat_map(|m| &m.replicas)
                .flat_map(|r| r.gpus.iter().map(String::as_str)),
        ),
    );
    let mut out = daemon_lines(&s.daemon);
    if s.models.is_empty() {
        out.push_str("no models configured\n");
    }
    for m in &s.models {
        out.push_str(&model_block(m, &uuids));
        out.push('\n');
    }
    if !s.gpus.is_empty() {
        out.push_str(&gpu_rows(&s.gpus, &uuids));
    }
    out
}

/// What is amiss with the daemon itself, a line each: a configuration file that is not what
/// runs, an upgrade that did not end well. Nothing when all is well.
fn daemon_lines(d: &DaemonView) -> String {
    let mut out = String::new();
    let f = &d.config_file;
    if f.state == ConfigFileState::Differs {
        out.push_str(&format!(
            "config file {} differs from what runs: {}\n",
            f.path, f.reason
        ));
    }
    if let Some(u) = &d.upgrade {
        if u.outcome != UpgradeOutcome::Done || !u.not_kept.is_empty() {
            out.push_str(&format!(
                "last upgrade (attempt {}, to hearth {}): {}: {}; {} of {} replica(s) kept\n",
                u.attempt, u.to_version, u.outcome, u.reason, u.kept, u.handed_over
            ));
        }
    }
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

fn model_block(m: &ModelView, uuids: &Uuids) -> String {
    let mut out = format!(
        "{} (version {})  health {}{}{}\n",
        m.name,
        m.version,
        m.health,
        if m.health_reason.is_empty() {
            String::new()
        } else {
            format!(": {}", m.health_reason)
        },
        if m.drained {
            "  DRAINED off the balancers (hearth undrain --model)"
        } else {
            ""
        }
    );
    out.push_str(&format!(
        "  routed {}/{}  warm {}/{}  starting {}  pending {}  draining {}  (min {}, max {}, pool {}, {} slot{} each)\n",
        m.routed, m.desired_routed, m.warm, m.desired_warm, m.starting, m.pending, m.draining, m.min, m.max, m.warm_pool,
        m.slots, if m.slots == 1 { "" } else { "s" }
    ));
    out.push_str(&format!(
        "  queue: oldest wait {} (target {} ms), depth {}, in flight {}, report age {}",
        with_unit(m.signal.oldest_wait_ms.map(|w| w.round()), "ms"),
        m.target_wait_ms,
        opt(m.signal.queue_depth),
        opt(m.signal.in_flight),
        with_unit(m.signal.age_ms, "ms")
    ));
    if let Some(t) = m.time_to_ready_ms {
        out.push_str(&format!("; time to ready {:.1} s", t as f64 / 1000.0));
    }
    out.push('\n');
    if let Some(w) = &m.wake {
        let secs = |ms: Option<u64>| with_unit(ms.map(|v| v as f64 / 1000.0), "s");
        out.push_str(&format!(
            "  sleeping {}  waking {}  wake time: last {}, p50 {}, p99 {} ({} woken, {} failed)\n",
            m.sleeping,
            m.waking,
            secs(w.last_ms),
            secs(w.p50_ms),
            secs(w.p99_ms),
            w.wakes,
            w.failed
        ));
    }
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
            "  {:<22} {:<9} {:>8} {:<21} {:>8} {:<14} {}\n",
            "REPLICA", "STATE", "PID", "ADDR", "RESTARTS", "GPUS", "REASON"
        ));
        for r in &m.replicas {
            let gpus = if r.gpus.is_empty() {
                NONE.to_string()
            } else {
                r.gpus
                    .iter()
                    .map(|u| uuids.show(u))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            out.push_str(&format!(
                "  {:<22} {:<9} {:>8} {:<21} {:>8} {:<14} {}\n",
                r.id,
                r.state.to_string(),
                opt(r.pid),
                opt(r.addr.as_deref()),
                r.restarts,
                gpus,
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
    gpu_rows(gpus, &Uuids::new(gpus.iter().map(|g| g.uuid.as_str())))
}

fn gpu_rows(gpus: &[GpuView], uuids: &Uuids) -> String {
    let gib = |b: u64| format!("{:.1}", b as f64 / (1u64 << 30) as f64);
    let shown: Vec<String> = gpus.iter().map(|g| uuids.show(&g.uuid)).collect();
    let uuid_width = shown
        .iter()
        .map(|u| u.chars().count())
        .chain([4])
        .max()
        .unwrap_or(4);
    let row = |cols: [&str; 11]| {
        let [index, uuid, name, total, reserved, used, foreign, healthy, cordon, replicas, note] =
            cols;
        format!(
            "{index:<5} {uuid:<uuid_width$} {name:<20} {total:>9} {reserved:>8} {used:>8} {foreign:>8} {healthy:<7} {cordon:<6} {replicas:<20} {note}\n"
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
    for (g, uuid) in gpus.iter().zip(&shown) {
        let replicas = if g.replicas.is_empty() {
            NONE.to_string()
        } else {
            let shown: Vec<String> = g
                .replicas
                .iter()
                .map(|r| match g.asleep.contains(r) {
                    true => format!("{r}(asleep)"),
                    false => r.clone(),
                })
                .collect();
            shown.join(",")
        };
        out.push_str(&row([
            &g.index.to_string(),
            uuid,
            &g.name,
            &gib(g.memory_total),
            &gib(g.memory_reserved),
            &g.memory_used.map_or_else(|| NONE.to_string(), gib),
            &g.memory_foreign.map_or_else(|| NONE.to_string(), gib),
            if g.healthy { "yes" } else { "NO" },
            if g.cordoned { "yes" } else { "no" },
            &replicas,
            g.note.as_deref().unwrap_or(""),
        ]));
    }
    out
}
