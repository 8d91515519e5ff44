//! What the binary says and refuses with no daemon to talk to, or only a socket: exit codes,
//! messages, `check-config`; the docs' paths and keys; the test harness itself. One binary
//! per area of the integration tests (tests/README.md): each links the library once.

mod check_config;
mod docs;
mod file_size;
mod harness;
mod messages;
mod usage;
