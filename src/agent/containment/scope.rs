//! Under systemd: each replica is a transient scope unit `INSTANCE-REPLICA.scope` under
//! `INSTANCE.slice`, made over D-Bus (org.freedesktop.systemd1.Manager.StartTransientUnit with
//! the child's pid), killed with KillUnit and stopped with StopUnit. systemd moves the process;
//! hearth writes no cgroup file itself, and reads the scope's cgroup for memory, CPU and
//! membership.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use zbus::zvariant::{OwnedObjectPath, Value};
use zbus::Connection;

use super::cgroup::Cgroup;
use super::procfs;
use super::ContainmentError;

const DEST: &str = "org.freedesktop.systemd1";
const PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";
/// How long systemd may take to run the job that moves a child into its new scope.
const PLACE_TIMEOUT: Duration = Duration::from_secs(20);
/// The D-Bus error systemd answers for a unit it does not have loaded (gone once empty).
const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";

/// How a method call failed, kept as zbus gave it: whether systemd said "no such unit" is read
/// from the error's D-Bus name, not from its words.
enum CallError {
    Timeout,
    Bus(zbus::Error),
}

impl CallError {
    fn is_no_such_unit(&self) -> bool {
        matches!(self, CallError::Bus(zbus::Error::MethodError(name, _, _)) if name.as_str() == NO_SUCH_UNIT)
    }

    fn in_method(self, method: &str) -> ContainmentError {
        ContainmentError::Systemd(match self {
            CallError::Timeout => format!("{method}: no answer from systemd within 10 s"),
            CallError::Bus(e) => format!("{method}: {e}"),
        })
    }
}
/// The device policy the unit gives hearth itself (hearth.service: `DevicePolicy=closed`,
/// `DeviceAllow=char-nvidia* rw`). A scope is a cgroup of its own: without these, a replica
/// moved out of the service's cgroup would leave the service's device filter behind.
pub const DEVICE_POLICY: &str = "closed";
pub const DEVICE_ALLOW: &[(&str, &str)] = &[("char-nvidia*", "rw")];

pub struct Scopes {
    handle: Handle,
    bus: Connection,
    /// `INSTANCE.slice`.
    pub slice: String,
    prefix: String,
    /// The cgroup2 mount, for reading a scope's cgroup.
    mount: Option<PathBuf>,
}

/// What a transient scope is made with: the properties of StartTransientUnit.
#[derive(Debug, Clone, PartialEq)]
pub enum Prop {
    Str(&'static str, String),
    Bool(&'static str, bool),
    U64(&'static str, u64),
    I32(&'static str, i32),
    Pids(Vec<u32>),
    DeviceAllow(Vec<(String, String)>),
}

/// The properties of a replica's scope. Kept apart from the call so a test can read them.
pub fn scope_properties(
    slice: &str,
    description: &str,
    pid: u32,
    stop_grace: Duration,
) -> Vec<Prop> {
    vec![
        Prop::Str("Description", description.to_string()),
        Prop::Str("Slice", slice.to_string()),
        Prop::Pids(vec![pid]),
        // A stop (hearth's, or `systemctl stop hearth.slice` by an operator) reaches every
        // process of the replica: SIGTERM to all, SIGKILL to what is left after stop_grace.
        Prop::Str("KillMode", "control-group".into()),
        Prop::I32("KillSignal", libc::SIGTERM),
        Prop::Bool("SendSIGKILL", true),
        Prop::U64(
            "TimeoutStopUSec",
            stop_grace.as_micros().min(u64::MAX as u128) as u64,
        ),
        // A scope whose processes were killed ends "failed"; it must not linger and hold the
        // name for the next replica of that id.
        Prop::Str("CollectMode", "inactive-or-failed".into()),
        Prop::Bool("MemoryAccounting", true),
        Prop::Bool("CPUAccounting", true),
        Prop::Bool("TasksAccounting", true),
        Prop::Str("DevicePolicy", DEVICE_POLICY.into()),
        Prop::DeviceAllow(
            DEVICE_ALLOW
                .iter()
                .map(|(d, m)| (d.to_string(), m.to_string()))
                .collect(),
        ),
    ]
}

fn to_values(props: &[Prop]) -> Vec<(&'static str, Value<'static>)> {
    props
        .iter()
        .map(|p| match p {
            Prop::Str(k, v) => (*k, Value::from(v.clone())),
            Prop::Bool(k, v) => (*k, Value::from(*v)),
            Prop::U64(k, v) => (*k, Value::from(*v)),
            Prop::I32(k, v) => (*k, Value::from(*v)),
            Prop::Pids(p) => ("PIDs", Value::from(p.clone())),
            Prop::DeviceAllow(d) => ("DeviceAllow", Value::from(d.clone())),
        })
        .collect()
}

impl Scopes {
    /// Connects to the system bus and checks that systemd answers on it.
    pub fn connect(
        handle: Handle,
        instance: &str,
        mount: Option<PathBuf>,
    ) -> Result<Scopes, ContainmentError> {
        let bus = handle
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(5), Connection::system()).await
            })
            .map_err(|_| {
                ContainmentError::Systemd("no answer from the system bus within 5 s".to_string())
            })?
            .map_err(|e| ContainmentError::Systemd(format!("system bus: {e}")))?;
        let s = Scopes {
            handle,
            bus,
            slice: format!("{instance}.slice"),
            prefix: format!("{instance}-"),
            mount,
        };
        let version: String = s
            .get_property(PATH, MANAGER, "Version")
            .map_err(|e| ContainmentError::Systemd(format!("systemd on the system bus: {e}")))?;
        tracing::debug!("systemd {version} on the system bus");
        Ok(s)
    }

    pub fn unit_name(&self, replica: &str) -> String {
        format!("{}{replica}.scope", self.prefix)
    }

    fn call<B>(&self, method: &str, body: &B) -> Result<zbus::Message, CallError>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
    {
        self.handle
            .block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(10),
                    self.bus
                        .call_method(Some(DEST), PATH, Some(MANAGER), method, body),
                )
                .await
            })
            .map_err(|_| CallError::Timeout)?
            .map_err(CallError::Bus)
    }

    fn get_property<T>(&self, path: &str, iface: &str, name: &str) -> Result<T, String>
    where
        T: TryFrom<zbus::zvariant::OwnedValue>,
        <T as TryFrom<zbus::zvariant::OwnedValue>>::Error: std::fmt::Display,
    {
        let reply = self
            .handle
            .block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(10),
                    self.bus.call_method(
                        Some(DEST),
                        path,
                        Some("org.freedesktop.DBus.Properties"),
                        "Get",
                        &(iface, name),
                    ),
                )
                .await
            })
            .map_err(|_| format!("{name}: no answer within 10 s"))?
            .map_err(|e| format!("{name}: {e}"))?;
        let v: zbus::zvariant::OwnedValue = reply
            .body()
            .deserialize()
            .map_err(|e| format!("{name}: {e}"))?;
        T::try_from(v).map_err(|e| format!("{name}: {e}"))
    }

    /// Creates the replica's scope around `pid` and waits until systemd has moved it there.
    pub fn start(
        &self,
        replica: &str,
        description: &str,
        pid: u32,
        stop_grace: Duration,
    ) -> Result<Cgroup, ContainmentError> {
        let name = self.unit_name(replica);
        let props = scope_properties(&self.slice, description, pid, stop_grace);
        let aux: Vec<(&str, Vec<(&str, Value<'_>)>)> = Vec::new();
        let reply = self
            .call(
                "StartTransientUnit",
                &(name.as_str(), "fail", to_values(&props), aux),
            )
            .map_err(|e| e.in_method("StartTransientUnit"))?;
        let _job: OwnedObjectPath = reply
            .body()
            .deserialize()
            .map_err(|e| ContainmentError::Systemd(format!("StartTransientUnit: {e}")))?;
        // The job runs after the call returns: the child is placed once /proc says so.
        let deadline = Instant::now() + PLACE_TIMEOUT;
        let suffix = format!("/{name}");
        loop {
            match procfs::cgroup_of(pid) {
                Some(cg) if cg.ends_with(&suffix) => {
                    return Ok(Cgroup::new(self.cgroup_dir(&cg)));
                }
                None => {
                    return Err(ContainmentError::Systemd(format!(
                        "pid {pid} vanished before systemd placed it in {name}"
                    )))
                }
                Some(_) if Instant::now() > deadline => {
                    return Err(ContainmentError::Systemd(format!(
                        "systemd did not move pid {pid} into {name} within {PLACE_TIMEOUT:?}"
                    )))
                }
                Some(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }

    fn cgroup_dir(&self, cgroup: &str) -> PathBuf {
        match &self.mount {
            Some(m) => m.join(cgroup.trim_start_matches('/')),
            None => PathBuf::from(cgroup),
        }
    }

    /// Signals every process of the scope.
    pub fn kill(&self, replica: &str, signal: i32) -> Result<(), ContainmentError> {
        let name = self.unit_name(replica);
        self.call("KillUnit", &(name.as_str(), "all", signal))
            .map(|_| ())
            .map_err(|e| e.in_method("KillUnit"))
    }

    /// Stops the scope (SIGKILL first: its leader is gone, what is left goes at once).
    pub fn stop(&self, replica: &str) -> Result<(), ContainmentError> {
        let _ = self.kill(replica, libc::SIGKILL);
        let name = self.unit_name(replica);
        match self.call("StopUnit", &(name.as_str(), "replace")) {
            Ok(_) => Ok(()),
            // Already gone (collected once empty): nothing to stop.
            Err(e) if e.is_no_such_unit() => Ok(()),
            Err(e) => Err(e.in_method("StopUnit")),
        }
    }

    /// Scopes of this instance that exist now: (replica, unit, its cgroup directory).
    pub fn list(&self) -> Result<Vec<(String, String, Option<Cgroup>)>, ContainmentError> {
        let states: Vec<&str> = Vec::new();
        let patterns = vec![format!("{}*.scope", self.prefix)];
        let reply = self
            .call("ListUnitsByPatterns", &(states, patterns))
            .map_err(|e| e.in_method("ListUnitsByPatterns"))?;
        type Unit = (
            String,
            String,
            String,
            String,
            String,
            String,
            OwnedObjectPath,
            u32,
            String,
            OwnedObjectPath,
        );
        let units: Vec<Unit> = reply
            .body()
            .deserialize()
            .map_err(|e| ContainmentError::Systemd(format!("ListUnitsByPatterns: {e}")))?;
        Ok(units
            .into_iter()
            .filter_map(|u| {
                let replica =
                    u.0.strip_prefix(&self.prefix)?
                        .strip_suffix(".scope")?
                        .to_string();
                let cgroup = self
                    .get_property::<String>(
                        u.6.as_str(),
                        "org.freedesktop.systemd1.Scope",
                        "ControlGroup",
                    )
                    .ok()
                    .filter(|c| !c.is_empty())
                    .map(|c| Cgroup::new(self.cgroup_dir(&c)));
                Some((replica, u.0, cgroup))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_carries_the_units_device_policy_and_kills_its_whole_cgroup() {
        let p = scope_properties(
            "hearth.slice",
            "hearth replica toy-1",
            42,
            Duration::from_secs(30),
        );
        assert!(p.contains(&Prop::Str("Slice", "hearth.slice".into())));
        assert!(p.contains(&Prop::Pids(vec![42])));
        assert!(p.contains(&Prop::Str("KillMode", "control-group".into())));
        assert!(p.contains(&Prop::Bool("SendSIGKILL", true)));
        assert!(p.contains(&Prop::U64("TimeoutStopUSec", 30_000_000)));
        assert!(p.contains(&Prop::Str("CollectMode", "inactive-or-failed".into())));
        assert!(p.contains(&Prop::Str("DevicePolicy", "closed".into())));
        assert!(p.contains(&Prop::DeviceAllow(vec![(
            "char-nvidia*".into(),
            "rw".into()
        )])));
        // The unit file says the same, so that a replica in its scope sees the devices hearth's
        // own service does.
        let unit = include_str!("../../../systemd/hearth.service");
        assert!(unit
            .lines()
            .any(|l| l == format!("DevicePolicy={DEVICE_POLICY}")));
        for (dev, mode) in DEVICE_ALLOW {
            assert!(
                unit.lines()
                    .any(|l| l == format!("DeviceAllow={dev} {mode}")),
                "{dev}"
            );
        }
        // And they serialize with the signatures systemd's StartTransientUnit takes.
        let values = to_values(&p);
        let sig = |k: &str| {
            values
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.value_signature().to_string())
                .unwrap()
        };
        assert_eq!(sig("PIDs"), "au");
        assert_eq!(sig("DeviceAllow"), "a(ss)");
        assert_eq!(sig("TimeoutStopUSec"), "t");
        assert_eq!(sig("KillSignal"), "i");
        assert_eq!(sig("SendSIGKILL"), "b");
        assert_eq!(sig("Slice"), "s");
    }
}
