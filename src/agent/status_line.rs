//! The one-line status systemd shows (`STATUS=`), from the core's status view.

use crate::protocol::{Health, ModelView, StatusView};

/// The one-line `STATUS=` that `systemctl status hearth` shows, e.g.
/// "3 models: 5 routed, 2 warm, 1 starting; GPUs: static 2".
pub fn status_line(st: &StatusView, gpu_kind: &str, stopping: bool) -> String {
    let sum = |f: fn(&ModelView) -> u32| st.models.iter().map(f).sum::<u32>();
    let (routed, warm, starting) = (sum(|m| m.routed), sum(|m| m.warm), sum(|m| m.starting));
    let (pending, draining) = (sum(|m| m.pending), sum(|m| m.draining));
    if stopping {
        let left = routed + warm + starting + pending + draining;
        return format!("stopping: {left} replica(s) left");
    }
    let n = st.models.len();
    let mut s = format!(
        "{n} model{}: {routed} routed, {warm} warm, {starting} starting",
        if n == 1 { "" } else { "s" }
    );
    if pending > 0 {
        s.push_str(&format!(", {pending} pending"));
    }
    if draining > 0 {
        s.push_str(&format!(", {draining} draining"));
    }
    let names = |f: &dyn Fn(&ModelView) -> bool| {
        st.models
            .iter()
            .filter(|m| f(m))
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    for (label, list) in [
        ("crash_loop", names(&|m| m.health == Health::CrashLoop)),
        ("no_capacity", names(&|m| m.health == Health::NoCapacity)),
        ("unavailable", names(&|m| m.health == Health::Unavailable)),
        (
            "rollout halted",
            names(&|m| m.rollout.as_ref().is_some_and(|r| r.halted.is_some())),
        ),
        (
            "rolling out",
            names(&|m| m.rollout.as_ref().is_some_and(|r| r.halted.is_none())),
        ),
    ] {
        if !list.is_empty() {
            s.push_str(&format!("; {label}: {list}"));
        }
    }
    let unhealthy = st.gpus.iter().filter(|g| !g.healthy).count();
    if st.gpus.is_empty() {
        s.push_str("; GPUs: none");
    } else {
        s.push_str(&format!("; GPUs: {gpu_kind} {}", st.gpus.len()));
        if unhealthy > 0 {
            s.push_str(&format!(" ({unhealthy} unhealthy)"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{GpuView, RolloutView};

    fn model(name: &str, counts: [u32; 5], health: Health, rollout: Rollout) -> ModelView {
        let [routed, warm, starting, pending, draining] = counts;
        let mut m: ModelView = serde_json::from_value(serde_json::json!({
            "name": name, "version": "1", "health": health, "routed": routed, "warm": warm,
            "starting": starting, "pending": pending, "draining": draining,
            "desired_routed": routed, "min": 1, "max": 8, "warm_pool": 1,
            "target_wait_ms": 500, "signal": {}, "last_scale": null, "replicas": []
        }))
        .unwrap();
        let view = |halted: Option<&str>| RolloutView {
            version: "2".into(),
            from: "1".into(),
            updated: 0,
            halted: halted.map(str::to_string),
        };
        m.rollout = match rollout {
            Rollout::None => None,
            Rollout::UnderWay => Some(view(None)),
            // A sentence that says "halted" only in passing must not count: the field does.
            Rollout::Halted => Some(view(Some("version 2 failed to warm up 3 times"))),
        };
        m
    }

    enum Rollout {
        None,
        UnderWay,
        Halted,
    }

    fn gpu(uuid: &str, healthy: bool) -> GpuView {
        GpuView {
            index: 0,
            uuid: uuid.into(),
            name: "static device".into(),
            memory_total: 1,
            memory_reserved: 0,
            healthy,
            cordoned: false,
            replicas: vec![],
            memory_used: None,
            memory_foreign: None,
            note: None,
            topology: None,
            memory_driver_reserved: None,
            mig_parent: None,
            nvlink: Vec::new(),
            asleep: Vec::new(),
        }
    }

    #[test]
    fn the_status_line_sums_models_and_names_the_ones_in_trouble() {
        let st = StatusView {
            daemon: Default::default(),
            models: vec![
                model("a", [3, 1, 1, 0, 0], Health::Ok, Rollout::None),
                model("b", [2, 1, 0, 1, 1], Health::CrashLoop, Rollout::None),
                model("c", [0, 0, 0, 0, 0], Health::Ok, Rollout::Halted),
                model("d", [0, 0, 0, 0, 0], Health::NoCapacity, Rollout::UnderWay),
                model("e", [0, 0, 0, 1, 0], Health::Unavailable, Rollout::None),
            ],
            gpus: vec![gpu("GPU-0", true), gpu("GPU-1", false)],
        };
        assert_eq!(
            status_line(&st, "nvml", false),
            "5 models: 5 routed, 2 warm, 1 starting, 2 pending, 1 draining; crash_loop: b; \
             no_capacity: d; unavailable: e; rollout halted: c; rolling out: d; GPUs: nvml 2 \
             (1 unhealthy)"
        );
        assert_eq!(
            status_line(&st, "nvml", true),
            "stopping: 11 replica(s) left"
        );
        let one = StatusView {
            daemon: Default::default(),
            models: vec![model("a", [2, 1, 0, 0, 0], Health::Ok, Rollout::None)],
            gpus: vec![],
        };
        assert_eq!(
            status_line(&one, "static", false),
            "1 model: 2 routed, 1 warm, 0 starting; GPUs: none"
        );
    }
}
