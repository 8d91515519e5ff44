//! What /proc says about processes: the few fields containment needs, read without allocation
//! sized by anything a process controls.

use std::fs;
use std::path::Path;

/// Fields of /proc/PID/stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// R, S, D, Z, X…
    pub state: char,
    pub ppid: u32,
    pub pgrp: u32,
    pub session: u32,
    /// User and system time, in clock ticks.
    pub cpu_ticks: u64,
    /// Start time after boot, in clock ticks: with the pid, it names one process for good (a
    /// pid can be reused; the pair cannot).
    pub start_ticks: u64,
    /// Resident pages.
    pub rss_pages: u64,
}

impl Stat {
    pub fn alive(&self) -> bool {
        self.state != 'Z' && self.state != 'X'
    }
}

pub fn stat(pid: u32) -> Option<Stat> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&s)
}

/// /proc/PID/stat's text. The command name (field 2) may hold spaces and parentheses: the
/// fields that follow start after the last ')'.
pub fn parse_stat(s: &str) -> Option<Stat> {
    let rest = s.get(s.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i)?.parse::<u64>().ok();
    Some(Stat {
        state: f.first()?.chars().next()?,
        ppid: u32::try_from(num(1)?).ok()?,
        pgrp: u32::try_from(num(2)?).ok()?,
        session: u32::try_from(num(3)?).ok()?,
        cpu_ticks: num(11)?.saturating_add(num(12)?),
        start_ticks: num(19)?,
        rss_pages: num(21)?,
    })
}

/// Every pid in /proc now.
pub fn pids() -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// The process's cgroup v2 path (the `0::` line of /proc/PID/cgroup), relative to the mount.
pub fn cgroup_of(pid: u32) -> Option<String> {
    let s = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    parse_cgroup(&s)
}

pub fn parse_cgroup(s: &str) -> Option<String> {
    s.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim_end().to_string())
}

/// The socket inodes among the process's open files.
pub fn socket_inodes(pid: u32) -> Vec<u64> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let target = fs::read_link(e.ok()?.path()).ok()?;
        socket_inode(&target)
    })
    .collect()
}

/// "socket:[12345]" → 12345.
pub fn socket_inode(link: &Path) -> Option<u64> {
    link.to_str()?
        .strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// The process's command line, for messages: at most 80 characters, NULs as spaces.
pub fn describe(pid: u32) -> String {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let mut text: String = String::from_utf8_lossy(&raw)
        .chars()
        .map(|c| if c == '\0' || c.is_control() { ' ' } else { c })
        .take(80)
        .collect();
    text = text.trim().to_string();
    if text.is_empty() {
        format!("pid {pid}")
    } else {
        format!("pid {pid} ({text})")
    }
}

/// One variable of a process's initial environment.
pub fn env_var(pid: u32, name: &str) -> Option<String> {
    let raw = fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{name}=");
    raw.split(|b| *b == 0).find_map(|e| {
        std::str::from_utf8(e)
            .ok()?
            .strip_prefix(&prefix)
            .map(str::to_string)
    })
}

pub fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |v| v as u64)
}

pub fn clock_ticks() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|v| *v > 0)
        .map_or(100, |v| v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_survives_a_hostile_command_name() {
        let line = "42 (a) b) (c) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 12345 1000 250 18446744073709551615";
        let s = parse_stat(line).unwrap();
        assert_eq!((s.state, s.ppid, s.pgrp, s.session), ('S', 1, 42, 42));
        assert_eq!((s.cpu_ticks, s.start_ticks, s.rss_pages), (10, 12345, 250));
        assert!(parse_stat("42 (x").is_none());
        assert!(parse_stat("").is_none());
    }

    #[test]
    fn our_own_process_reads_back() {
        let me = std::process::id();
        let s = stat(me).unwrap();
        assert!(s.alive() && s.rss_pages > 0);
        assert!(pids().contains(&me));
        assert_eq!(
            parse_cgroup("12:memory:/x\n0::/hearth/toy-1\n"),
            Some("/hearth/toy-1".into())
        );
        assert_eq!(socket_inode(Path::new("socket:[99]")), Some(99));
        assert_eq!(socket_inode(Path::new("pipe:[99]")), None);
        assert!(describe(me).starts_with(&format!("pid {me} (")));
    }
}
