//! `[route]` and `[[model]] slots`: the front door's keys, checked with the rest of the file.

use std::time::Duration;

use super::{fails, model, parse};

fn two_models() -> String {
    format!("{}{}", model("llama"), model("embed"))
}

#[test]
fn route_keys_apply_and_defaults_stay_elsewhere() {
    let text = format!(
        "{}slots = 8\n\n[route]\nlisten = \"0.0.0.0:9000\"\nmax_queue = 10\n\
         queue_timeout = \"5s\"\nmax_body = \"1MiB\"\nthreads = 2\n\
         api_keys = [\"0123456789abcdef\"]\n[route.aliases]\n\"gpt-4o\" = \"llama\"\n\
         [route.model.embed]\nmax_queue = 3\npaths = [\"/embedding\"]\n",
        two_models()
    );
    let c = parse(&text).unwrap();
    assert_eq!(c.models[0].slots, 1, "slots default to 1");
    assert_eq!(c.models[1].slots, 8);
    let s = crate::config::route::settings::RouteSettings::from_config(&c);
    assert_eq!(s.listen.to_string(), "0.0.0.0:9000");
    assert_eq!(s.queue_timeout, Duration::from_secs(5));
    assert_eq!(s.max_body, 1 << 20);
    assert_eq!(s.threads, 2);
    assert_eq!(s.models[0].max_queue, 10);
    assert_eq!(s.models[0].slots, 1);
    assert_eq!(s.models[1].max_queue, 3);
    assert_eq!(s.models[1].slots, 8);
    assert!(s.models[1].paths.allows("/embedding"));
    assert!(!s.models[1].paths.allows("/completion"));
    assert!(s.models[0].paths.allows("/completion"));
    assert_eq!(s.resolve("gpt-4o"), Some(0));
    assert_eq!(s.resolve("embed"), Some(1));
    assert_eq!(s.resolve("nope"), None);
    assert_eq!(s.api_keys.len(), 1);
    assert_eq!(s.socket, c.daemon.socket);
}

#[test]
fn fleet_keys_apply_and_are_off_by_default() {
    let c = parse(&two_models()).unwrap();
    let s = crate::config::route::settings::RouteSettings::from_config(&c);
    assert_eq!(s.agent_listen, None);
    assert_eq!(s.balancers, 1);
    assert_eq!(s.drain_timeout, Duration::from_secs(30));
    assert_eq!(s.drain_grace, Duration::from_secs(2));
    assert_eq!(s.models[0].stale_after, c.models[0].scaling.stale_after);
    let text = format!(
        "{}[route]\nagent_listen = \"10.0.0.5:9400\"\nbalancers = 3\n\
         drain_timeout = \"1m\"\ndrain_grace = \"500ms\"\n",
        two_models()
    );
    let s = crate::config::route::settings::RouteSettings::from_config(&parse(&text).unwrap());
    assert_eq!(
        s.agent_listen.map(|a| a.to_string()).as_deref(),
        Some("10.0.0.5:9400")
    );
    assert_eq!(s.balancers, 3);
    assert_eq!(s.drain_timeout, Duration::from_secs(60));
    assert_eq!(s.drain_grace, Duration::from_millis(500));
}

#[test]
fn a_file_without_route_runs_a_front_door_on_loopback() {
    let c = parse(&two_models()).unwrap();
    let s = crate::config::route::settings::RouteSettings::from_config(&c);
    assert!(s.listen.ip().is_loopback(), "{}", s.listen);
    assert!(s.api_keys.is_empty());
    assert_eq!(s.models.len(), 2);
}

#[test]
fn route_errors_name_line_and_key() {
    let base = two_models();
    let at = base.lines().count() + 1;
    let cases: Vec<(String, usize, &str)> = vec![
        ("[route]\nlisten = \"nowhere\"\n".into(), 1, "route.listen"),
        ("[route]\n\nmax_queue = -1\n".into(), 2, "route.max_queue"),
        (
            "[route]\nqueue_timeout = \"0s\"\n".into(),
            1,
            "route.queue_timeout",
        ),
        (
            "[route.aliases]\nx = \"ghost\"\n".into(),
            1,
            "route.aliases.x",
        ),
        (
            "[route.aliases]\nembed = \"llama\"\n".into(),
            1,
            "route.aliases.embed",
        ),
        (
            "[route.model.ghost]\nmax_queue = 2\n".into(),
            0,
            "route.model.ghost",
        ),
        (
            "[route.model.llama]\nmax_queue = 2000000\n".into(),
            1,
            "route.model.llama.max_queue",
        ),
        (
            "[route.model.llama]\npaths = [\"/a/../b\"]\n".into(),
            1,
            "route.model.llama.paths",
        ),
        (
            "[route]\napi_keys = [\"0123456789abcdef\", \"short\"]\n".into(),
            1,
            "route.api_keys[1]",
        ),
        ("[route]\nmax_body = \"2GiB\"\n".into(), 1, "route.max_body"),
        ("[route]\nthreads = 0\n".into(), 1, "route.threads"),
        (
            "[route]\nmax_body = \"2MiB\"\nmax_buffered = \"1MiB\"\n".into(),
            2,
            "route.max_buffered",
        ),
        ("[route]\nlisten_on = 1\n".into(), 1, "route.listen_on"),
        (
            "[route]\nagent_listen = \"9400\"\n".into(),
            1,
            "route.agent_listen",
        ),
        (
            "[route]\nlisten = \"127.0.0.1:9400\"\nagent_listen = \"127.0.0.1:9400\"\n".into(),
            2,
            "route.agent_listen",
        ),
        ("[route]\nbalancers = 0\n".into(), 1, "route.balancers"),
        ("[route]\nbalancers = 2000\n".into(), 1, "route.balancers"),
        (
            "[route]\ndrain_timeout = \"2h\"\n".into(),
            1,
            "route.drain_timeout",
        ),
        (
            "[route]\ndrain_grace = \"soon\"\n".into(),
            1,
            "route.drain_grace",
        ),
        (
            "[route]\ntrusted_proxies = [\"10.0.0.1\",\n  \"10.1.2.3/16\"]\n".into(),
            2,
            "route.trusted_proxies[1]",
        ),
        (
            "[route]\ntrusted_proxies = [\"lb.example\"]\n".into(),
            1,
            "route.trusted_proxies[0]",
        ),
        (
            "[route]\ntrusted_proxies = \"10.0.0.1\"\n".into(),
            1,
            "route.trusted_proxies",
        ),
        (
            "[route]\nmax_body = \"1MiB\"\nmax_buffered_per_client = \"512KiB\"\n".into(),
            2,
            "route.max_buffered_per_client",
        ),
        (
            "[route]\nmax_buffered = \"8MiB\"\nmax_buffered_per_client = \"9MiB\"\n".into(),
            2,
            "route.max_buffered_per_client",
        ),
        (
            "[route.model.llama]\nslots = 2\n".into(),
            1,
            "route.model.llama.slots",
        ),
    ];
    for (tail, line, key) in cases {
        let text = format!("{base}{tail}");
        let m = fails(&text, key, at + line);
        assert!(!m.is_empty(), "{key}");
    }
}

#[test]
fn trusted_proxies_and_the_bound_per_client_apply() {
    let text = format!(
        "{}[route]\nmax_body = \"1MiB\"\nmax_buffered = \"4MiB\"\n\
         trusted_proxies = [\"10.0.0.5\", \" 10.1.0.0/16 \", \"fd00::/8\"]\n",
        two_models()
    );
    let s = crate::config::route::settings::RouteSettings::from_config(&parse(&text).unwrap());
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    assert!(s.trusted_proxies.contains(ip("10.0.0.5")));
    assert!(s.trusted_proxies.contains(ip("10.1.9.9")));
    assert!(s.trusted_proxies.contains(ip("fd00::7")));
    assert!(!s.trusted_proxies.contains(ip("10.0.0.6")));
    assert_eq!(
        s.max_buffered_per_client,
        1 << 20,
        "an eighth of max_buffered, at least max_body"
    );
    let text = format!(
        "{}[route]\nmax_buffered = \"64MiB\"\nmax_buffered_per_client = \"16MiB\"\n",
        two_models()
    );
    let s = crate::config::route::settings::RouteSettings::from_config(&parse(&text).unwrap());
    assert_eq!(s.max_buffered_per_client, 16 << 20);
    let s =
        crate::config::route::settings::RouteSettings::from_config(&parse(&two_models()).unwrap());
    assert_eq!(s.max_buffered_per_client, 128 << 20, "1 GiB / 8");
    assert!(
        s.trusted_proxies.0.is_empty(),
        "nobody is trusted by default"
    );
}

#[test]
fn slots_are_bounded() {
    for (v, ok) in [
        ("0", false),
        ("1", true),
        ("65536", true),
        ("65537", false),
        ("-3", false),
    ] {
        let text = format!("{}slots = {v}\n", model("m"));
        match parse(&text) {
            Ok(c) => assert!(ok, "{v}: accepted ({})", c.models[0].slots),
            Err(e) => {
                assert!(!ok, "{v}: {e}");
                assert_eq!(e.key, "model[0].slots", "{e}");
                assert_eq!(e.line, Some(5), "{e}");
            }
        }
    }
}
