//! The CLI's side of the socket: connect, send one request, read answers.

use std::path::{Path, PathBuf};

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::UnixStream;
use tokio_util::codec::{Framed, LinesCodec};

use crate::protocol::{self, Request};

/// `--socket`, then `HEARTH_SOCKET`, then the default path.
pub fn socket_path(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| std::env::var_os("HEARTH_SOCKET").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(protocol::DEFAULT_SOCKET))
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no daemon at {path}: {source}")]
    NoDaemon {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("connection to the daemon lost: {0}")]
    Lost(String),
}

pub struct Client {
    framed: Framed<UnixStream, LinesCodec>,
}

impl Client {
    pub async fn connect(path: &Path) -> Result<Client, ClientError> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| ClientError::NoDaemon {
                path: path.to_path_buf(),
                source,
            })?;
        // Answers can be large (status of a big host); events small. Allow generous lines.
        let codec = LinesCodec::new_with_max_length(64 * 1024 * 1024);
        Ok(Client {
            framed: Framed::new(stream, codec),
        })
    }

    pub async fn call(&mut self, req: &Request) -> Result<Value, ClientError> {
        let line = serde_json::to_string(req).map_err(|e| ClientError::Lost(e.to_string()))?;
        self.framed
            .send(line)
            .await
            .map_err(|e| ClientError::Lost(e.to_string()))?;
        self.next()
            .await
            .ok_or_else(|| ClientError::Lost("the daemon closed the connection".into()))
    }

    /// The next line from the daemon (watch events), None when it closed.
    pub async fn next(&mut self) -> Option<Value> {
        match self.framed.next().await {
            Some(Ok(line)) => serde_json::from_str(&line).ok(),
            _ => None,
        }
    }
}
