//! How a replica's process ended, or why it never started: typed, so that the core decides on
//! what happened and only the display (logs, a replica's reason in status) turns it into words.

use std::fmt;

/// How a replica's leader process ended, as waitpid tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitStatus {
    /// It exited with this code.
    Code(i32),
    /// A signal ended it (its number, as Linux numbers them), dumping core or not.
    Signaled { signal: i32, core_dumped: bool },
    /// It ended, and waitpid said neither a code nor a signal.
    Ended,
    /// An adopted process gone before it could be watched.
    GoneBeforeWatched,
    /// An adopted process that is not this daemon's child: its status is not ours to read.
    NotAChild,
    /// Waiting for it failed (the OS error, for the operator).
    WaitFailed(String),
}

impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitStatus::Code(c) => write!(f, "exit status {c}"),
            ExitStatus::Signaled {
                signal,
                core_dumped,
            } => {
                match signal_name(*signal) {
                    Some(name) => write!(f, "killed by {name}")?,
                    None => write!(f, "killed by signal {signal}")?,
                }
                if *core_dumped {
                    f.write_str(" (core dumped)")?;
                }
                Ok(())
            }
            ExitStatus::Ended => f.write_str("ended"),
            ExitStatus::GoneBeforeWatched => f.write_str("ended (gone before it could be watched)"),
            ExitStatus::NotAChild => {
                f.write_str("ended (not a child of this daemon: its status is not known)")
            }
            ExitStatus::WaitFailed(e) => write!(f, "wait failed: {e}"),
        }
    }
}

/// The names of Linux's standard signals (the numbering of x86, ARM and most others), as the
/// shell's `kill -l` and nix spell them.
pub fn signal_name(signal: i32) -> Option<&'static str> {
    const NAMES: [&str; 31] = [
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    let i = usize::try_from(signal).ok()?.checked_sub(1)?;
    NAMES.get(i).copied()
}

/// Why a replica could not be started; nothing of it runs. Where the OS said why, its words are
/// kept for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpawnError {
    /// The account it runs as: unknown, or unable to reach its program (the check's words).
    Account(String),
    /// Its cgroup or scope could not be made ready.
    Containment(String),
    /// The gate that holds the child until it is placed could not be made.
    Gate(String),
    /// Its output (journal stream or log file, at `location`) could not be opened.
    Output { location: String, error: String },
    /// The configuration gave no command.
    EmptyCommand,
    /// The program could not be executed.
    Exec { program: String, error: String },
    /// The process could not be put in its cgroup or scope.
    Placing(String),
    /// The process ended before it was placed.
    EndedBeforePlaced,
    /// The process ended at once, before its pid could be read.
    EndedAtOnce,
}

impl fmt::Display for SpawnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpawnError::Account(why) | SpawnError::Containment(why) => f.write_str(why),
            SpawnError::Gate(e) => write!(f, "creating the spawn gate: {e}"),
            SpawnError::Output { location, error } => {
                write!(f, "opening its output ({location}): {error}")
            }
            SpawnError::EmptyCommand => f.write_str("empty command"),
            SpawnError::Exec { program, error } => write!(f, "{program}: {error}"),
            SpawnError::Placing(e) => write!(f, "placing the process: {e}"),
            SpawnError::EndedBeforePlaced => f.write_str("the process ended before it was placed"),
            SpawnError::EndedAtOnce => f.write_str("the process ended at once"),
        }
    }
}

impl std::error::Error for SpawnError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_read_as_the_shell_says_them() {
        assert_eq!(ExitStatus::Code(3).to_string(), "exit status 3");
        let killed = |signal, core_dumped| ExitStatus::Signaled {
            signal,
            core_dumped,
        };
        assert_eq!(killed(9, false).to_string(), "killed by SIGKILL");
        assert_eq!(killed(15, false).to_string(), "killed by SIGTERM");
        assert_eq!(killed(31, false).to_string(), "killed by SIGSYS");
        assert_eq!(
            killed(11, true).to_string(),
            "killed by SIGSEGV (core dumped)"
        );
        assert_eq!(killed(40, false).to_string(), "killed by signal 40");
        assert_eq!(killed(0, false).to_string(), "killed by signal 0");
        assert_eq!(killed(-1, false).to_string(), "killed by signal -1");
    }
}
