//! `[route] agent_listen`: HAProxy's agent checks (docs/fleet.md). A balancer connects, may
//! send one line (`agent-send`: a model's name, or nothing for the host as a whole), and reads
//! one line back; then the connection closes. The answer is made from what the front door
//! holds (`Router::agent_answer`), never by asking the daemon.
//!
//! Bounded like every listener: at most `MAX_CONNECTIONS` checks at once (more are closed at
//! once, which HAProxy does not count as a failure), a line of at most `MAX_LINE` bytes, and
//! `SEND_WAIT` for it to come (HAProxy sends it as it connects; without `agent-send` nothing
//! comes, and the host's answer goes after the wait). There is no authentication: bind it to
//! the balancers' network only.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::agent::Answer;
use super::router::Router;

/// Checks answered at once; a fleet has a handful of balancers polling a handful of models.
pub const MAX_CONNECTIONS: usize = 256;
/// Longest `agent-send` line, newline excluded: a model's name.
pub const MAX_LINE: usize = 256;
/// How long a check may take to send its line.
pub const SEND_WAIT: Duration = Duration::from_millis(200);
/// How long writing the answer may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Answers checks until `stop`, which comes after the HTTP side closed: a stopping front door
/// goes on answering `drain` while its last requests finish.
pub async fn serve(listener: TcpListener, router: Arc<Router>, stop: CancellationToken) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut full_warned = false;
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("agent: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            if !full_warned {
                tracing::warn!(
                    "agent: {MAX_CONNECTIONS} checks at once; closing more until some end"
                );
                full_warned = true;
            }
            drop(stream);
            continue;
        };
        let router = router.clone();
        tokio::spawn(async move {
            let _permit = permit;
            check(stream, peer.ip().to_canonical(), &router).await;
        });
    }
}

/// What a check's bytes ask for: a name (empty: the host), or why they cannot be read.
fn asked(bytes: &[u8]) -> Result<&str, &'static str> {
    let line = match bytes.iter().position(|&b| b == b'\n') {
        Some(i) => &bytes[..i],
        None if bytes.len() > MAX_LINE => return Err("agent-send line too long"),
        None => bytes,
    };
    let text = std::str::from_utf8(line).map_err(|_| "agent-send is not UTF-8")?;
    Ok(text.trim())
}

async fn check(mut stream: TcpStream, ip: IpAddr, router: &Router) {
    let mut buf = [0u8; MAX_LINE + 1];
    let mut n = 0;
    let deadline = tokio::time::Instant::now() + SEND_WAIT;
    while n < buf.len() && !buf[..n].contains(&b'\n') {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf[n..])).await {
            Ok(Ok(0)) | Err(_) => break,
            Ok(Ok(k)) => n += k,
            Ok(Err(_)) => return,
        }
    }
    let answer = match asked(&buf[..n]) {
        Ok(name) => router.agent_answer(ip, name),
        Err(why) => Answer::Down(why.into()),
    };
    router.metrics.agent_check(answer.state());
    let line = format!("{answer}\n");
    let _ = tokio::time::timeout(WRITE_TIMEOUT, async {
        stream.write_all(line.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_names_a_model_or_the_host() {
        assert_eq!(asked(b"llama\n"), Ok("llama"));
        assert_eq!(asked(b" llama \r\nmore"), Ok("llama"));
        assert_eq!(asked(b""), Ok(""));
        assert_eq!(asked(b"\n"), Ok(""));
        // Without a newline (EOF, or the wait ran out): what came.
        assert_eq!(asked(b"toy"), Ok("toy"));
        assert!(asked(&[b'x'; MAX_LINE + 1]).is_err());
        assert!(asked(b"\xff\xfe\n").is_err());
    }
}
