//! The simulator against itself (determinism), against queueing theory (M/M/c waits match
//! Erlang C; the lower bound is the busy slot-time ÷ concurrency), and against the contract of
//! its drivers.

use std::path::Path;
use std::time::{Duration, Instant};

use super::baselines::{fixed::Fixed, BaselineDriver};
use super::engine::{self, Params};
use super::rng::Rng;
use super::workload::{self, Request, ServiceModel, Workload};
use super::*;
use crate::config::Config;

const SM: ServiceModel = ServiceModel {
    prefill: 0.0002,
    decode: 0.02,
};

fn config(min: u32, max: u32, pool: u32) -> Config {
    let text = format!(
        "[[model]]\nname = \"m\"\ncommand = [\"true\"]\ngpus = 0\n\
         [model.warmup]\nurl = \"http://127.0.0.1:{{port}}/v1/completions\"\n\
         [model.scaling]\nmin = {min}\nmax = {max}\nwarm_pool = {pool}\ntarget_wait = \"2s\"\n"
    );
    Config::parse(&text, Path::new("sim-test.toml")).expect("valid")
}

fn setup(cfg: Config, w: &Workload, warmup: Duration) -> Setup {
    Setup::new(
        cfg,
        "m",
        8,
        Duration::from_secs(60),
        Duration::from_millis(500),
        warmup,
        w,
    )
    .expect("setup")
}

#[test]
fn the_same_seed_gives_byte_identical_json_and_another_seed_does_not() {
    let mut a = workload::synthetic_workload("burst", 42, &SM, 1.0, 1.0).unwrap();
    a.truncate(1500 * SEC);
    let s = setup(config(1, 16, 2), &a, Duration::from_secs(300));
    let run = |w: &Workload| serde_json::to_string(&simulate(&s, w, &Policy::DEFAULT).0).unwrap();
    let first = run(&a);
    let mut b = workload::synthetic_workload("burst", 42, &SM, 1.0, 1.0).unwrap();
    b.truncate(1500 * SEC);
    assert_eq!(first, run(&b));
    let mut c = workload::synthetic_workload("burst", 43, &SM, 1.0, 1.0).unwrap();
    c.truncate(1500 * SEC);
    assert_ne!(first, run(&c));
    // The document has exactly the contract's fields, policies in the order asked.
    let v: serde_json::Value = serde_json::from_str(&first).unwrap();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    assert_eq!(
        keys.len(),
        4,
        "scenario, requests, lower_bound_replica_seconds, policies: {keys:?}"
    );
    let names: Vec<&str> = v["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["policy"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "hearth",
            "hearth-nopool",
            "hpa-util",
            "hpa-queue",
            "kpa",
            "ray",
            "cortex",
            "oracle"
        ]
    );
    assert_eq!(v["policies"][0].as_object().unwrap().len(), 11);
}

/// Erlang C: the probability that an arrival waits in an M/M/c queue with offered load a = λ/μ.
fn erlang_c(c: u32, a: f64) -> f64 {
    let mut term = 1.0; // a^k / k!
    let mut sum = 0.0;
    for k in 0..c {
        if k > 0 {
            term *= a / k as f64;
        }
        sum += term;
    }
    let last = term * a / c as f64 * c as f64 / (c as f64 - a); // a^c/c! × c/(c−a)
    last / (sum + last)
}

/// Poisson arrivals at `lambda`, exponential service with mean 1 s.
fn mmc_workload(lambda: f64, n: usize, seed: u64) -> Workload {
    let mut rng = Rng::new(seed);
    let mut t = 0.0;
    let requests: Vec<Request> = (0..n)
        .map(|_| {
            t += rng.exp(1.0 / lambda);
            Request {
                t: (t * SEC as f64) as Us,
                service: ((rng.exp(1.0) * SEC as f64) as Us).max(1),
            }
        })
        .collect();
    let horizon = requests.last().unwrap().t + 1;
    Workload {
        name: "mmc".into(),
        requests,
        horizon,
        description: String::new(),
        attribution: None,
    }
}

fn params(warmup: Us) -> Params {
    Params {
        concurrency: 8,
        cold_start: 60 * SEC,
        promotion: 0,
        warmup,
        target_wait: 2 * SEC,
        min: 1,
        max: 1,
        decisions: false,
        wake: 0,
        fall_asleep: 0,
        max_asleep: None,
        asleep: None,
        router: engine::Router::Committed,
    }
}

#[test]
fn mmc_waits_match_erlang_c_at_half_and_ninety_percent_load() {
    let c = 8u32;
    for (rho, n) in [(0.5, 400_000usize), (0.9, 400_000)] {
        let lambda = rho * c as f64;
        let w = mmc_workload(lambda, n, 11);
        let warmup = 200 * SEC;
        let mut d = BaselineDriver::new(Fixed, 0, 1);
        let out = engine::run(&mut d, &w, params(warmup));
        let waits: Vec<f64> = out
            .cl
            .reqs
            .iter()
            .filter(|q| q.arrival >= warmup)
            .map(|q| (q.start.expect("served") - q.arrival) as f64 / SEC as f64)
            .collect();
        let m = waits.len() as f64;
        let mean = waits.iter().sum::<f64>() / m;
        let p_wait = waits.iter().filter(|&&x| x > 0.0).count() as f64 / m;
        let pc = erlang_c(c, lambda);
        let expect_mean = pc / (c as f64 - lambda); // μ = 1
        eprintln!(
            "M/M/{c} at ρ={rho}: P(wait) {p_wait:.4} (Erlang C {pc:.4}), mean wait {mean:.4} s \
             (theory {expect_mean:.4} s)"
        );
        assert!(
            (p_wait / pc - 1.0).abs() < 0.10,
            "ρ={rho}: P(wait) {p_wait:.4} vs Erlang C {pc:.4}"
        );
        assert!(
            (mean / expect_mean - 1.0).abs() < 0.10,
            "ρ={rho}: mean wait {mean:.4} s vs {expect_mean:.4} s"
        );
    }
}

#[test]
fn the_lower_bound_is_busy_slot_time_over_concurrency() {
    let w = mmc_workload(6.0, 20_000, 5);
    let s = Setup {
        params: params(0),
        ..setup(config(1, 1, 0), &w, Duration::ZERO)
    };
    let run = run_policy(&s, &w, Policy::Fixed);
    let total_service: u64 = w.requests.iter().map(|r| r.service).sum();
    let busy = run.busy_slot_seconds;
    assert!((busy - total_service as f64 / SEC as f64).abs() < 1e-6);
    let (report, _) = simulate(&s, &w, &[Policy::Fixed]);
    let lb = report.lower_bound_replica_seconds;
    assert!((lb - busy / 8.0).abs() < 0.06, "{lb} vs {}", busy / 8.0);
    // One replica the whole time: efficiency = lower bound ÷ its lifetime.
    let p = &report.policies[0];
    assert_eq!((p.killed, p.cold_starts, p.scale_actions), (0, 0, 0));
    assert!((p.efficiency - lb / p.replica_seconds).abs() < 1e-3);
}

#[test]
fn hearth_runs_the_real_core_with_its_pool_and_without() {
    let mut w = workload::synthetic_workload("step", 3, &SM, 1.0, 0.25).unwrap();
    w.truncate(900 * SEC);
    let s = setup(config(2, 10, 2), &w, Duration::from_secs(300));
    let (report, runs) = simulate(&s, &w, &[Policy::Hearth, Policy::HearthNoPool]);
    let span = (runs[0].series.len() as f64).min(900.0) - 300.0;
    let (pool, nopool) = (&report.policies[0], &report.policies[1]);
    // Today's core keeps `min` routed (and hearth its pool warm) and never kills a request.
    assert_eq!(pool.killed, 0);
    assert_eq!(nopool.killed, 0);
    assert!(pool.replica_seconds >= 4.0 * span - 1.0, "{pool:?}");
    assert!(nopool.replica_seconds >= 2.0 * span - 1.0, "{nopool:?}");
    assert!(nopool.replica_seconds < pool.replica_seconds);
    // The initial fleet was routed at once: the pool (warm, unrouted) takes no traffic.
    let routable = runs[0].series[10].routable;
    assert_eq!(routable, 2);
    assert_eq!(runs[0].series[10].holding, 4);
}

#[test]
fn baselines_scale_up_under_a_step_and_start_from_min() {
    let mut w = workload::synthetic_workload("step", 3, &SM, 1.0, 1.0).unwrap();
    w.truncate(1800 * SEC);
    let s = setup(config(1, 16, 0), &w, Duration::from_secs(300));
    let policies = [
        Policy::HpaUtil,
        Policy::HpaQueue,
        Policy::Kpa,
        Policy::Ray,
        Policy::Cortex,
    ];
    let (report, runs) = simulate(&s, &w, &policies);
    for (p, run) in report.policies.iter().zip(&runs) {
        assert_eq!(run.series[0].routable, 1, "{}: starts from min", p.policy);
        let peak = run.series.iter().map(|x| x.holding).max().unwrap();
        assert!(peak >= 8, "{}: peak {peak}", p.policy);
        assert!(peak <= 16 + 16, "{}: never far past max", p.policy);
        assert!(p.cold_starts > 0 && p.scale_actions > 0, "{p:?}");
    }
}

/// One hour of the conversation trace (data/traces) with every policy: timed (printed), with a
/// generous bound so a debug build passes too.
#[test]
fn an_hour_of_the_conv_trace_with_all_policies_is_quick() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(workload::REPO_TRACE_DIR)
        .join("azure-llm-2023-conv.csv");
    let started = Instant::now();
    let w = workload::trace_workload(&path, "azure-conv", 1, &SM, 1.0, 1.0).unwrap();
    let s = setup(config(1, 16, 2), &w, Duration::from_secs(300));
    let (report, _) = simulate(&s, &w, &Policy::DEFAULT);
    let took = started.elapsed();
    eprintln!(
        "azure-conv, {} requests, 8 policies: {:.2} s",
        w.requests.len(),
        took.as_secs_f64()
    );
    assert_eq!(report.policies.len(), 8);
    let limit = if cfg!(debug_assertions) { 120.0 } else { 10.0 };
    assert!(took.as_secs_f64() < limit, "{took:?}");
}

/// Each of the oracle's plans, replayed through the engine, misses exactly the requests its
/// planner expected to.
pub(super) fn assert_replay_is_plan(w: &Workload, p: &Params, name: &str) {
    for hold in super::oracle::HOLDS {
        let mut d = super::oracle::OracleDriver::new(w, p, hold);
        let out = engine::run(&mut d, w, *p);
        let replayed = out
            .cl
            .reqs
            .iter()
            .filter(|q| q.start.is_none_or(|t| t - q.arrival > p.target_wait))
            .count() as u64;
        assert_eq!(
            replayed,
            d.planned_misses(),
            "{name}: replay = plan (hold {hold})"
        );
    }
}

/// The oracle's figures are its replay through the engine; the replay serves exactly as the
/// planner's model predicted (same router, slots and queues), kills nothing, and no online
/// policy does as well for less.
#[test]
fn the_oracle_replays_its_plan_exactly_and_no_online_policy_beats_it() {
    for (name, seed, slots, target) in [
        ("burst", 4, 8, 2.0),
        ("step", 2, 1, 0.5),
        ("flash-crowd", 5, 32, 2.0),
        ("sawtooth", 1, 8, 0.5),
    ] {
        let rate = slots as f64 / 8.0;
        let mut w = workload::synthetic_workload(name, seed, &SM, 1.0, rate).unwrap();
        w.truncate(2400 * SEC);
        let cfg = config(1, 16, 0);
        let mut s = setup(cfg, &w, Duration::from_secs(300));
        s.params.concurrency = slots;
        s.params.target_wait = (target * SEC as f64) as Us;
        assert_replay_is_plan(&w, &s.params, name);
        let (report, _) = simulate(&s, &w, &Policy::DEFAULT);
        let oracle = report
            .policies
            .iter()
            .find(|p| p.policy == "oracle")
            .unwrap();
        assert_eq!(oracle.killed, 0, "{name}");
        for p in report.policies.iter().filter(|p| p.policy != "oracle") {
            assert!(
                !(p.over_target <= oracle.over_target
                    && p.replica_seconds < oracle.replica_seconds),
                "{name}: {} ({:.2} %, {:.0}) beats the oracle ({:.2} %, {:.0})",
                p.policy,
                p.over_target * 100.0,
                p.replica_seconds,
                oracle.over_target * 100.0,
                oracle.replica_seconds
            );
        }
        eprintln!(
            "{name}: oracle {:.2} % at {:.0} replica-s",
            oracle.over_target * 100.0,
            oracle.replica_seconds,
        );
    }
}

/// `config(1, 16, 0)` with vLLM's sleep mode: a sleeping replica holds 600 MiB of 36 GiB.
fn sleep_config() -> Config {
    let text = "[[model]]\nname = \"m\"\n\
        command = [\"vllm\", \"serve\", \"/m\", \"--host\", \"127.0.0.1\", \"--port\", \"{port}\", \"--enable-sleep-mode\"]\n\
        env = { VLLM_SERVER_DEV_MODE = \"1\" }\ngpus = 1\ngpu_memory = \"36GiB\"\n\
        [model.warmup]\nurl = \"http://127.0.0.1:{port}/v1/completions\"\n\
        [model.sleep]\nformat = \"vllm\"\nlevel = 1\nhost_memory = \"17GiB\"\ngpu_memory_asleep = \"600MiB\"\n\
        [model.scaling]\nmin = 1\nmax = 16\nwarm_pool = 0\ntarget_wait = \"2s\"\n";
    Config::parse(text, Path::new("sim-sleep-test.toml")).expect("valid")
}

/// Where the model sleeps, the oracle keeps replicas asleep through the gaps between uses
/// (billed in full while falling asleep and waking, at 600 MiB ÷ 36 GiB between), woken one
/// wake time before they serve: as few misses as without it, fewer replica-seconds, its replay
/// still exactly its plan, and hearth with its sleeping tier does not beat it.
#[test]
fn the_oracle_sleeps_through_the_gaps_where_the_model_sleeps() {
    for (name, seed) in [("burst", 1), ("burst", 4), ("sawtooth", 2), ("diurnal", 3)] {
        let mut w = workload::synthetic_workload(name, seed, &SM, 1.0, 1.0).unwrap();
        w.truncate(3600 * SEC);
        let warmup = Duration::from_secs(300);
        let (mut awake, mut asleep) = (setup(config(1, 16, 0), &w, warmup), {
            let cfg = sleep_config();
            setup(cfg, &w, warmup)
        });
        for s in [&mut awake, &mut asleep] {
            s.params.wake = SEC;
            s.params.fall_asleep = 5 * SEC;
        }
        assert!(awake.params.asleep.is_none() && asleep.params.asleep.is_some());
        assert_replay_is_plan(&w, &asleep.params, name);
        let run = |s: &Setup, p: Policy| run_policy(s, &w, p).report;
        let (plain, sleeping) = (run(&awake, Policy::Oracle), run(&asleep, Policy::Oracle));
        assert!(
            sleeping.over_target <= plain.over_target,
            "{name}: {} % asleep, {} % awake",
            sleeping.over_target * 100.0,
            plain.over_target * 100.0
        );
        assert!(
            sleeping.sleeping_seconds > 0.0 && sleeping.replica_seconds < plain.replica_seconds,
            "{name}: {sleeping:?} against {plain:?}"
        );
        assert_eq!(sleeping.killed, 0, "{name}");
        let hearth = run(&asleep, Policy::Hearth);
        assert_oracle_bounds(&hearth, &sleeping, &format!("{name}, both asleep"));
        eprintln!(
            "{name} seed {seed}: oracle {:.0} replica-s awake, {:.0} with sleep ({:.0} s asleep); hearth with sleep {:.0}",
            plain.replica_seconds, sleeping.replica_seconds, sleeping.sleeping_seconds, hearth.replica_seconds
        );
    }
}

/// The oracle is not beaten: `hearth` does not miss as few for fewer replica-seconds.
pub(super) fn assert_oracle_bounds(
    hearth: &report::PolicyReport,
    oracle: &report::PolicyReport,
    what: &str,
) {
    assert!(
        !(hearth.over_target <= oracle.over_target
            && hearth.replica_seconds < oracle.replica_seconds),
        "{what}: hearth ({:.3} %, {:.0}) beats the oracle ({:.3} %, {:.0})",
        hearth.over_target * 100.0,
        hearth.replica_seconds,
        oracle.over_target * 100.0,
        oracle.replica_seconds
    );
}

/// `sleep_config` with a host-memory budget of `budget` bytes (None: none), as `--host-memory`
/// sets it; the wake and sleep times of the sleep-tier tests.
fn sleep_setup(w: &Workload, budget: Option<u64>) -> Setup {
    let mut cfg = sleep_config();
    cfg.daemon.host_memory = budget;
    let mut s = setup(cfg, w, Duration::from_secs(300));
    s.params.wake = SEC;
    s.params.fall_asleep = 5 * SEC;
    s
}

/// A budget of one sleeper's host memory: hearth's core and the oracle each keep at most one
/// replica asleep at any instant (the oracle's replay over the whole run, every plan), where
/// without it both keep more; the oracle still replays its plan exactly, kills nothing, and
/// hearth under the same budget does not beat it.
#[test]
fn a_host_memory_budget_bounds_how_many_sleep() {
    const GIB17: u64 = 17 << 30;
    for (name, seed) in [("burst", 1), ("burst", 4)] {
        let mut w = workload::synthetic_workload(name, seed, &SM, 1.0, 1.0).unwrap();
        w.truncate(3600 * SEC);
        let (free, bounded) = (
            sleep_setup(&w, None),
            sleep_setup(&w, Some(GIB17 + (1 << 30))),
        );
        assert_eq!(
            (free.params.max_asleep, bounded.params.max_asleep),
            (None, Some(1))
        );
        assert_replay_is_plan(&w, &bounded.params, name);
        for hold in super::oracle::HOLDS {
            let mut d = super::oracle::OracleDriver::new(&w, &bounded.params, hold);
            let out = engine::run(&mut d, &w, bounded.params);
            assert!(out.cl.peak_asleep(0, Us::MAX) <= 1, "{name}: hold {hold}");
        }
        let run = |s: &Setup, p: Policy| run_policy(s, &w, p).report;
        for p in [Policy::Hearth, Policy::Oracle] {
            let (f, b) = (run(&free, p), run(&bounded, p));
            assert!(
                b.peak_host_memory_gib <= 17.0 && b.sleeping_seconds > 0.0,
                "{name} {}: {b:?}",
                p.name()
            );
            assert!(
                f.peak_host_memory_gib > 17.0,
                "{name} {}: unbounded {f:?}",
                p.name()
            );
            eprintln!(
                "{name} seed {seed} {}: peak {} GiB → {} GiB, {:.0} → {:.0} replica-s",
                p.name(),
                f.peak_host_memory_gib,
                b.peak_host_memory_gib,
                f.replica_seconds,
                b.replica_seconds
            );
        }
        let (hearth, oracle) = (run(&bounded, Policy::Hearth), run(&bounded, Policy::Oracle));
        assert_eq!(oracle.killed, 0, "{name}");
        assert_oracle_bounds(&hearth, &oracle, &format!("{name}, under one sleeper"));
    }
}

/// A budget smaller than one sleeper's host memory: nobody sleeps, hearth nor the oracle.
#[test]
fn a_budget_below_one_sleeper_keeps_everyone_awake() {
    let mut w = workload::synthetic_workload("burst", 4, &SM, 1.0, 1.0).unwrap();
    w.truncate(3600 * SEC);
    let s = sleep_setup(&w, Some(1 << 30));
    assert_eq!(s.params.max_asleep, Some(0));
    assert_replay_is_plan(&w, &s.params, "burst");
    for p in [Policy::Hearth, Policy::Oracle] {
        let out = run_policy(&s, &w, p);
        let r = &out.report;
        assert_eq!(
            (r.sleeping_seconds, r.peak_host_memory_gib),
            (0.0, 0.0),
            "{}: {r:?}",
            p.name()
        );
        let json = serde_json::to_value(r).unwrap();
        assert!(json.get("peak_host_memory_gib").is_none(), "{json}");
    }
}

#[test]
fn max_asleep_is_the_whole_sleepers_the_budget_holds() {
    let a = |host_memory| {
        Some(engine::Asleep {
            charge: 0.1,
            host_memory,
        })
    };
    assert_eq!(max_asleep(Some(34 << 30), a(17 << 30)), Some(2));
    assert_eq!(max_asleep(Some((34 << 30) - 1), a(17 << 30)), Some(1));
    assert_eq!(max_asleep(Some(1 << 30), a(17 << 30)), Some(0));
    assert_eq!(max_asleep(None, a(17 << 30)), None);
    assert_eq!(max_asleep(Some(1 << 30), None), None);
    assert_eq!(max_asleep(Some(1 << 30), a(0)), None);
    assert!(parse_host_memory("0").is_err() && parse_host_memory("lots").is_err());
    assert_eq!(parse_host_memory("64GiB"), Ok(64 << 30));
}
