//! The launch spec as it is persisted: serde both ways, and the rule that a field left out reads
//! as the configuration's own default.

use std::time::Duration;

use serde_json::{json, Value};

use super::*;

fn launch_of(text: &str) -> LaunchSpec {
    parse(text).unwrap().models[0].launch.clone()
}

/// Every launch key written, none at its default, durations with sub-millisecond parts.
fn everything() -> LaunchSpec {
    launch_of(&format!(
        "{}version = \"7b-q4\"\nenv = {{ HF_HOME = \"/m\", PORT = \"{{port}}\" }}\n\
         user = \"svc\"\ngpus = 2\ngpu_memory = \"1.5GiB\"\nplacement = \"spread\"\n\
         prefetch = [\"/m/*.gguf\"]\n[model.warmup]\nurl = \"http://127.0.0.1:{{port}}/w\"\n\
         method = \"PUT\"\nbody = \"{{}}\"\nheaders = {{ x-a = \"1\" }}\nexpect_status = 204\n\
         expect_body = \"ok\"\ntimeout = \"0.0015s\"\nstartup_timeout = \"1h1m1s\"\n\
         recheck = \"90s\"\n",
        model("m").lines().take(3).collect::<Vec<_>>().join("\n") + "\n"
    ))
}

#[test]
fn a_launch_spec_round_trips_through_json_and_toml() {
    let minimal = launch_of(&model("m"));
    let all = everything();
    assert_eq!(all.warmup.timeout, Duration::from_micros(1500));
    assert_eq!(all.placement, Placement::Spread);
    for spec in [minimal, all, launch_of(EXAMPLE)] {
        let text = serde_json::to_string(&spec).unwrap();
        assert_eq!(
            serde_json::from_str::<LaunchSpec>(&text).unwrap(),
            spec,
            "{text}"
        );
        let text = toml::to_string(&spec).unwrap();
        assert_eq!(toml::from_str::<LaunchSpec>(&text).unwrap(), spec, "{text}");
    }
}

#[test]
fn a_persisted_launch_spec_reads_the_way_the_file_does() {
    let v = serde_json::to_value(launch_of(EXAMPLE)).unwrap();
    assert_eq!(v["placement"], "pack");
    assert_eq!(v["gpu_memory"], 40u64 << 30);
    assert_eq!(v["warmup"]["startup_timeout"], "10m");
    assert_eq!(v["warmup"]["recheck"], "5m");
    assert_eq!(v["warmup"]["timeout"], "30s");
    let v = serde_json::to_value(everything()).unwrap();
    assert_eq!(v["warmup"]["timeout"], "1ms500us");
    assert_eq!(v["warmup"]["startup_timeout"], "1h1m1s");
}

/// Each field removed in turn from a persisted spec: one the file may leave out must read as the
/// spec the file gives when it leaves it out, so that a field added later, at its default, never
/// makes an older persisted spec differ. Walks the fields serde writes, so a new one is covered
/// without being listed.
#[test]
fn a_field_missing_from_a_persisted_spec_reads_as_the_configuration_default() {
    let defaults = launch_of(&model("m"));
    let full = serde_json::to_value(&defaults).unwrap();
    let mut required = Vec::new();
    let mut paths: Vec<Vec<&str>> = Vec::new();
    let Value::Object(top) = &full else { panic!() };
    for (k, v) in top {
        paths.push(vec![k]);
        if let Value::Object(inner) = v {
            paths.extend(inner.keys().map(|i| vec![k.as_str(), i.as_str()]));
        }
    }
    assert!(paths.len() >= 18, "{paths:?}");
    for path in paths {
        let mut v = full.clone();
        let (last, parents) = path.split_last().unwrap();
        let mut at = &mut v;
        for p in parents {
            at = &mut at[*p];
        }
        at.as_object_mut().unwrap().remove(*last);
        match serde_json::from_value::<LaunchSpec>(v) {
            Ok(read) => assert_eq!(read, defaults, "{path:?} left out"),
            Err(_) => required.push(path.join(".")),
        }
    }
    required.sort();
    assert_eq!(
        required,
        ["command", "warmup", "warmup.url"],
        "what the file itself must say"
    );
}

#[test]
fn a_persisted_spec_with_a_field_this_binary_does_not_know_is_refused() {
    let mut v = serde_json::to_value(everything()).unwrap();
    v["cgroup"] = json!("hearth.slice");
    assert!(serde_json::from_value::<LaunchSpec>(v).is_err());
    let mut v = serde_json::to_value(everything()).unwrap();
    v["warmup"]["retries"] = json!(3);
    assert!(serde_json::from_value::<LaunchSpec>(v).is_err());
    let mut v = serde_json::to_value(everything()).unwrap();
    v["warmup"]["timeout"] = json!("soon");
    assert!(serde_json::from_value::<LaunchSpec>(v).is_err());
}
