//! Reading `status` answers (docs/design.md's STATUS, MODEL and REPLICA objects).

use serde_json::Value;

/// The model called `name` in a STATUS; panics if there is none.
pub fn model<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["models"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["name"] == name))
        .unwrap_or_else(|| panic!("no model {name} in status: {status}"))
}

/// The replicas of a MODEL.
pub fn replicas_of(model: &Value) -> Vec<Value> {
    model["replicas"].as_array().cloned().unwrap_or_default()
}

/// The replicas of model `name` in a STATUS.
pub fn replicas(status: &Value, name: &str) -> Vec<Value> {
    replicas_of(model(status, name))
}

/// The replicas of model `name` in `state`.
pub fn in_state(status: &Value, name: &str, state: &str) -> Vec<Value> {
    replicas(status, name)
        .into_iter()
        .filter(|r| r["state"] == state)
        .collect()
}

pub fn id(replica: &Value) -> String {
    replica["id"].as_str().unwrap_or_default().to_string()
}

/// The ids of `replicas`, sorted.
pub fn ids(replicas: &[Value]) -> Vec<String> {
    let mut v: Vec<String> = replicas.iter().map(id).collect();
    v.sort();
    v
}

/// A replica's pid; panics when it has none.
pub fn pid(replica: &Value) -> i32 {
    replica["pid"]
        .as_i64()
        .unwrap_or_else(|| panic!("no pid: {replica}")) as i32
}

pub fn addr(replica: &Value) -> String {
    replica["addr"].as_str().unwrap_or_default().to_string()
}

/// The GPU uuids a replica holds.
pub fn gpus(replica: &Value) -> Vec<String> {
    replica["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g.as_str().map(str::to_string))
        .collect()
}
