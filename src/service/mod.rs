//! What a systemd service of hearth's needs, for the daemon and the front door alike: logs to
//! journald (or stderr) and sd_notify. Both processes use it; neither owns it.
#![forbid(unsafe_code)]

pub mod logging;
pub mod notify;
