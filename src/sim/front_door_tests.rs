//! `--router front-door`: the simulator's model of hearth's front door (one FIFO per model, a
//! request leaves it for a free slot) against the committed router, and the oracle behind it.

use std::path::Path;
use std::time::Duration;

use super::cluster::{Cluster, Router, Starts};
use super::workload::{self, ServiceModel};
use super::*;
use crate::config::Config;

const SM: ServiceModel = ServiceModel {
    prefill: 0.0002,
    decode: 0.02,
};

/// Two routable one-slot replicas; three arrivals at 0 (services 10 s, 1 s, 1 s); the second
/// replica frees its slot at 1 s. Returns when the third request started.
fn third_start(router: Router) -> Option<Us> {
    let mut cl = Cluster::new(1, router);
    let mut starts: Starts = Vec::new();
    for r in 0..2 {
        let r = cl.spawn(format!("m-{r}"), 0);
        cl.set_routed(r);
        cl.set_routable(r, 0, &mut starts);
    }
    let qs: Vec<u32> = [10 * SEC, SEC, SEC]
        .iter()
        .map(|&service| cl.new_request(0, service))
        .collect();
    for &q in &qs {
        cl.arrive(q, 0, &mut starts);
    }
    // The second request, on the second replica, completes at 1 s.
    cl.complete(qs[1], SEC, &mut starts);
    if cl.reqs[qs[2] as usize].start.is_none() {
        // Committed behind the 10 s one: it starts when that one ends.
        cl.complete(qs[0], 10 * SEC, &mut starts);
    }
    cl.reqs[qs[2] as usize].start
}

#[test]
fn behind_the_front_door_a_request_takes_the_first_free_slot_not_a_replicas_queue() {
    // Committed to the least-loaded replica at arrival (a tie: the oldest), it waits behind the
    // long request there while the other replica frees its slot at 1 s.
    assert_eq!(third_start(Router::Committed), Some(10 * SEC));
    assert_eq!(third_start(Router::FrontDoor), Some(SEC));
}

#[test]
fn a_replica_made_routable_takes_the_oldest_waiting_work_up_to_its_slots() {
    let mut cl = Cluster::new(2, Router::FrontDoor);
    let mut starts: Starts = Vec::new();
    let qs: Vec<u32> = (0..3).map(|i| cl.new_request(i * SEC, 30 * SEC)).collect();
    for (i, &q) in qs.iter().enumerate() {
        cl.arrive(q, i as Us * SEC, &mut starts);
    }
    assert_eq!(
        cl.router_queue.len(),
        3,
        "nothing routable: all wait at the door"
    );
    let r = cl.spawn("m-0".into(), 0);
    cl.set_routed(r);
    cl.set_routable(r, 5 * SEC, &mut starts);
    let started: Vec<Option<Us>> = qs.iter().map(|&q| cl.reqs[q as usize].start).collect();
    assert_eq!(
        started,
        [Some(5 * SEC), Some(5 * SEC), None],
        "oldest first, two slots"
    );
    assert_eq!(cl.router_queue.len(), 1);
    assert!(
        cl.replicas[r as usize].waiting.is_empty(),
        "no queue per replica"
    );
}

fn config(sleep: bool) -> Config {
    let tier = if sleep {
        "[model.sleep]\nformat = \"vllm\"\nlevel = 1\nhost_memory = \"17GiB\"\n\
         gpu_memory_asleep = \"600MiB\"\n"
    } else {
        ""
    };
    let text = format!(
        "[[model]]\nname = \"m\"\n\
         command = [\"vllm\", \"serve\", \"/m\", \"--host\", \"127.0.0.1\", \"--port\", \"{{port}}\"]\n\
         gpus = 1\ngpu_memory = \"36GiB\"\n\
         [model.warmup]\nurl = \"http://127.0.0.1:{{port}}/v1/completions\"\n{tier}\
         [model.scaling]\nmin = 1\nmax = 16\ntarget_wait = \"2s\"\n"
    );
    Config::parse(&text, Path::new("front-door-test.toml")).expect("valid")
}

/// Behind the front door the oracle's replays miss exactly what its planner expected (its model
/// routes as the cluster's `FrontDoor` does), it kills nothing, and hearth — with and without a
/// sleeping tier, with and without its pool — does not beat it.
#[test]
fn behind_the_front_door_the_oracle_replays_its_plan_and_bounds_hearth() {
    for (name, seed, slots, sleep) in [
        ("burst", 4, 8, false),
        ("step", 2, 1, true),
        ("sawtooth", 1, 32, true),
    ] {
        let rate = slots as f64 / 8.0;
        let mut w = workload::synthetic_workload(name, seed, &SM, 1.0, rate).unwrap();
        w.truncate(2400 * SEC);
        let mut s = Setup::new(
            config(sleep),
            "m",
            slots,
            Duration::from_secs(60),
            Duration::from_millis(500),
            Duration::from_secs(300),
            &w,
        )
        .expect("setup");
        s.params.router = Router::FrontDoor;
        s.params.wake = SEC;
        s.params.fall_asleep = 5 * SEC;
        super::tests::assert_replay_is_plan(&w, &s.params, name);
        let policies = [Policy::Hearth, Policy::HearthNoPool, Policy::Oracle];
        let (report, _) = simulate(&s, &w, &policies);
        let oracle = report
            .policies
            .iter()
            .find(|p| p.policy == "oracle")
            .unwrap();
        assert_eq!(oracle.killed, 0, "{name}");
        for p in report.policies.iter().filter(|p| p.policy != "oracle") {
            assert_eq!(p.killed, 0, "{name}: {}", p.policy);
            super::tests::assert_oracle_bounds(p, oracle, &format!("{name}: {}", p.policy));
        }
    }
}
