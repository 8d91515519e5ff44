//! Values: defaults, types, ranges and the errors that name file, line and key.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::*;
use crate::config::*;

#[test]
fn design_example_parses_with_documented_values() {
    let c = parse(EXAMPLE).expect("example parses");
    assert_eq!(c.path, Path::new("/etc/hearth/hearth.toml"));
    let d = &c.daemon;
    assert_eq!(d.socket, Path::new("/run/hearth/hearth.sock"));
    assert_eq!(d.state_dir, Path::new("/var/lib/hearth"));
    assert_eq!(
        d.ports,
        PortRange {
            first: 20000,
            last: 20999
        }
    );
    assert_eq!(d.tick, Duration::from_millis(250));
    assert_eq!(d.metrics, Some("127.0.0.1:9464".parse().unwrap()));
    assert_eq!(d.shutdown_timeout, Duration::from_secs(60));
    assert_eq!(d.log_level, "info");

    assert_eq!(
        c.access.admins,
        vec![
            Principal::User("root".into()),
            Principal::Group("hearth-admin".into())
        ]
    );
    assert_eq!(
        c.access.reporters,
        vec![Principal::Group("hearth-report".into())]
    );
    assert_eq!(c.access.readers, vec![Principal::Group("hearth".into())]);

    assert_eq!(c.gpus.backend, GpuBackend::Auto);
    assert_eq!(
        c.gpus.devices,
        vec![StaticDevice {
            uuid: "GPU-static-0".into(),
            name: "static device".into(),
            memory: 80 << 30,
        }]
    );

    assert_eq!(c.models.len(), 1);
    let m = c.model("llama-8b").expect("model by name");
    assert_eq!(m.launch.version, "1");
    assert_eq!(
        m.launch.command,
        vec!["vllm", "serve", "/models/llama-8b", "--port", "{port}"]
    );
    assert_eq!(
        m.launch.env.get("HF_HOME").map(String::as_str),
        Some("/models/cache")
    );
    assert_eq!(m.launch.user.as_deref(), Some("hearth-model"));
    assert_eq!(m.launch.gpus, 1);
    assert_eq!(m.launch.gpu_memory, Some(40 << 30));
    assert_eq!(m.launch.placement, Placement::Pack);
    assert_eq!(m.priority, 0);
    assert_eq!(m.stop_grace, Duration::from_secs(30));
    assert!(m.launch.prefetch.is_empty());

    let w = &m.launch.warmup;
    assert_eq!(w.method, "POST");
    assert_eq!(w.url, "http://127.0.0.1:{port}/v1/completions");
    assert_eq!(
        w.body.as_deref(),
        Some(r#"{"model":"llama-8b","prompt":"Hello","max_tokens":4}"#)
    );
    assert_eq!(
        w.headers.get("content-type").map(String::as_str),
        Some("application/json")
    );
    assert_eq!(w.expect_status, 200);
    assert_eq!(w.expect_body.as_deref(), Some("choices"));
    assert_eq!(w.timeout, Duration::from_secs(30));
    assert_eq!(w.startup_timeout, Duration::from_secs(600));
    assert_eq!(w.recheck, Duration::from_secs(300));

    let l = m.liveness.as_ref().expect("liveness");
    assert_eq!(l.url, "http://127.0.0.1:{port}/health");
    assert_eq!(l.interval, Duration::from_secs(10));
    assert_eq!(l.timeout, Duration::from_secs(5));
    assert_eq!(l.failures, 3);

    let s = m.signal.as_ref().expect("signal");
    assert_eq!(s.scrape, "http://127.0.0.1:{port}/metrics");
    assert_eq!(s.format, ScrapeFormat::Llamacpp);
    assert_eq!(s.interval, Duration::from_secs(1));

    let sc = &m.scaling;
    assert_eq!(sc.min, 1);
    assert_eq!(sc.max, 8);
    assert_eq!(sc.warm_pool, WarmPool::Fixed(1));
    assert_eq!(sc.target_wait, Duration::from_millis(500));
    assert_eq!(sc.down_below, 0.5);
    assert_eq!(
        sc.down_stabilization,
        DownLimit::AtLeast(Duration::from_secs(300))
    );
    assert_eq!(sc.down_step, DownLimit::AtLeast(Duration::from_secs(120)));
    assert_eq!(sc.max_up_step, 4);
    assert_eq!(sc.idle_to_zero, Duration::from_secs(1800));
    assert_eq!(sc.drain_timeout, Duration::from_secs(300));
    assert_eq!(sc.stale_after, Duration::from_secs(5));
}

#[test]
fn a_file_of_no_models_gives_all_defaults() {
    let c = parse("model = []\n").expect("a file of no models is valid");
    assert_eq!(c.daemon.socket, Path::new("/run/hearth/hearth.sock"));
    assert_eq!(c.daemon.state_dir, Path::new("/var/lib/hearth"));
    assert_eq!(
        c.daemon.ports,
        PortRange {
            first: 20000,
            last: 20999
        }
    );
    assert_eq!(c.daemon.tick, Duration::from_millis(250));
    assert_eq!(c.daemon.metrics, None);
    assert_eq!(c.daemon.shutdown_timeout, Duration::from_secs(60));
    assert_eq!(c.daemon.log_level, "info");
    assert_eq!(
        c.access,
        AccessConfig {
            admins: vec![
                Principal::User("root".into()),
                Principal::Group("hearth-admin".into())
            ],
            reporters: vec![Principal::Group("hearth-report".into())],
            readers: vec![Principal::Group("hearth".into())],
        }
    );
    assert_eq!(c.gpus.backend, GpuBackend::Auto);
    assert!(c.gpus.devices.is_empty());
    assert!(c.models.is_empty());
}

#[test]
fn minimal_model_gets_defaults() {
    let c = parse(&model("m")).unwrap();
    let m = &c.models[0];
    assert_eq!(m.launch.version, "1");
    assert!(m.launch.env.is_empty());
    assert_eq!(m.launch.user, None);
    assert_eq!(m.launch.gpus, 1);
    assert_eq!(m.launch.gpu_memory, None);
    assert_eq!(m.launch.placement, Placement::Pack);
    assert_eq!(m.priority, 0);
    assert_eq!(m.stop_grace, Duration::from_secs(30));
    assert!(m.launch.prefetch.is_empty());
    assert_eq!(
        m.launch.warmup,
        WarmupConfig {
            method: "POST".into(),
            url: "http://127.0.0.1:{port}/v1/completions".into(),
            body: None,
            headers: BTreeMap::new(),
            expect_status: 200,
            expect_body: None,
            timeout: Duration::from_secs(30),
            startup_timeout: Duration::from_secs(600),
            recheck: Duration::from_secs(300),
        }
    );
    assert_eq!(m.liveness, None);
    assert_eq!(m.signal, None);
    assert_eq!(
        m.scaling,
        ScalingConfig {
            min: 1,
            max: 8,
            warm_pool: WarmPool::Fixed(0),
            target_wait: Duration::from_millis(500),
            down_below: 0.5,
            down_stabilization: DownLimit::Auto,
            down_step: DownLimit::Auto,
            max_up_step: 4,
            forecast: false,
            idle_to_zero: Duration::from_secs(1800),
            drain_timeout: Duration::from_secs(300),
            stale_after: Duration::from_secs(5),
        }
    );
}

#[test]
fn optional_sections_get_defaults_and_variants_parse() {
    let text = format!(
        "[daemon]\nlog_level = \"hearth=debug\"\n[gpus]\nbackend = \"static\"\n\
         [[gpus.device]]\nuuid = \"GPU-a\"\nname = \"H100\"\nmemory = \"80GB\"\n{}\
         placement = \"spread\"\ngpus = 0\npriority = -3\nprefetch = [\"/models/x/*.safetensors\"]\n\
         [model.liveness]\nurl = \"http://127.0.0.1:{{port}}/health\"\n\
         [model.signal]\nscrape = \"http://127.0.0.1:{{port}}/metrics\"\nformat = \"vllm\"\n\
         [model.scaling]\nmin = 0\nmax = 1\nwarm_pool = \"auto\"\ndown_below = 0.25\n",
        model("m")
    );
    let c = parse(&text).unwrap();
    assert_eq!(c.daemon.log_level, "hearth=debug");
    assert_eq!(c.gpus.backend, GpuBackend::Static);
    assert_eq!(c.gpus.devices[0].name, "H100");
    assert_eq!(c.gpus.devices[0].memory, 80_000_000_000);
    let m = &c.models[0];
    assert_eq!(m.launch.placement, Placement::Spread);
    assert_eq!(m.launch.gpus, 0);
    assert_eq!(m.priority, -3);
    assert_eq!(m.launch.prefetch, vec!["/models/x/*.safetensors"]);
    let l = m.liveness.as_ref().unwrap();
    assert_eq!(
        (l.interval, l.timeout, l.failures),
        (Duration::from_secs(10), Duration::from_secs(5), 3)
    );
    let s = m.signal.as_ref().unwrap();
    assert_eq!(s.format, ScrapeFormat::Vllm);
    assert_eq!(s.interval, Duration::from_secs(1));
    assert_eq!(m.scaling.min, 0);
    assert_eq!(m.scaling.max, 1);
    assert_eq!(m.scaling.warm_pool, WarmPool::Auto);
    assert_eq!(m.scaling.down_below, 0.25);
}

#[test]
fn display_is_file_line_key_message() {
    let err = parse("[daemon]\ntick = \"0s\"\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "/etc/hearth/hearth.toml:2: daemon.tick: must be greater than 0"
    );
}

#[test]
fn syntax_error_has_line() {
    let err = parse("[daemon]\n\ntick = \n").unwrap_err();
    assert_eq!(err.line, Some(3));
    assert!(err.message.contains("syntax"), "{}", err.message);
}

#[test]
fn unknown_keys_are_errors_with_path_and_line() {
    let m = fails(
        "[daemon]\ntick = \"1s\"\nsockets = \"/x\"\n",
        "daemon.sockets",
        3,
    );
    assert!(m.contains("unknown"), "{m}");
    fails("[deamon]\n", "deamon", 1);

    let text = format!("{}{}bogus = 1\n", model("a"), model("b"));
    fails(&text, "model[1].bogus", line_of(&text, "bogus", 0));

    let text = format!(
        "{}{}[model.scaling]\nmin = 1\nmaxx = 2\n",
        model("a"),
        model("b")
    );
    fails(&text, "model[1].scaling.maxx", line_of(&text, "maxx", 0));

    let text = format!("{}[model.foo]\nx = 1\n", model("a"));
    fails(&text, "model[0].foo", line_of(&text, "[model.foo]", 0));

    let text = format!("{}[model.warmup.extra]\n", model("a"));
    fails(
        &text,
        "model[0].warmup.extra",
        line_of(&text, "[model.warmup.extra]", 0),
    );

    let text = "[gpus]\n[[gpus.device]]\nuuid = \"a\"\nmemory = \"1GiB\"\nmem = 3\n";
    fails(text, "gpus.device[0].mem", 5);
}

#[test]
fn wrong_types_and_missing_keys() {
    let m = fails("[daemon]\n\ntick = 250\n", "daemon.tick", 3);
    assert!(m.contains("invalid type"), "{m}");

    let text = model("a").replace("name = \"a\"", "name = 3");
    fails(&text, "model[0].name", 2);

    let text = format!("{}gpus = -1\n", model("a"));
    fails(&text, "model[0].gpus", line_of(&text, "gpus", 0));

    let text = format!("{}placement = \"random\"\n", model("a"));
    let m = fails(&text, "model[0].placement", line_of(&text, "placement", 0));
    assert!(m.contains("spread"), "{m}");

    let m = fails("daemon = 3\n", "daemon", 1);
    assert_eq!(m, "invalid type: integer `3`, expected a table");
    let m = fails("daemon = []\n", "daemon", 1);
    assert!(!m.contains("Raw"), "{m}");
    let m = fails(
        "[[model]]\nname = 'a'\ncommand = ['x']\nwarmup = 'x'\n",
        "model[0].warmup",
        4,
    );
    assert!(!m.contains("Raw"), "{m}");
    let m = fails("[gpus]\nbackend = 3\n", "gpus.backend", 2);
    assert!(m.contains("string"), "{m}");
    let m = fails("[gpus]\nbackend = \"cuda\"\n", "gpus.backend", 2);
    assert!(m.contains("nvml"), "{m}");

    // [model.warmup] and its url are required
    let text = "[[model]]\nname = \"a\"\ncommand = [\"x\"]\n";
    let m = fails(text, "model[0].warmup", 1);
    assert!(m.contains("missing"), "{m}");
    let text = "[[model]]\nname = \"a\"\ncommand = [\"x\"]\n[model.warmup]\nmethod = \"GET\"\n";
    fails(text, "model[0].warmup.url", 4);
    let text = "[[model]]\nname = \"a\"\n[model.warmup]\nurl = \"http://x\"\n";
    fails(text, "model[0].command", 1);

    let text = format!(
        "{}[model.signal]\nscrape = \"http://x/{{port}}\"\n",
        model("a")
    );
    fails(
        &text,
        "model[0].signal.format",
        line_of(&text, "[model.signal]", 0),
    );
    let text = format!(
        "{}[model.signal]\nscrape = \"http://x\"\nformat = \"prom\"\n",
        model("a")
    );
    fails(&text, "model[0].signal.format", line_of(&text, "format", 0));

    let text = format!("{}[model.liveness]\ninterval = \"1s\"\n", model("a"));
    fails(
        &text,
        "model[0].liveness.url",
        line_of(&text, "[model.liveness]", 0),
    );

    let text = format!("{}[model.scaling]\nwarm_pool = \"many\"\n", model("a"));
    fails(
        &text,
        "model[0].scaling.warm_pool",
        line_of(&text, "warm_pool", 0),
    );
    let text = format!("{}[model.scaling]\nwarm_pool = -1\n", model("a"));
    fails(
        &text,
        "model[0].scaling.warm_pool",
        line_of(&text, "warm_pool", 0),
    );
    let text = format!("{}[model.scaling]\ndown_below = \"half\"\n", model("a"));
    fails(
        &text,
        "model[0].scaling.down_below",
        line_of(&text, "down_below", 0),
    );
}

#[test]
fn bad_durations_and_sizes_name_the_key() {
    let text = format!("{}stop_grace = \"30 seconds\"\n", model("a"));
    let m = fails(
        &text,
        "model[0].stop_grace",
        line_of(&text, "stop_grace", 0),
    );
    assert!(m.contains("30 seconds") && m.contains("250ms"), "{m}");

    let text = format!("{}gpu_memory = \"40G\"\n", model("a"));
    let m = fails(
        &text,
        "model[0].gpu_memory",
        line_of(&text, "gpu_memory", 0),
    );
    assert!(m.contains("40G") && m.contains("GiB"), "{m}");

    let text = format!("{}[model.scaling]\ntarget_wait = \"-1s\"\n", model("a"));
    fails(
        &text,
        "model[0].scaling.target_wait",
        line_of(&text, "target_wait", 0),
    );

    let text = "[gpus]\n[[gpus.device]]\nuuid = \"a\"\nmemory = \"lots\"\n";
    fails(text, "gpus.device[0].memory", 4);

    // The way down's limits: "auto" or a duration; anything else names the key and its line.
    for key in ["down_stabilization", "down_step"] {
        for bad in ["\"soon\"", "\"Auto\"", "\"-5s\"", "5"] {
            let text = format!("{}[model.scaling]\n{key} = {bad}\n", model("a"));
            let m = fails(
                &text,
                &format!("model[0].scaling.{key}"),
                line_of(&text, key, 0),
            );
            assert!(bad == "5" || m.contains("auto"), "{m}");
        }
    }
}

#[test]
fn the_way_down_is_the_policys_unless_limited() {
    let text = format!(
        "{}[model.scaling]\ndown_stabilization = \"auto\"\ndown_step = \"45s\"\n",
        model("a")
    );
    let c = parse(&text).expect("valid");
    let sc = &c.models[0].scaling;
    assert_eq!(sc.down_stabilization, DownLimit::Auto);
    assert_eq!(sc.down_step, DownLimit::AtLeast(Duration::from_secs(45)));
    assert_eq!(sc.down_step.floor(), Duration::from_secs(45));
    assert_eq!(sc.down_stabilization.floor(), Duration::ZERO);
    assert_eq!(sc.down_step.to_string(), "45s");
    assert_eq!(sc.down_stabilization.to_string(), "auto");
}

#[test]
fn model_names() {
    let text = model("");
    let m = fails(&text, "model[0].name", 2);
    assert!(m.contains("empty"), "{m}");
    let text = format!("{}{}", model("ok"), model("has space"));
    let m = fails(&text, "model[1].name", line_of(&text, "name", 1));
    assert!(m.contains("' '"), "{m}");
    fails(&model("a/b"), "model[0].name", 2);
    assert!(parse(&model("Llama-3.1_8b")).is_ok());

    let text = format!("{}{}{}", model("a"), model("b"), model("a"));
    let m = fails(&text, "model[2].name", line_of(&text, "name", 2));
    assert!(m.contains("duplicate"), "{m}");
}

#[test]
fn commands() {
    let text = "[[model]]\nname = \"a\"\ncommand = []\n[model.warmup]\nurl = \"http://x\"\n";
    fails(text, "model[0].command", 3);
    let text = "[[model]]\nname = \"a\"\ncommand = [\"\"]\n[model.warmup]\nurl = \"http://x\"\n";
    fails(text, "model[0].command[0]", 3);
}

#[test]
fn scaling_rules() {
    let sc = |body: &str| format!("{}[model.scaling]\n{body}\n", model("a"));

    let text = sc("min = 3\nmax = 2");
    let m = fails(&text, "model[0].scaling.min", line_of(&text, "min", 0));
    assert!(m.contains('3') && m.contains('2'), "{m}");
    // min above the default max
    let text = sc("min = 9");
    fails(&text, "model[0].scaling.min", line_of(&text, "min", 0));
    let text = sc("min = 0\nmax = 0");
    fails(&text, "model[0].scaling.max", line_of(&text, "max", 0));
    assert!(parse(&sc("min = 0\nmax = 1")).is_ok());
    assert!(parse(&sc("min = 2\nmax = 2")).is_ok());

    for bad in ["0.0", "1.0", "1", "0", "-0.5", "1.5"] {
        let text = sc(&format!("down_below = {bad}"));
        fails(
            &text,
            "model[0].scaling.down_below",
            line_of(&text, "down_below", 0),
        );
    }
    assert!(parse(&sc("down_below = 0.9")).is_ok());

    let text = sc("max_up_step = 0");
    fails(
        &text,
        "model[0].scaling.max_up_step",
        line_of(&text, "max_up_step", 0),
    );
    assert!(parse(&sc("warm_pool = 3")).is_ok());
}

#[test]
fn liveness_warmup_and_zero_timeouts() {
    let text = format!(
        "{}[model.liveness]\nurl = \"http://x/{{port}}\"\nfailures = 0\n",
        model("a")
    );
    fails(
        &text,
        "model[0].liveness.failures",
        line_of(&text, "failures", 0),
    );

    for (section, k) in [
        ("warmup", "timeout"),
        ("warmup", "startup_timeout"),
        ("liveness", "timeout"),
    ] {
        let text = if section == "warmup" {
            format!("{}{k} = \"0s\"\n", model_w("a"))
        } else {
            format!(
                "{}[model.liveness]\nurl = \"http://x\"\n{k} = \"0ms\"\n",
                model("a")
            )
        };
        let m = fails(
            &text,
            &format!("model[0].{section}.{k}"),
            line_of(&text, &format!("{k} ="), 0),
        );
        assert!(m.contains("greater than 0"), "{m}");
    }

    for status in ["99", "600", "0", "-200"] {
        let text = format!("{}expect_status = {status}\n", model_w("a"));
        fails(
            &text,
            "model[0].warmup.expect_status",
            line_of(&text, "expect_status", 0),
        );
    }
    let text = format!("{}expect_status = 204\n", model_w("a"));
    assert_eq!(
        parse(&text).unwrap().models[0].launch.warmup.expect_status,
        204
    );
}

#[test]
fn daemon_rules() {
    fails("[daemon]\ntick = \"0ms\"\n", "daemon.tick", 2);
    for bad in ["20000", "a-b", "20999-20000", "0-10", "1-70000", "-5", ""] {
        let text = format!("[daemon]\n# c\nports = \"{bad}\"\n");
        let m = fails(&text, "daemon.ports", 3);
        assert!(m.contains("20000-20999"), "{m}");
    }
    let c = parse("model = []\n[daemon]\nports = \"1-1\"\n").unwrap();
    assert_eq!(c.daemon.ports, PortRange { first: 1, last: 1 });

    let m = fails("[daemon]\nmetrics = \"localhost\"\n", "daemon.metrics", 2);
    assert!(m.contains("localhost"), "{m}");
    let c = parse("model = []\n[daemon]\nmetrics = \"[::1]:9000\"\n").unwrap();
    assert_eq!(c.daemon.metrics, Some("[::1]:9000".parse().unwrap()));
}

#[test]
fn port_range_must_cover_all_replicas() {
    // two models, max 8 each = 16 ports needed, 10 available
    let text = format!(
        "[daemon]\nports = \"20000-20009\"\n{}{}",
        model("a"),
        model("b")
    );
    let m = fails(&text, "daemon.ports", 2);
    assert!(m.contains("16"), "{m}");
    // exactly enough
    let text = format!(
        "[daemon]\nports = \"20000-20015\"\n{}{}",
        model("a"),
        model("b")
    );
    assert!(parse(&text).is_ok());
    // default range, ports key absent: the key is still daemon.ports; no line to point at
    let text = format!("{}[model.scaling]\nmax = 1001\n", model("a"));
    let err = parse(&text).unwrap_err();
    assert_eq!(err.key, "daemon.ports");
    assert_eq!(err.line, None);
    assert!(err.message.contains("1001"), "{}", err.message);
}

#[test]
fn gpu_rules() {
    let text =
        "[gpus]\nbackend = \"static\"\n[[gpus.device]]\nuuid = \"GPU-0\"\nmemory = \"1GiB\"\n\
                [[gpus.device]]\nuuid = \"GPU-1\"\nmemory = \"1GiB\"\n\
                [[gpus.device]]\nuuid = \"GPU-0\"\nmemory = \"1GiB\"\n";
    let m = fails(text, "gpus.device[2].uuid", 10);
    assert!(m.contains("GPU-0"), "{m}");
    let m = fails("[gpus]\n\nbackend = \"static\"\n", "gpus.backend", 3);
    assert!(m.contains("device"), "{m}");
    // a model asking more memory than any declared device is fine
    let text = format!(
        "[gpus]\n[[gpus.device]]\nuuid = \"GPU-0\"\nmemory = \"1GiB\"\n{}gpu_memory = \"80GiB\"\n",
        model("a")
    );
    assert!(parse(&text).is_ok());
}

#[test]
fn user_names() {
    let text = format!("{}user = \"\"\n", model("a"));
    fails(&text, "model[0].user", line_of(&text, "user", 0));
    fails(
        "[access]\nadmins = [\"root\",\n  \"\"]\n",
        "access.admins[1]",
        3,
    );
    fails("[access]\nreaders = [\"@\"]\n", "access.readers[0]", 2);
}

#[test]
fn unknown_placeholders_name_key_and_placeholder() {
    let text = model("a").replace("\"{port}\"]", "\"{port}\", \"{prot}\"]");
    let m = fails(&text, "model[0].command[3]", line_of(&text, "command", 0));
    assert!(m.contains("{prot}"), "{m}");

    let text = format!("{}env = {{ A = \"ok\", B = \"{{nope}}\" }}\n", model("a"));
    let m = fails(&text, "model[0].env.B", line_of(&text, "env", 0));
    assert!(m.contains("{nope}"), "{m}");

    let text = model("a").replace("{port}/v1", "{host}/v1");
    fails(
        &text,
        "model[0].warmup.url",
        line_of(&text, "warmup.url", 0),
    );

    let text = format!("{}body = '{{\"model\":\"{{name}}\"}}'\n", model_w("a"));
    let m = fails(&text, "model[0].warmup.body", line_of(&text, "body", 0));
    assert!(m.contains("{name}"), "{m}");

    let text = format!(
        "{}[model.warmup.headers]\nx-id = \"{{replica_id}}\"\n",
        model("a")
    );
    fails(
        &text,
        "model[0].warmup.headers.x-id",
        line_of(&text, "x-id", 0),
    );

    let text = format!(
        "{}[model.liveness]\nurl = \"http://h:{{Port}}/\"\n",
        model("a")
    );
    fails(&text, "model[0].liveness.url", line_of(&text, "url", 0));

    let text = format!(
        "{}[model.signal]\nscrape = \"http://h:{{port}}/{{x}}\"\nformat = \"tgi\"\n",
        model("a")
    );
    fails(&text, "model[0].signal.scrape", line_of(&text, "scrape", 0));

    // JSON braces and known placeholders are fine
    let text = format!(
        "{}body = '{{\"model\":\"{{model}}\",\"n\":{{ \"a\": 1 }},\"r\":\"{{replica}}\",\"g\":\"{{gpus}}\"}}'\n",
        model_w("a")
    );
    assert!(parse(&text).is_ok(), "{:?}", parse(&text).err());
}

#[test]
fn urls_must_be_http() {
    let text = model("a").replace("http://127.0.0.1", "https://127.0.0.1");
    let m = fails(
        &text,
        "model[0].warmup.url",
        line_of(&text, "warmup.url", 0),
    );
    assert!(m.contains("http://"), "{m}");
    let text = format!("{}[model.liveness]\nurl = \"/health\"\n", model("a"));
    fails(&text, "model[0].liveness.url", line_of(&text, "url", 0));
    let text = format!(
        "{}[model.signal]\nscrape = \"127.0.0.1:{{port}}\"\nformat = \"triton\"\n",
        model("a")
    );
    fails(&text, "model[0].signal.scrape", line_of(&text, "scrape", 0));
}

#[test]
fn serde_errors_inside_inline_tables_and_arrays_name_the_key() {
    // An unknown key in an inline table: toml points at the key.
    let text = "[[model]]\nname = \"a\"\ncommand = [\"x\", \"{port}\"]\n\
                warmup = { url = \"http://127.0.0.1:{port}/\", bogus = 1 }\n";
    let m = fails(text, "model[0].warmup.bogus", 4);
    assert!(m.contains("bogus"), "{m}");
    // A wrong type in an array: at the element, on its own line.
    let m = fails(
        "[access]\nadmins = [\n  \"root\",\n  3,\n]\n",
        "access.admins[1]",
        4,
    );
    assert!(m.contains("string"), "{m}");
    // A table of tables written inline, and a wrong type in a map.
    let m = fails("model = [{ name = \"a\", nope = 1 }]\n", "model[0].nope", 1);
    assert!(m.contains("nope"), "{m}");
    let text = format!("{}env = {{ A = \"ok\", B = 2 }}\n", model("a"));
    fails(&text, "model[0].env.B", line_of(&text, "env", 0));
    // A negative count for an unsigned key.
    let text = format!("{}[model.scaling]\nmin = -1\n", model("a"));
    let m = fails(&text, "model[0].scaling.min", line_of(&text, "min", 0));
    assert!(m.contains("-1"), "{m}");
    // A duplicate key is a syntax error at the second one, named with its table.
    let m = fails("[daemon]\ntick = \"1s\"\ntick = \"2s\"\n", "daemon.tick", 3);
    assert!(m.contains("duplicate key"), "{m}");
}

/// A key given twice is named whole, as every other error names keys: its table, an array of
/// tables' index, dotted keys and inline tables included (issue 24, item 10).
#[test]
fn a_duplicate_key_is_named_with_its_path_and_line() {
    let two = format!("{}{}", model("a"), model("b"));
    let cases = [
        (
            "[daemon]\ntick = \"1s\"\ntick = \"2s\"\n".to_string(),
            "daemon.tick",
            3,
        ),
        ("[daemon]\n[gpus]\n[daemon]\n".to_string(), "daemon", 3),
        (format!("{two}name = \"c\"\n"), "model[1].name", 9),
        (
            format!("{}[model.scaling]\nmin = 1\nmin = 2\n", model("a")),
            "model[0].scaling.min",
            7,
        ),
        (
            format!("{}[model.warmup]\nurl = \"x\"\n", model("a")),
            "model[0].warmup",
            5,
        ),
        (
            format!(
                "{}env = {{ A = \"1\", B = \"2\", A = \"3\" }}\n",
                model("a")
            ),
            "model[0].env.A",
            5,
        ),
        (
            "[daemon]\n\"tick\" = \"1s\"\n'tick' = \"2s\"\n".to_string(),
            "daemon.tick",
            3,
        ),
        (
            "[gpus]\n[[gpus.device]]\nuuid = \"a\"\n[[gpus.device]]\nuuid = \"b\"\nuuid = \"c\"\n"
                .to_string(),
            "gpus.device[1].uuid",
            6,
        ),
    ];
    for (text, key, line) in cases {
        let m = fails(&text, key, line);
        assert!(m.contains("duplicate key"), "{key}: {m}");
    }
}

#[test]
fn signal_models_are_for_triton_only_and_bounded() {
    let with = |format: &str, models: &str| {
        format!(
            "{}[model.signal]\nscrape = \"http://127.0.0.1:{{port}}/metrics\"\nformat = \"{format}\"\nmodels = {models}\n",
            model("a")
        )
    };
    let text = with("triton", "[\"ens\"]");
    let c = parse(&text).unwrap();
    let s = c.models[0].signal.as_ref().unwrap();
    assert_eq!(s.models, vec!["ens".to_string()]);
    for (format, models) in [
        ("vllm", "[\"ens\"]"),
        ("triton", "[]"),
        ("triton", "[\" \"]"),
    ] {
        let text = with(format, models);
        fails(&text, "model[0].signal.models", line_of(&text, "models", 0));
    }
    let text = format!(
        "{}[model.signal]\nscrape = \"http://127.0.0.1:{{port}}/metrics\"\nformat = \"triton\"\n",
        model("a")
    );
    assert!(parse(&text).unwrap().models[0]
        .signal
        .as_ref()
        .unwrap()
        .models
        .is_empty());
}
