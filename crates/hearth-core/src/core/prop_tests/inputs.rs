//! What the property test throws at the core: its configurations (good, narrowing, absurd),
//! hostile numbers, and the steps a sequence is made of.

use proptest::prelude::*;

const DEVICES: &str = r#"
[gpus]
backend = "static"
[[gpus.device]]
uuid = "GPU-a"
memory = "80GiB"
[[gpus.device]]
uuid = "GPU-b"
memory = "80GiB"
"#;

fn model(name: &str, extra: &str, scaling: &str) -> String {
    format!(
        r#"
[[model]]
name = "{name}"
command = ["server", "--port", "{{port}}"]
stop_grace = "5s"
{extra}
[model.warmup]
url = "http://127.0.0.1:{{port}}/v1/completions"
startup_timeout = "10s"
recheck = "1m"
[model.liveness]
url = "http://127.0.0.1:{{port}}/health"
interval = "2s"
failures = 2
[model.scaling]
drain_timeout = "30s"
{scaling}
"#
    )
}

/// The configurations a sequence may run and reload: a CPU model with a pool, a shared-GPU model,
/// a whole-device model that scrapes and outranks the others; then variants: scaling changed,
/// a new version (a rollout), a model removed, one added, the ports narrowed, absurd durations.
pub(super) fn configs() -> Vec<String> {
    let a = |scaling: &str, version: &str| {
        model("a", &format!("gpus = 0\nversion = \"{version}\""), scaling)
    };
    let b = model(
        "b",
        "gpus = 1\ngpu_memory = \"30GiB\"",
        "min = 1\nmax = 3\nwarm_pool = \"auto\"",
    );
    let c = model(
        "c",
        "gpus = 1\npriority = 5",
        "min = 0\nmax = 2\nwarm_pool = 1\n[model.signal]\nscrape = \"http://127.0.0.1:{port}/metrics\"\nformat = \"vllm\"",
    );
    let d = model("d", "gpus = 0", "min = 2\nmax = 2");
    let head = |ports: &str| {
        format!("[daemon]\nsocket = \"/tmp/hearth-prop.sock\"\nports = \"{ports}\"\nshutdown_timeout = \"20s\"\n{DEVICES}")
    };
    let base = head("30000-30031");
    vec![
        format!("{base}{}{b}{c}", a("min = 1\nmax = 4\nwarm_pool = 1", "1")),
        format!("{base}{}{b}{c}", a("min = 2\nmax = 6\nwarm_pool = 2", "1")),
        format!("{base}{}{b}{c}", a("min = 1\nmax = 4\nwarm_pool = 1", "2")),
        format!("{base}{}{b}", a("min = 1\nmax = 4\nwarm_pool = 0", "1")),
        format!("{base}{}{b}{c}{d}", a("min = 1\nmax = 4\nwarm_pool = 1", "1")),
        format!("{}{}{b}{c}", head("30000-30009"), a("min = 1\nmax = 4", "1")),
        format!(
            "{base}{}{b}{c}",
            a(
                "min = 0\nmax = 4\nwarm_pool = 1\nidle_to_zero = \"1s\"\ndown_stabilization = \"1s\"\ndown_step = \"1s\"",
                "1"
            )
        )
        .replace("drain_timeout = \"30s\"", "drain_timeout = \"5124095576030431h\"")
        .replace("stop_grace = \"5s\"", "stop_grace = \"5124095576030431h\""),
        // Many more replicas than one event may stop: the range for hundreds, `max` shrunk
        // under them by a reload, a new version rolled out over them (`BIG`, `BIG + 1`,
        // `BIG + 2`); ports for model `b` besides.
        format!(
            "{}{}{b}",
            head(&format!("30000-{}", 30000 + BIG_PORTS + 7)),
            a(&format!("min = 1\nmax = {BIG_PORTS}\nwarm_pool = 2"), "1")
        ),
        format!(
            "{}{}{b}",
            head(&format!("30000-{}", 30000 + BIG_PORTS + 7)),
            a("min = 1\nmax = 3\nwarm_pool = 1", "1")
        ),
        format!(
            "{}{}{b}",
            head(&format!("30000-{}", 30000 + BIG_PORTS + 7)),
            a(&format!("min = 1\nmax = {BIG_PORTS}\nwarm_pool = 2"), "2")
        ),
        // More models than GPUs (`SLEEPY`, `SLEEPY + 1`): three with a sleeping tier, two
        // awake to a device, one of them above the others, within a host RAM budget for two
        // asleep; then two that fit one awake to a device, with a pinned model, a warm pool
        // and `idle_to_sleep`.
        format!(
            "{}{}{}{}",
            head("30000-30031").replace("\n[gpus]", "host_memory = \"60GiB\"\n[gpus]"),
            sleepy("e", "", "min = 2\nmax = 3\nwarm_pool = 0"),
            sleepy("f", "priority = 5", "min = 2\nmax = 3\nwarm_pool = 0"),
            sleepy("g", "", "min = 2\nmax = 3\nwarm_pool = 1"),
        )
        .replace("50GiB", "30GiB"),
        format!(
            "{}{}{}{}",
            head("30000-30031").replace("\n[gpus]", "host_memory = \"60GiB\"\n[gpus]"),
            sleepy("e", "", "min = 0\nmax = 2\nwarm_pool = 1"),
            sleepy("g", "", "min = 1\nmax = 2\nwarm_pool = 0")
                .replace("[model.sleep]\n", "[model.sleep]\nidle_to_sleep = \"2s\"\n"),
            model(
                "p",
                "gpus = 1\ngpu_memory = \"20GiB\"\npin = true",
                "min = 1\nmax = 1\nwarm_pool = 0",
            ),
        ),
    ]
}

/// Where the sleeping-tier configurations start.
pub(super) const SLEEPY: usize = 10;

/// A vLLM model with a sleeping tier on one GPU: 50 GiB awake, 1 GiB and 30 GiB of host RAM
/// asleep.
fn sleepy(name: &str, extra: &str, scaling: &str) -> String {
    model(
        name,
        &format!("gpus = 1\ngpu_memory = \"50GiB\"\n{extra}"),
        &format!(
            "{scaling}\n[model.sleep]\nformat = \"vllm\"\nsleep_timeout = \"5s\"\n\
             wake_timeout = \"10s\"\ngpu_memory_asleep = \"1GiB\"\nhost_memory = \"30GiB\""
        ),
    )
    .replace(
        r#"["server", "--port""#,
        r#"["server", "--host", "127.0.0.1", "--port""#,
    )
}

/// The configurations of the many-replica family: the range and `max` of `BIG_PORTS`, the
/// same with `max` 3, and with a new version.
pub(super) const BIG: usize = 7;
/// Several times the stops one event may make (six times `STOPS_PER_EVENT`, 32); a number of
/// its own, so that the family still runs with the bound lifted (and then fails).
pub(super) const BIG_PORTS: u32 = 192;

/// Numbers as a hostile client picks them: the edges, the bounds, anything.
fn hostile_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0u64..20,
        1 => Just(u64::MAX),
        1 => Just(1u64 << 32),
        1 => Just(crate::protocol::MAX_QUEUE),
        1 => Just(crate::protocol::MAX_COUNTER),
        1 => any::<u64>(),
    ]
}

fn hostile_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => 0u32..10,
        1 => Just(u32::MAX),
        1 => Just(100_000u32),
        1 => 10u32..64,
        1 => any::<u32>(),
    ]
}

fn hostile_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => 0.0f64..3000.0,
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(-1.0),
        1 => Just(1e19),
        1 => Just(crate::protocol::MAX_WAIT_MS),
        1 => any::<f64>(),
    ]
}

#[derive(Debug, Clone)]
pub(super) enum Step {
    /// Time passes (ms), then a tick.
    Advance(u64),
    Spawned(u8),
    SpawnFailed(u8),
    Exited(u8),
    Probe {
        replica: u8,
        kind: u8,
        ok: bool,
        not_ready: bool,
    },
    Scraped {
        replica: u8,
        ok: bool,
        depth: u64,
        in_flight: u64,
        wait: Option<f64>,
        counter: Option<u64>,
    },
    Report {
        model: u8,
        replica: Option<u8>,
        wait: Option<f64>,
        depth: Option<u64>,
        in_flight: Option<u64>,
        arrived: Option<u64>,
        completed: Option<u64>,
        peer: u8,
    },
    Scale {
        model: u8,
        min: Option<u32>,
        max: Option<u32>,
        warm: Option<Option<u32>>,
        reset: bool,
        peer: u8,
    },
    Drain {
        replica: u8,
        force: bool,
        peer: u8,
    },
    Cordon {
        gpu: u8,
        on: bool,
        evacuate: bool,
    },
    Xid(u8, u64),
    Memory(u8, u64, Vec<(u32, u64)>),
    Prefetch(u8, u64, u64),
    ReloadAsk(bool),
    /// The shell's read comes back: a configuration (by index), or an error.
    ConfigRead(u8),
    Read(u8, u8),
    Shutdown(bool),
    /// The daemon ends and a new one adopts its replicas: after a hand-over (`hearth upgrade`)
    /// or a kill -9; with the configuration in force, or (one time in four) another.
    Restart {
        handed_over: bool,
        config: u8,
    },
}

impl Step {
    /// `scale` of model `a` (the first name) to `min`..`max`, by an admin (peer 4: neither a
    /// replica's process nor in one).
    pub(super) fn admin_scale(min: u32, max: u32) -> Step {
        Step::Scale {
            model: 0,
            min: Some(min),
            max: Some(max),
            warm: None,
            reset: false,
            peer: 4,
        }
    }
}

pub(super) fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => prop_oneof![4 => 0u64..3000, 1 => 3000u64..120_000, 1 => Just(3_600_000u64)]
            .prop_map(Step::Advance),
        4 => any::<u8>().prop_map(Step::Spawned),
        1 => any::<u8>().prop_map(Step::SpawnFailed),
        2 => any::<u8>().prop_map(Step::Exited),
        5 => (any::<u8>(), 0u8..6, prop::bool::weighted(0.8), any::<bool>())
            .prop_map(|(replica, kind, ok, not_ready)| Step::Probe { replica, kind, ok, not_ready }),
        1 => (any::<u8>(), any::<bool>(), hostile_u64(), hostile_u64(), prop::option::of(hostile_f64()), prop::option::of(hostile_u64()))
            .prop_map(|(replica, ok, depth, in_flight, wait, counter)| Step::Scraped { replica, ok, depth, in_flight, wait, counter }),
        5 => (any::<u8>(), prop::option::of(any::<u8>()), prop::option::of(hostile_f64()), prop::option::of(hostile_u64()),
              prop::option::of(hostile_u64()), prop::option::of(hostile_u64()), prop::option::of(hostile_u64()), any::<u8>())
            .prop_map(|(model, replica, wait, depth, in_flight, arrived, completed, peer)| Step::Report { model, replica, wait, depth, in_flight, arrived, completed, peer }),
        2 => (any::<u8>(), prop::option::of(hostile_u32()), prop::option::of(hostile_u32()), prop::option::of(prop::option::of(hostile_u32())), prop::bool::weighted(0.2), any::<u8>())
            .prop_map(|(model, min, max, warm, reset, peer)| Step::Scale { model, min, max, warm, reset, peer }),
        2 => (any::<u8>(), any::<bool>(), any::<u8>()).prop_map(|(replica, force, peer)| Step::Drain { replica, force, peer }),
        1 => (0u8..4, any::<bool>(), any::<bool>()).prop_map(|(gpu, on, evacuate)| Step::Cordon { gpu, on, evacuate }),
        1 => (0u8..3, prop_oneof![Just(79u64), Just(13u64), any::<u64>()]).prop_map(|(g, x)| Step::Xid(g, x)),
        1 => (0u8..3, hostile_u64(), prop::collection::vec((any::<u32>(), hostile_u64()), 0..4))
            .prop_map(|(g, used, by)| Step::Memory(g, used, by)),
        1 => (any::<u8>(), hostile_u64(), hostile_u64()).prop_map(|(r, d, t)| Step::Prefetch(r, d, t)),
        1 => any::<bool>().prop_map(Step::ReloadAsk),
        1 => any::<u8>().prop_map(Step::ConfigRead),
        2 => (0u8..4, any::<u8>()).prop_map(|(op, m)| Step::Read(op, m)),
        1 => prop::bool::weighted(0.3).prop_map(Step::Shutdown),
        1 => (any::<bool>(), any::<u8>())
            .prop_map(|(handed_over, config)| Step::Restart { handed_over, config }),
    ]
}

/// The many-replica family's steps: the hostile ones, and runs of what makes hundreds of replicas
/// surplus at once: a scale of model `a` up to the whole range (its replicas are made a batch
/// per event, so ticks follow), then back down, or `max` shrunk by a reload.
pub(super) fn big_steps() -> impl Strategy<Value = Vec<Step>> {
    prop_oneof![
        4 => step().prop_map(|s| vec![s]),
        2 => (prop_oneof![Just(u32::MAX), 64u32..=BIG_PORTS], 1usize..12, any::<u8>())
            .prop_map(move |(n, ticks, spawned)| {
                let mut v = vec![Step::admin_scale(n, n)];
                for i in 0..ticks {
                    v.push(Step::Advance(100));
                    v.push(Step::Spawned(spawned.wrapping_add(i as u8)));
                }
                v
            }),
        2 => (0u32..3, 0u32..4).prop_map(move |(min, max)| vec![Step::admin_scale(min, max.max(min))]),
        1 => (any::<bool>(), 0u8..3).prop_map(|(signal, c)| vec![
            Step::ReloadAsk(signal),
            Step::ConfigRead(BIG as u8 + c),
        ]),
    ]
}
