//! Where replicas' processes live and what outlives what: containment in cgroups, replicas
//! outliving the daemon, a panic's re-exec, `hearth upgrade`, the sd_notify conversation, chaos.
//! Most need root and a writable cgroup v2. One binary per area (tests/README.md).

mod chaos;
mod containment;
mod outlive;
mod panic_reexec;
mod systemd;
mod upgrade;
