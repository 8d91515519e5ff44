//! `hearth simulate`'s options, and the parsers of their values.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

fn parse_dur(s: &str) -> Result<Duration, crate::units::UnitError> {
    crate::units::parse_duration(s)
}

fn parse_positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{s:?}: expected a positive number")),
    }
}

/// `--host-memory`: a size as the configuration writes one, more than 0 (the file refuses 0 too).
pub(super) fn parse_host_memory(s: &str) -> Result<u64, String> {
    match crate::units::parse_size(s) {
        Ok(0) => Err(format!("{s:?}: the budget must be more than 0 bytes")),
        Ok(b) => Ok(b),
        Err(e) => Err(e.to_string()),
    }
}

/// `hearth simulate` options.
#[derive(Args, Debug, Clone)]
#[command(
    about = "Replay traffic against hearth's policy and published autoscalers",
    after_help = "Scenarios: step, burst, diurnal, sawtooth, flash-crowd (synthetic, seeded), \
azure-conv, azure-code (the Azure LLM inference traces 2023, CC-BY 4.0: read from \
$HEARTH_TRACE_DIR, else ./data/traces, where a checkout keeps them; or give the CSV with --trace); \
held out of the grid: burst-3m, burst-7m, burst-25m (jittered ±20 %), burst-poisson, multi-day.\n--speed X divides arrival times by X; \
--rate-mult X multiplies the arrival rate (synthetic: the Poisson rate; traces: each arrival \
kept with probability X below 1, replayed ⌊X⌋ or ⌈X⌉ times above 1, copies shifted by up to 1 s).\n\
--grid runs the standard grid instead (every scenario and trace, cold start, slot count and \
target; see BENCHMARKS.md) and needs neither --config nor --model; --grid --sleep-cells runs the cells with a sleeping tier; --grid --family held-out runs \
the held-out family on the same knobs instead."
)]
pub struct SimArgs {
    /// Configuration file: the model's [model.scaling] is what hearth runs with
    #[arg(long, required_unless_present = "grid")]
    pub config: Option<PathBuf>,
    /// The model (from the configuration) to simulate
    #[arg(long, required_unless_present = "grid")]
    pub model: Option<String>,
    /// A built-in scenario
    #[arg(long, required_unless_present_any = ["trace", "grid"])]
    pub scenario: Option<String>,
    /// A CSV trace: Azure format (TIMESTAMP,ContextTokens,GeneratedTokens) or t_seconds[,service_s]
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Time compression of the arrivals
    #[arg(long, default_value = "1", value_parser = parse_positive)]
    pub speed: f64,
    /// Arrival-rate multiplier
    #[arg(long = "rate-mult", default_value = "1", value_parser = parse_positive)]
    pub rate_mult: f64,
    /// Comma-separated: hearth,hearth-nopool,hpa-util,hpa-queue,kpa,ray,cortex,oracle (default:
    /// all); also fixed (min replicas, never scaled)
    #[arg(long, value_delimiter = ',')]
    pub policy: Vec<String>,
    /// Spawn → warm (ready) time of a replica
    #[arg(long = "cold-start", default_value = "60s", value_parser = parse_dur)]
    pub cold_start: Duration,
    /// Requests a replica serves at once (slots; default: the model's `slots` where the file
    /// sets them, else 8)
    #[arg(long)]
    pub concurrency: Option<u32>,
    /// Service time per context token
    #[arg(long = "prefill-per-token", default_value = "0.2ms", value_parser = parse_dur)]
    pub prefill_per_token: Duration,
    /// Service time per generated token
    #[arg(long = "decode-per-token", default_value = "20ms", value_parser = parse_dur)]
    pub decode_per_token: Duration,
    /// A replica added to the routed set receives traffic after this delay
    #[arg(long = "promotion-delay", default_value = "500ms", value_parser = parse_dur)]
    pub promotion_delay: Duration,
    /// A sleeping replica's wake time (models with [model.sleep]: their sleep and wake requests
    /// are answered after these delays)
    #[arg(long = "wake-time", default_value = "1s", value_parser = parse_dur)]
    pub wake_time: Duration,
    /// The time a replica takes to fall asleep
    #[arg(long = "sleep-time", default_value = "5s", value_parser = parse_dur)]
    pub sleep_time: Duration,
    /// What sleeping replicas may hold in host RAM, all together (e.g. 64GiB): overrides the
    /// file's `[daemon] host_memory` for hearth, and keeps at most ⌊SIZE ÷ [model.sleep]
    /// host_memory⌋ of the oracle's replicas asleep at once. Without it the file's `[daemon]
    /// host_memory` bounds both where set; otherwise neither is bounded
    #[arg(long = "host-memory", value_parser = parse_host_memory, conflicts_with = "grid")]
    pub host_memory: Option<u64>,
    /// How arrivals reach replicas: `committed` (each to the least-loaded replica's own queue, as
    /// a plain load balancer does; every policy) or `front-door` (hearth's front door: one FIFO
    /// per model, a request leaves it for a free slot; hearth, hearth-nopool, fixed and the
    /// oracle only, since the baselines scale on per-replica queues a front door does not keep)
    /// (with --grid: only --sleep-cells, which run only hearth and the oracle)
    #[arg(long, default_value = "committed", value_parser = ["committed", "front-door"])]
    pub router: String,
    /// Initial transient left out of the figures
    #[arg(long, default_value = "5m", value_parser = parse_dur)]
    pub warmup: Duration,
    /// Replay only the first D of the workload
    #[arg(long, value_parser = parse_dur)]
    pub duration: Option<Duration>,
    /// Seed of the synthetic arrivals and of trace thinning/replication
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the figures as JSON
    #[arg(long)]
    pub json: bool,
    /// Print the setup and the table as Markdown (for BENCHMARKS.md)
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,
    /// Write an SVG of arrival rate, oldest wait and replicas over time
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Print hearth's scale decisions (time, from → to, reason) to stderr as they happen
    #[arg(long)]
    pub decisions: bool,
    /// Run the standard grid: workloads × cold start × slots × target, every policy and the
    /// oracle, one row per cell and a summary (with --json or --markdown as asked); with
    /// --policy, only those policies' figures (no verdicts)
    #[arg(long, conflicts_with_all = ["config", "model", "scenario", "trace", "plot", "decisions", "duration"])]
    pub grid: bool,
    /// With --grid: only this many cells, chosen to span every workload and every knob setting
    #[arg(long, requires = "grid")]
    pub grid_sample: Option<usize>,
    /// With --grid: the folder holding the Azure traces (default $HEARTH_TRACE_DIR, else
    /// ./data/traces where it exists; without any, the grid has only the synthetic workloads)
    #[arg(long, requires = "grid")]
    pub trace_dir: Option<PathBuf>,
    /// With --grid: `held-out` runs the held-out family instead of the standard workloads (the
    /// held-out scenarios and the grid's scenarios at seeds 6–10)
    #[arg(long, requires = "grid", value_parser = ["standard", "held-out"])]
    pub family: Option<String>,
    /// With --grid: the cells with a sleeping tier instead (cold start 60 s and 240 s, wake 1 s
    /// and 5 s): hearth without and with [model.sleep], and the oracle with it
    #[arg(long, requires = "grid", conflicts_with = "policy")]
    pub sleep_cells: bool,
    /// With --grid: threads to run cells on (default: one per core)
    #[arg(long, requires = "grid", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub jobs: Option<u32>,
}
