//! The checks beyond single values: a file must declare its models (even none), every replica is
//! told its port and probed there, minimums fit static GPUs. (That programs exist on this host is
//! the shell's to say: its config module's tests.)

use super::*;
use crate::config::validate::fit::{Demand, Devices, Fit};
use crate::config::*;

const GIB: u64 = 1 << 30;

// ---- a file must declare its models -----------------------------------------------------------

#[test]
fn a_file_without_models_is_refused_and_says_how_to_declare_none() {
    for text in [
        "",
        "# nothing yet\n",
        // cut short before its first [[model]]
        "[daemon]\nsocket = \"/run/hearth/hearth.sock\"\n[gpus]\nbackend = \"auto\"\n",
    ] {
        let err = parse(text).unwrap_err();
        assert_eq!(err.key, "model", "{err}");
        assert_eq!(err.line, None, "{err}");
        assert!(
            err.message.contains("model = []") && err.message.contains("[[model]]"),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            format!("{FILE}: model: {}", err.message),
            "FILE: KEY: MESSAGE when no line applies"
        );
    }
    // Said explicitly, no models is a valid file; the statement must come before any table.
    let c = parse("model = []\n[daemon]\ntick = \"1s\"\n").unwrap();
    assert!(c.models.is_empty());
    let m = fails("[daemon]\nmodel = []\n", "daemon.model", 2);
    assert!(m.contains("model"), "{m}");
    // `model = []` and a model are not both possible: TOML itself refuses the second definition.
    let err = parse(&format!("model = []\n{}", model("a"))).unwrap_err();
    assert_eq!(err.line, Some(2), "{err}");
}

// ---- every replica is told its port and probed on it ------------------------------------------

/// A model whose command is `command` (a TOML array body) and whose other keys are `extra`.
fn with_command(command: &str, extra: &str) -> String {
    format!(
        "[[model]]\nname = \"m\"\ncommand = [{command}]\n{extra}\
         [model.warmup]\nurl = \"http://127.0.0.1:{{port}}/v1/completions\"\n"
    )
}

#[test]
fn a_command_that_never_passes_the_port_on_is_refused() {
    let text = with_command(
        "\"llama-server\", \"-m\", \"/m.gguf\", \"--port\", \"8080\"",
        "",
    );
    assert!(parse(&text).is_ok(), "the values alone are fine");
    let m = fails_at(Checks::Deployment, &text, "model[0].command", 3);
    assert!(
        m.contains("{port}") && m.contains("Address already in use"),
        "says what to write and why: {m}"
    );
    // {port} in env is as good, and so is a shell line reading $HEARTH_PORT, or saying so in env.
    for (command, extra) in [
        ("\"srv\", \"--port={port}\"", ""),
        ("\"srv\"", "env = { PORT = \"{port}\" }\n"),
        ("\"srv\"", "env = { HEARTH_PORT = \"{port}\" }\n"),
        ("\"sh\", \"-c\", \"exec srv --port $HEARTH_PORT\"", ""),
    ] {
        let text = with_command(command, extra);
        parse_at(Checks::Deployment, &text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    }
    // A placeholder that merely looks like it is not the port.
    let text = with_command("\"srv\", \"--port\", \"{{port\"", "");
    fails_at(Checks::Deployment, &text, "model[0].command", 3);
}

#[test]
fn urls_that_do_not_use_the_port_are_refused() {
    let fixed = model("a").replace("127.0.0.1:{port}", "127.0.0.1:8000");
    assert!(parse(&fixed).is_ok(), "the values alone are fine");
    let m = fails_at(
        Checks::Deployment,
        &fixed,
        "model[0].warmup.url",
        line_of(&fixed, "warmup.url", 0),
    );
    assert!(
        m.contains("http://127.0.0.1:{port}/v1/completions"),
        "suggests the URL with the port: {m}"
    );
    // {port} in the path is not the server's port.
    let in_path = model("a").replace("127.0.0.1:{port}/v1", "127.0.0.1:8000/v1/{port}");
    fails_at(
        Checks::Deployment,
        &in_path,
        "model[0].warmup.url",
        line_of(&in_path, "warmup.url", 0),
    );
    let text = format!(
        "{}[model.liveness]\nurl = \"http://127.0.0.1:9000/health\"\n",
        model("a")
    );
    fails_at(
        Checks::Deployment,
        &text,
        "model[0].liveness.url",
        line_of(&text, "url = \"http://127.0.0.1:9000", 0),
    );
    let text = format!(
        "{}[model.signal]\nscrape = \"http://localhost/metrics\"\nformat = \"vllm\"\n",
        model("a")
    );
    fails_at(
        Checks::Deployment,
        &text,
        "model[0].signal.scrape",
        line_of(&text, "scrape", 0),
    );
    // The port inside a longer word (Triton's metrics on 1{port}) and IPv6 are fine.
    let text = format!(
        "{}[model.signal]\nscrape = \"http://[::1]:1{{port}}/metrics\"\nformat = \"triton\"\n",
        model("a")
    );
    parse_at(Checks::Deployment, &text).unwrap();
}

// ---- minimums fit the declared static GPUs ----------------------------------------------------

/// `[gpus]` of `backend` with devices of `gib` GiB each, then `models`.
fn gpus(backend: &str, gib: &[u64], models: &str) -> String {
    let mut s = format!("[gpus]\nbackend = \"{backend}\"\n");
    for (i, g) in gib.iter().enumerate() {
        s.push_str(&format!(
            "[[gpus.device]]\nuuid = \"GPU-{i}\"\nmemory = \"{g}GiB\"\n"
        ));
    }
    s + models
}

/// A model of `gpus` devices with `mem` each ("" for whole devices) and `min` replicas.
fn gpu_model(name: &str, gpus: u32, mem: &str, min: u32) -> String {
    let mem = if mem.is_empty() {
        String::new()
    } else {
        format!("gpu_memory = \"{mem}\"\n")
    };
    format!(
        "{}gpus = {gpus}\n{mem}[model.scaling]\nmin = {min}\nmax = {}\n",
        model(name),
        min.max(1)
    )
}

#[test]
fn a_sleeping_tier_counts_its_minimum_asleep_and_one_awake() {
    // Three models of 60 GiB with min 1 on one device of 100 GiB, and one with min 3: awake
    // they cannot all be there; asleep (1 GiB each) beside one awake, they can.
    let sleep = "[model.sleep]\nformat = \"vllm\"\ngpu_memory_asleep = \"1GiB\"\n";
    let models: String = ["a", "b", "c"]
        .iter()
        .map(|n| gpu_model(n, 1, "60GiB", if *n == "c" { 3 } else { 1 }))
        .collect();
    let awake = gpus("static", &[100], &models);
    fails_at(
        Checks::Deployment,
        &awake,
        "model[2].scaling.min",
        line_of(&awake, "min =", 2),
    );
    // vLLM's sleep endpoints: bound to loopback.
    let asleep = awake
        .replace("[model.scaling]\n", &format!("{sleep}[model.scaling]\n"))
        .replace(
            r#"["srv", "--port""#,
            r#"["srv", "--host", "127.0.0.1", "--port""#,
        );
    parse_at(Checks::Deployment, &asleep).unwrap();
}

/// A model of one device with `mem` awake and `asleep` asleep (vLLM's endpoints, on loopback),
/// `min` replicas, `priority`, and `sleep_extra` lines in its `[model.sleep]`.
fn sleepy(
    name: &str,
    mem: &str,
    asleep: &str,
    min: u32,
    priority: i32,
    sleep_extra: &str,
) -> String {
    gpu_model(name, 1, mem, min)
        .replace(
            "[model.scaling]\n",
            &format!(
                "priority = {priority}\n[model.sleep]\nformat = \"vllm\"\n\
                 gpu_memory_asleep = \"{asleep}\"\n{sleep_extra}[model.scaling]\n"
            ),
        )
        .replace(
            r#"["srv", "--port""#,
            r#"["srv", "--host", "127.0.0.1", "--port""#,
        )
}

#[test]
fn each_model_must_fit_awake_beside_what_the_others_keep() {
    // One device of 10 GiB, two models of 9 GiB awake: asleep (2 GiB each) they fit together,
    // and each fits alone, but neither can be awake beside the other asleep.
    let both = |asleep: &str| {
        gpus(
            "static",
            &[10],
            &(sleepy("a", "9GiB", asleep, 1, 0, "") + &sleepy("b", "9GiB", asleep, 1, 0, "")),
        )
    };
    let text = both("2GiB");
    let m = fails_at(
        Checks::Deployment,
        &text,
        "model[0].scaling.min",
        line_of(&text, "min =", 0),
    );
    assert!(
        m.contains("1 replica(s) of \"a\" awake") && m.contains("no_capacity"),
        "{m}"
    );
    parse_at(Checks::Deployment, &both("1GiB")).unwrap();

    // A model of higher priority keeps its routed replica awake: on 100 GiB, "hi" awake (60)
    // leaves no room for "lo" (60) to wake, though all asleep and each alone fit.
    let pair = |hi_extra: &str, hi_priority: i32| {
        gpus(
            "static",
            &[100],
            &(sleepy("hi", "60GiB", "1GiB", 1, hi_priority, hi_extra)
                + &sleepy("lo", "60GiB", "1GiB", 1, 0, "")),
        )
    };
    let text = pair("", 10);
    let m = fails_at(
        Checks::Deployment,
        &text,
        "model[1].scaling.min",
        line_of(&text, "min =", 1),
    );
    assert!(m.contains("\"hi\" (1 awake: priority 10 > 0)"), "{m}");
    // Equal priority: "hi" is put to sleep for "lo"; with idle_to_sleep it sleeps by itself.
    parse_at(Checks::Deployment, &pair("", 0)).unwrap();
    parse_at(Checks::Deployment, &pair("idle_to_sleep = \"5m\"\n", 10)).unwrap();

    // A model without [model.sleep] holds its minimum awake: "d" (70 GiB awake) cannot be
    // awake beside "c" (40 GiB), though "c" beside "d" asleep fits.
    let text = gpus(
        "static",
        &[100],
        &(gpu_model("c", 1, "40GiB", 1) + &sleepy("d", "70GiB", "1GiB", 1, 0, "")),
    );
    let m = fails_at(
        Checks::Deployment,
        &text,
        "model[1].scaling.min",
        line_of(&text, "min =", 1),
    );
    assert!(m.contains("\"c\" (1 awake: no [model.sleep])"), "{m}");
}

#[test]
fn a_minimum_that_cannot_fit_the_static_devices_alone_is_refused() {
    // Two devices of 80 GiB hold two 50 GiB replicas, not three.
    let text = gpus("static", &[80, 80], &gpu_model("m", 1, "50GiB", 3));
    assert!(parse(&text).is_ok(), "the values alone are fine");
    let m = fails_at(
        Checks::Deployment,
        &text,
        "model[0].scaling.min",
        line_of(&text, "min =", 0),
    );
    assert!(m.contains("at most 2") && m.contains("no_capacity"), "{m}");
    parse_at(
        Checks::Deployment,
        &gpus("static", &[80, 80], &gpu_model("m", 1, "50GiB", 2)),
    )
    .unwrap();

    // More devices per replica than declared.
    let text = gpus("static", &[80], &gpu_model("m", 2, "10GiB", 1));
    fails_at(
        Checks::Deployment,
        &text,
        "model[0].gpus",
        line_of(&text, "gpus = 2", 0),
    );
    // More memory than any device has.
    let text = gpus("static", &[80, 40], &gpu_model("m", 1, "96GiB", 1));
    let m = fails_at(
        Checks::Deployment,
        &text,
        "model[0].gpu_memory",
        line_of(&text, "gpu_memory", 0),
    );
    assert!(m.contains("96.0GiB"), "{m}");
    // Whole devices: three replicas of two devices each need six.
    let text = gpus("static", &[80; 5], &gpu_model("m", 2, "", 3));
    fails_at(
        Checks::Deployment,
        &text,
        "model[0].scaling.min",
        line_of(&text, "min =", 0),
    );
    parse_at(
        Checks::Deployment,
        &gpus("static", &[80; 6], &gpu_model("m", 2, "", 3)),
    )
    .unwrap();
    // The default min (1) and gpus (1) count too: the line is the model's.
    let text = gpus(
        "static",
        &[80],
        &format!("{}gpu_memory = \"81GiB\"\n", model("m")),
    );
    fails_at(
        Checks::Deployment,
        &text,
        "model[0].gpu_memory",
        line_of(&text, "gpu_memory", 0),
    );
}

#[test]
fn minimums_that_cannot_fit_together_are_refused_naming_the_model_that_overflows() {
    // One 80 GiB device: low's 40 GiB and high's two 40 GiB replicas cannot all be placed.
    let models = format!(
        "{}{}",
        gpu_model("low", 1, "40GiB", 1),
        gpu_model("high", 1, "40GiB", 2)
    );
    let text = gpus("static", &[80], &models);
    assert!(parse(&text).is_ok(), "the values alone are fine");
    let m = fails_at(
        Checks::Deployment,
        &text,
        "model[1].scaling.min",
        line_of(&text, "min =", 1),
    );
    assert!(m.contains("\"low\"") && m.contains("\"high\""), "{m}");
    // A CPU-only model or one with min = 0 asks nothing of the devices.
    let models = format!(
        "{}{}{}",
        gpu_model("low", 1, "40GiB", 1),
        gpu_model("cpu", 0, "", 2),
        gpu_model("idle", 1, "40GiB", 0).replace("min = 0\nmax = 1", "min = 0\nmax = 2")
    );
    parse_at(Checks::Deployment, &gpus("static", &[80], &models)).unwrap();
}

#[test]
fn a_fit_that_first_fit_would_miss_is_found() {
    // 2 × 10 GiB: 4+3+3 and 4+3+3. Placing largest first on the fullest device that fits
    // strands the last 3 GiB; a placement exists, so the file passes.
    let models = format!(
        "{}{}",
        gpu_model("four", 1, "4GiB", 2),
        gpu_model("three", 1, "3GiB", 4)
    );
    parse_at(Checks::Deployment, &gpus("static", &[10, 10], &models)).unwrap();
    // One more 3 GiB replica does not fit anywhere.
    let models = format!(
        "{}{}",
        gpu_model("four", 1, "4GiB", 2),
        gpu_model("three", 1, "3GiB", 5)
    );
    let text = gpus("static", &[10, 10], &models);
    fails_at(
        Checks::Deployment,
        &text,
        "model[1].scaling.min",
        line_of(&text, "min =", 1),
    );
    // Whole devices leave the small ones for shared models: 2 whole + 2 × 80 GiB on 4 devices,
    // and then no room for a third model.
    let models = format!(
        "{}{}",
        gpu_model("whole", 2, "", 1),
        gpu_model("big", 1, "80GiB", 2)
    );
    parse_at(Checks::Deployment, &gpus("static", &[80; 4], &models)).unwrap();
    let text = gpus(
        "static",
        &[80; 4],
        &format!("{models}{}", gpu_model("small", 1, "1GiB", 1)),
    );
    fails_at(
        Checks::Deployment,
        &text,
        "model[2].scaling.min",
        line_of(&text, "min =", 2),
    );
}

#[test]
fn devices_unknown_until_run_time_are_not_judged() {
    // auto and nvml see the real devices only when the daemon runs; it reports no_capacity then.
    for backend in ["auto", "nvml"] {
        let text = gpus(backend, &[80], &gpu_model("m", 1, "50GiB", 3));
        parse_at(Checks::Deployment, &text).unwrap_or_else(|e| panic!("{backend}: {e}"));
    }
}

/// Every way of placing the replicas, one by one, on distinct devices.
fn brute_force(free: &mut [u64], fresh: &[u64], items: &[Demand]) -> bool {
    let Some((d, rest)) = items.split_first() else {
        return true;
    };
    fn pick(
        free: &mut [u64],
        fresh: &[u64],
        d: &Demand,
        from: usize,
        need: u32,
        rest: &[Demand],
    ) -> bool {
        if need == 0 {
            return brute_force(free, fresh, rest);
        }
        for i in from..free.len() {
            let take = match d.bytes {
                Some(b) if free[i] >= b => b,
                None if free[i] == fresh[i] && free[i] > 0 => free[i],
                _ => continue,
            };
            free[i] -= take;
            let ok = pick(free, fresh, d, i + 1, need - 1, rest);
            free[i] += take;
            if ok {
                return true;
            }
        }
        false
    }
    pick(free, fresh, d, 0, d.gpus, rest)
}

#[test]
fn the_fit_answer_matches_a_brute_force_search_over_many_seeds() {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    let (mut fits, mut nos) = (0, 0);
    for _ in 0..3000 {
        let devices: Vec<u64> = (0..1 + next(4)).map(|_| 4 + next(9)).collect();
        let demands: Vec<Demand> = (0..1 + next(3))
            .map(|_| Demand {
                replicas: 1 + next(3) as u32,
                gpus: 1 + next(2) as u32,
                bytes: (next(4) != 0).then(|| 1 + next(8)),
            })
            .collect();
        let items: Vec<Demand> = demands
            .iter()
            .flat_map(|d| std::iter::repeat_n(*d, d.replicas as usize))
            .collect();
        let truth = brute_force(&mut devices.clone(), &devices, &items);
        let answer = Devices::new(&devices).together(&demands);
        assert_ne!(answer, Fit::Unknown, "{devices:?} {demands:?}");
        assert_eq!(answer == Fit::Fits, truth, "{devices:?} {demands:?}");
        for d in &demands {
            let alone: Vec<Demand> = std::iter::repeat_n(*d, d.replicas as usize).collect();
            let most = Devices::new(&devices).most_alone(d);
            assert_eq!(Devices::new(&devices).fits_alone(d), most == d.replicas);
            let k = |k: u32| {
                let items: Vec<Demand> = alone.iter().take(k as usize).copied().collect();
                brute_force(&mut devices.clone(), &devices, &items)
            };
            assert!(k(most), "{most} of {d:?} fit on {devices:?}");
            if most < d.replicas {
                assert!(
                    !k(most + 1),
                    "{} of {d:?} do not fit on {devices:?}",
                    most + 1
                );
            }
        }
        if truth {
            fits += 1;
        } else {
            nos += 1;
        }
    }
    assert!(
        fits > 300 && nos > 300,
        "both answers exercised: {fits} fit, {nos} do not"
    );
}

#[test]
fn a_search_too_large_for_its_budget_passes_the_file() {
    // 64 devices and 512 replicas of three sizes: past the budget the answer is "unknown", never
    // a refusal of a file that may work; counting still refuses what plainly cannot fit.
    let devices = vec![80 * GIB; 64];
    let maybe = [
        Demand {
            replicas: 170,
            gpus: 1,
            bytes: Some(7 * GIB),
        },
        Demand {
            replicas: 170,
            gpus: 2,
            bytes: Some(5 * GIB),
        },
        Demand {
            replicas: 172,
            gpus: 1,
            bytes: Some(3 * GIB),
        },
    ];
    assert_ne!(Devices::new(&devices).together(&maybe), Fit::No);
    let plainly = [Demand {
        replicas: 500,
        gpus: 2,
        bytes: Some(40 * GIB),
    }];
    assert_eq!(Devices::new(&devices).together(&plainly), Fit::No);
}

#[test]
fn large_files_are_judged_by_counting_and_blame_the_first_model_that_overflows() {
    // 600 one-replica models on 512 devices that hold one each: far past the search's size, the
    // count still proves it, and the 513th model is the one named.
    let mut text = format!(
        "[daemon]\nports = \"20000-20599\"\n{}",
        gpus("static", &[80; 512], "")
    );
    for i in 0..600 {
        text.push_str(&gpu_model(&format!("m{i}"), 1, "80GiB", 1));
    }
    let m = fails_at(
        Checks::Deployment,
        &text,
        "model[512].scaling.min",
        line_of(&text, "min =", 512),
    );
    assert!(m.contains("\"m0\"") && m.contains("and 507 more"), "{m}");
    // More devices than any host has are not judged at all.
    let text = format!(
        "[daemon]\nports = \"20000-23999\"\n{}",
        gpus("static", &[80; 1025], &gpu_model("m", 1, "50GiB", 3000))
    );
    parse_at(Checks::Deployment, &text).unwrap();
}
