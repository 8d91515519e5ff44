//! The CLI's side of the socket: connect, send one request, read answers.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::UnixStream;
use tokio_util::codec::{Framed, LinesCodec};

use crate::protocol::{self, Answer, Request};

/// `--socket`, then `HEARTH_SOCKET`, then the default path.
pub fn socket_path(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| std::env::var_os("HEARTH_SOCKET").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(protocol::DEFAULT_SOCKET))
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "no daemon at {path} ({source}); is `hearth daemon` running? For a daemon listening \
         elsewhere, set HEARTH_SOCKET=PATH or pass --socket PATH"
    )]
    NoDaemon {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The socket (or a directory on its way) is there but this user may not use it: saying
    /// "no daemon" would send the operator looking for a daemon that runs.
    #[error(
        "permission denied on the daemon's socket {path} ({source}): the daemon may well be          running, but this user may not connect. Its group may (`hearth` under systemd:          `usermod -aG hearth USER`, then log in again), and root may"
    )]
    Denied {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("connection to the daemon lost: {0}")]
    Lost(String),
}

impl ClientError {
    /// Why connecting to `path` failed, as the operator should read it.
    pub fn connecting(path: &Path, source: std::io::Error) -> ClientError {
        let path = path.to_path_buf();
        match source.kind() {
            std::io::ErrorKind::PermissionDenied => ClientError::Denied { path, source },
            _ => ClientError::NoDaemon { path, source },
        }
    }
}

pub struct Client {
    framed: Framed<UnixStream, LinesCodec>,
}

impl Client {
    pub async fn connect(path: &Path) -> Result<Client, ClientError> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| ClientError::connecting(path, source))?;
        // Answers can be large (status of a big host); events small. Allow generous lines.
        let codec = LinesCodec::new_with_max_length(64 * 1024 * 1024);
        Ok(Client {
            framed: Framed::new(stream, codec),
        })
    }

    /// Sends `req` and reads its answer as JSON, whatever its shape.
    pub async fn call(&mut self, req: &Request) -> Result<Value, ClientError> {
        let line = self.request(req).await?;
        serde_json::from_str(&line).map_err(|e| ClientError::Lost(format!("{e}: {line}")))
    }

    /// Sends `req` and reads its answer.
    pub async fn ask(&mut self, req: &Request) -> Result<Answer, ClientError> {
        let line = self.request(req).await?;
        protocol::decode_answer(&line, req.op())
            .map_err(|e| ClientError::Lost(format!("not an answer ({e}): {line}")))
    }

    async fn request(&mut self, req: &Request) -> Result<String, ClientError> {
        let line = serde_json::to_string(req).map_err(|e| ClientError::Lost(e.to_string()))?;
        self.framed
            .send(line)
            .await
            .map_err(|e| ClientError::Lost(e.to_string()))?;
        self.next_line()
            .await
            .ok_or_else(|| ClientError::Lost("the daemon closed the connection".into()))
    }

    /// The next line from the daemon (watch events), None when it closed.
    pub async fn next_line(&mut self) -> Option<String> {
        match self.framed.next().await {
            Some(Ok(line)) => Some(line),
            _ => None,
        }
    }

    /// The next line from the daemon as JSON, None when it closed (or sent something else).
    pub async fn next(&mut self) -> Option<Value> {
        serde_json::from_str(&self.next_line().await?).ok()
    }
}
