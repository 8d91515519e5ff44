//! The host under test: a booted container ([`testkit::nspawn`]) with hearth installed from the
//! repo's own unit files the way docs/operations.md ("Installing with systemd", and its rehearsal)
//! says, and what the checks ask of it: systemctl's view, hearth's status, the journal, scopes.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use testkit::nspawn::{self, Container, HOST_ETC};
use testkit::ports::{self, PortBlock};
use testkit::{Model, Value};

/// Where the build directory (target/release) is bound, read-only: outside /home and /root, which
/// the unit's ProtectHome= hides wherever the checkout lives.
pub const BUILD: &str = "/opt/hearth";
/// The daemon's configuration, as installed.
pub const CONFIG: &str = "/etc/hearth/config.toml";
/// The drop-in that points both units at the build and sets the test's timings.
pub const DROP_IN: &str = "/etc/systemd/system/hearth.service.d/10-build.conf";
/// WatchdogSec= in the test's drop-in: the shipped 30 s, shortened so that the watchdog's kill
/// comes within seconds. The loop pings every 2 s.
pub const WATCHDOG_SEC: u64 = 4;
/// The op the test's drop-in arms `HEARTH_FAULT_INJECT_STALL_ON_OP` with.
pub const STALL_OP: &str = "gpus";

/// One container at a time on the machine, whichever process boots it: they share the host's
/// network namespace, and with it the abstract socket that locks hearth's instance name (two
/// daemons with the default state_dir refuse to run side by side, as on one host).
const ONE_AT_A_TIME: &str = "under-systemd";

pub struct Host {
    pub c: Container,
    _one: nix::fcntl::Flock<std::fs::File>,
    /// Replica ports, then the front door's.
    ports: PortBlock,
    pub route: SocketAddr,
}

/// How one test installs hearth: what the drop-in adds, and the models.
pub struct Install {
    /// More `[Service]` lines in the drop-in (after ExecStart= and the timings).
    pub service: String,
    pub models: Vec<Model>,
}

/// The toy model every check runs: each replica is a shell that leaves a setsid'd `sleep 600`
/// and a double-forked `sleep 601` behind, then execs the toy server (1 s to load).
pub fn toy(min: u32, max: u32, warm: u32) -> Model {
    let script = format!(
        "setsid sleep 600 & (sleep 601 &) ; exec {BUILD}/hearth toy-server --port \"$0\" --load-time 1s --service-time 20ms"
    );
    Model::toy("toy", &[])
        .command(&["sh", "-c", &script, "{port}"])
        .default_account()
        .scale(min, max, warm)
}

impl Host {
    /// True where this machine cannot boot a container and `HEARTH_ALLOW_SKIP=1` lets the test
    /// pass with a note; without it the test fails, saying what is missing.
    pub fn cannot_boot() -> bool {
        let Some(why) = nspawn::unavailable() else {
            return false;
        };
        // A test that cannot boot its container checks nothing: it fails (testkit::needs), unless
        // HEARTH_ALLOW_SKIP=1 asks for a skip on purpose.
        !testkit::needs(false, || {
            format!("a container that boots systemd as PID 1 ({why})")
        })
    }

    /// Boots a container with the build bound in at [`BUILD`] and `extra_binds` at their own
    /// paths.
    pub fn boot(extra_binds: &[&Path]) -> Host {
        let one = ports::machine_lock(ONE_AT_A_TIME);
        let build = testkit::hearth().parent().expect("the build directory");
        let mut binds = vec![(build, Path::new(BUILD))];
        binds.extend(extra_binds.iter().map(|p| (*p, *p)));
        let c = Container::boot(&binds);
        let ports = ports::ports(12);
        let route = SocketAddr::from(([127, 0, 0, 1], ports.last));
        Host {
            c,
            _one: one,
            ports,
            route,
        }
    }

    /// The daemon's configuration file with `models`: the production paths (socket, state_dir
    /// by default), replica ports from the test's block, the front door on its last port.
    pub fn config(&self, models: &[Model]) -> String {
        let mut file = toml::toml! {
            [daemon]
            tick = "100ms"
            shutdown_timeout = "20s"

            // Requests wait at the front door while nothing is routed (the daemon stopped and
            // started again): longer than that takes.
            [route]
            queue_timeout = "60s"
        };
        // toml's IndexMut panics on a missing key rather than inserting it: insert into the
        // section's table.
        let mut section = |name: &str, key: &str, value: String| {
            let table = file[name]
                .as_table_mut()
                .expect("the section is written above");
            table.insert(key.into(), value.into());
        };
        section(
            "daemon",
            "ports",
            format!("{}-{}", self.ports.first, self.ports.last - 1),
        );
        section("route", "listen", self.route.to_string());
        let mut s = toml::to_string(&file).expect("a configuration serializes");
        for m in models {
            s += &m.render(("HEARTH_TESTKIT_MARK", "under-systemd"));
        }
        s
    }

    /// docs/operations.md's install, in a container whose /usr is read-only: accounts copied in from the
    /// host; the units, sysusers and tmpfiles files under /etc (where systemd reads them before
    /// /usr/lib); the configuration root:hearth 0640; a drop-in per unit for ExecStart= (the
    /// build, not /usr/local/bin) and the test's timings. Then `check-config`, `daemon-reload`.
    pub fn install(&self, how: &Install) {
        let repo = env!("CARGO_MANIFEST_DIR");
        let file = |name: &str| {
            std::fs::read_to_string(Path::new(repo).join("systemd").join(name))
                .unwrap_or_else(|e| panic!("systemd/{name}: {e}"))
        };
        self.c.sh_ok(&format!(
            "for f in passwd group shadow gshadow; do cp {HOST_ETC}/$f /etc/$f; done; \
             mkdir -p /etc/sysusers.d /etc/tmpfiles.d /etc/systemd/system/hearth.service.d \
             /etc/systemd/system/hearth-route.service.d"
        ));
        self.c.write(
            "/etc/systemd/system/hearth.service",
            &file("hearth.service"),
        );
        self.c.write(
            "/etc/systemd/system/hearth-route.service",
            &file("hearth-route.service"),
        );
        self.c
            .write("/etc/sysusers.d/hearth.conf", &file("hearth.sysusers"));
        self.c
            .write("/etc/tmpfiles.d/hearth.conf", &file("hearth.tmpfiles"));
        self.c
            .sh_ok("systemd-sysusers && systemd-tmpfiles --create /etc/tmpfiles.d/hearth.conf");
        self.c
            .write("/run/hearth-config.toml", &self.config(&how.models));
        self.c.sh_ok(&format!(
            "install -m 0640 -g hearth /run/hearth-config.toml {CONFIG} && rm /run/hearth-config.toml"
        ));
        self.c.write(
            DROP_IN,
            &format!(
                "[Service]\nExecStart=\nExecStart={BUILD}/hearth daemon --config {CONFIG}\n\
                 WatchdogSec={WATCHDOG_SEC}s\nRestartSec=1s\n\
                 Environment=HEARTH_FAULT_INJECT_STALL_ON_OP={STALL_OP}\n{}",
                how.service
            ),
        );
        self.c.write(
            "/etc/systemd/system/hearth-route.service.d/10-build.conf",
            &format!("[Service]\nExecStart=\nExecStart={BUILD}/hearth route --config {CONFIG}\n"),
        );
        // systemd's own debug log: each sd_notify message it takes, each state change.
        self.c.sh_ok(&format!(
            "systemd-analyze log-level debug && {BUILD}/hearth check-config {CONFIG} && systemctl daemon-reload"
        ));
    }

    /// `script` inside; panics unless it exits 0, with what it printed and hearth's journal.
    pub fn sh_ok(&self, script: &str) -> String {
        let out = self.c.sh(script);
        assert!(
            out.status.success(),
            "`{script}` in the container: {}\nstdout: {}\nstderr: {}\njournal:\n{}",
            out.status,
            out.stdout,
            out.stderr,
            self.journal_tail()
        );
        out.stdout
    }

    /// Replaces the configuration file (its mode and group stay).
    pub fn write_config(&self, text: &str) {
        self.c.write(CONFIG, text);
    }

    /// A client verb of the build, as root (an admin).
    pub fn hearth(&self, args: &str) -> testkit::CliOutput {
        self.c.sh(&format!("{BUILD}/hearth {args}"))
    }

    pub fn status(&self) -> Value {
        let out = self.hearth("status --json");
        assert!(out.status.success(), "hearth status: {}", out.stderr);
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
    }

    /// `systemctl show -p PROP --value UNIT`.
    pub fn show(&self, unit: &str, prop: &str) -> String {
        self.c
            .sh_ok(&format!("systemctl show -p {prop} --value {unit}"))
            .trim()
            .to_string()
    }

    pub fn main_pid(&self) -> i32 {
        self.show("hearth", "MainPID").parse().expect("MainPID")
    }

    pub fn restarts(&self) -> u32 {
        self.show("hearth", "NRestarts").parse().expect("NRestarts")
    }

    /// Waits until hearth is active with `line` as its STATUS= and hearth's own status says the
    /// same counts of `model` (routed, warm, nothing starting).
    pub fn wait_status_line(&self, model: &str, routed: u64, warm: u64) -> Value {
        let line = format!("1 model: {routed} routed, {warm} warm, 0 starting; GPUs: none");
        self.wait_status_text(&[(model, routed, warm)], &line)
    }

    /// [`Host::wait_status_line`] for several models and the line they make.
    pub fn wait_status_text(&self, counts: &[(&str, u64, u64)], line: &str) -> Value {
        let mut last = (String::new(), Value::Null);
        let found = testkit::poll(Duration::from_secs(40), || {
            let text = self.show("hearth", "StatusText");
            let st = self.status();
            let counted = counts.iter().all(|(m, routed, warm)| {
                let m = testkit::status::model(&st, m);
                m["routed"] == *routed && m["warm"] == *warm && m["starting"] == 0
            });
            let done = text == line && counted;
            last = (text, st.clone());
            done.then_some(st)
        });
        found.unwrap_or_else(|| {
            panic!(
                "STATUS={:?}, not {line:?}, or status is not {counts:?}: {}\n{}",
                last.0,
                last.1,
                self.journal_tail()
            )
        })
    }

    /// The replicas of `model` as (id, pid), sorted by id.
    pub fn replica_pids(&self, model: &str) -> Vec<(String, i32)> {
        let st = self.status();
        let mut v: Vec<(String, i32)> = testkit::status::replicas(&st, model)
            .iter()
            .map(|r| (testkit::status::id(r), testkit::status::pid(r)))
            .collect();
        v.sort();
        v
    }

    /// The loaded `hearth-*.scope` units, whatever their state.
    pub fn scopes(&self) -> Vec<String> {
        let out = self
            .c
            .sh_ok("systemctl list-units --all --plain --no-legend --type=scope 'hearth-*.scope'");
        out.lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect()
    }

    /// Every process in `unit`'s cgroup (pids inside the container).
    pub fn unit_procs(&self, unit: &str) -> Vec<i32> {
        let cg = self.show(unit, "ControlGroup");
        if cg.is_empty() {
            return Vec::new();
        }
        // Read inside: cgroup.procs gives pids in the reader's pid namespace.
        let text = self
            .c
            .sh(&format!("cat /sys/fs/cgroup{cg}/cgroup.procs"))
            .stdout;
        text.lines().filter_map(|l| l.trim().parse().ok()).collect()
    }

    /// A process inside is alive (not a zombie).
    pub fn alive(&self, pid: i32) -> bool {
        self.c.host_pid(pid).is_some_and(testkit::procs::alive)
    }

    /// `ps` inside: pid → (ppid, session, command line).
    pub fn ps(&self) -> Vec<(i32, i32, i32, String)> {
        let out = self.c.sh_ok("ps -eo pid=,ppid=,sid=,args=");
        out.lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let pid = f.next()?.parse().ok()?;
                let ppid = f.next()?.parse().ok()?;
                let sid = f.next()?.parse().ok()?;
                Some((pid, ppid, sid, f.collect::<Vec<_>>().join(" ")))
            })
            .collect()
    }

    /// The journal's position now, for [`Host::journal_since`].
    pub fn cursor(&self) -> String {
        let out = self.c.sh_ok("journalctl -q -n 1 -o json --no-pager");
        let last: Value = serde_json::from_str(out.trim()).expect("a journal entry");
        last["__CURSOR"].as_str().expect("__CURSOR").to_string()
    }

    /// Journal entries after `cursor` that match `filter` (journalctl's matches), as JSON.
    /// (`--cursor`, and the cursor's own entry left out: journalctl 252 with `--after-cursor`
    /// and matches skips the first entry that matches.)
    pub fn journal_since(&self, cursor: &str, filter: &str) -> Vec<Value> {
        let out = self.c.sh_ok(&format!(
            "journalctl -q --no-pager -o json --cursor='{cursor}' {filter}"
        ));
        out.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["__CURSOR"] != cursor)
            .collect()
    }

    /// MESSAGEs systemd itself (PID 1) logged about `unit` after `cursor`.
    pub fn manager_log(&self, cursor: &str, unit: &str) -> Vec<String> {
        self.journal_since(cursor, "_PID=1")
            .iter()
            .filter_map(|e| e["MESSAGE"].as_str())
            .filter(|m| m.starts_with(&format!("{unit}: ")) || m.contains(unit))
            .map(str::to_string)
            .collect()
    }

    /// Waits for a MESSAGE from PID 1 about `unit` after `cursor` that contains `text`.
    pub fn wait_manager(
        &self,
        cursor: &str,
        unit: &str,
        text: &str,
        timeout: Duration,
    ) -> Vec<String> {
        let mut seen = Vec::new();
        testkit::poll(timeout, || {
            seen = self.manager_log(cursor, unit);
            seen.iter().any(|m| m.contains(text)).then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "systemd never said {text:?} about {unit} within {timeout:?}; it said:\n{}",
                seen.join("\n")
            )
        });
        seen
    }

    /// The daemon's own lines (hearth.service, any run) after `cursor`.
    pub fn daemon_log(&self, cursor: &str) -> Vec<Value> {
        // Its own identifier: not the lines of systemd's child setting up the sandbox before
        // the exec, "(hearth)".
        self.journal_since(
            cursor,
            "_SYSTEMD_UNIT=hearth.service SYSLOG_IDENTIFIER=hearth",
        )
    }

    /// The last lines of hearth.service's journal, for a failure's message.
    pub fn journal_tail(&self) -> String {
        self.c
            .sh("journalctl -q --no-pager -n 60 -u hearth -u hearth-route -u hearth.slice")
            .stdout
    }

    /// Waits until `what` holds of the journal lines after `cursor` from hearth.
    pub fn wait_daemon_line(&self, cursor: &str, text: &str, timeout: Duration) -> Value {
        testkit::poll(timeout, || {
            self.daemon_log(cursor)
                .into_iter()
                .find(|e| e["MESSAGE"].as_str().is_some_and(|m| m.contains(text)))
        })
        .unwrap_or_else(|| {
            panic!(
                "the daemon did not log {text:?} within {timeout:?}:\n{}",
                self.journal_tail()
            )
        })
    }
}
