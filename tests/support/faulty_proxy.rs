//! An HTTP proxy in front of the S3 test server that fails requests the way networks and
//! busy servers do, and can slow every request down so a process can be killed mid-upload.
//!
//! Every `every`-th request fails, in turn: a `503 Slow Down` without reaching the server;
//! a connection dropped before the request is forwarded; a connection dropped after the
//! server handled the request, so its response is lost and a retry repeats it. With
//! `lose_create_responses`, the first create-if-absent (`If-None-Match: *`) of every
//! object also loses its response: its retry then finds the object already there.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// Fail every n-th request (0: never).
    pub every: u64,
    /// Wait this long before forwarding each request.
    pub delay: Duration,
    pub lose_create_responses: bool,
}

pub struct FaultyProxy {
    pub endpoint: String,
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    requests: AtomicU64,
    faults: AtomicU64,
    uploads: AtomicU64,
    uploads_in_flight: AtomicU64,
    created: Mutex<HashSet<String>>,
}

impl FaultyProxy {
    /// Listens on a free loopback port and forwards to `upstream` (`http://host:port`).
    pub fn start(upstream: &str, faults: Faults) -> FaultyProxy {
        let upstream = upstream.trim_start_matches("http://").trim_end_matches('/').to_string();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let counts = Arc::new(Counts::default());
        let shared = counts.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (upstream, counts) = (upstream.clone(), shared.clone());
                std::thread::spawn(move || serve(client, &upstream, faults, &counts));
            }
        });
        FaultyProxy { endpoint, counts }
    }

    pub fn requests(&self) -> u64 {
        self.counts.requests.load(Ordering::SeqCst)
    }

    pub fn faults(&self) -> u64 {
        self.counts.faults.load(Ordering::SeqCst)
    }

    /// PUT and POST requests received so far.
    pub fn uploads_started(&self) -> u64 {
        self.counts.uploads.load(Ordering::SeqCst)
    }

    /// PUT and POST requests received whose response has not gone back yet.
    pub fn uploads_in_flight(&self) -> u64 {
        self.counts.uploads_in_flight.load(Ordering::SeqCst)
    }
}

/// Serves one client connection, one request after another.
fn serve(client: TcpStream, upstream: &str, faults: Faults, counts: &Counts) {
    let mut reader = BufReader::new(client.try_clone().unwrap());
    let mut client = client;
    while let Some((head, body)) = read_request(&mut reader) {
        let n = counts.requests.fetch_add(1, Ordering::SeqCst) + 1;
        let upload = head.starts_with("PUT ") || head.starts_with("POST ");
        if upload {
            counts.uploads.fetch_add(1, Ordering::SeqCst);
            counts.uploads_in_flight.fetch_add(1, Ordering::SeqCst);
        }
        let served = answer(&mut client, upstream, faults, counts, n, &head, &body);
        if upload {
            counts.uploads_in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        if !served {
            break;
        }
    }
    let _ = client.shutdown(Shutdown::Both);
}

/// Answers one request, or fails it; false when the connection is to be closed.
fn answer(
    client: &mut TcpStream,
    upstream: &str,
    faults: Faults,
    counts: &Counts,
    n: u64,
    head: &str,
    body: &[u8],
) -> bool {
    std::thread::sleep(faults.delay);
    let mut fault = (faults.every > 0 && n.is_multiple_of(faults.every)).then(|| (n / faults.every) % 3);
    let request_line = head.lines().next().unwrap_or_default().to_string();
    if faults.lose_create_responses
        && head.to_ascii_lowercase().contains("\r\nif-none-match: *")
        && counts.created.lock().unwrap().insert(request_line)
    {
        fault = Some(2);
    }
    if fault.is_some() {
        counts.faults.fetch_add(1, Ordering::SeqCst);
    }
    match fault {
        Some(0) => {
            let _ = client.write_all(b"HTTP/1.1 503 Slow Down\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            false
        }
        Some(1) => false,
        _ => {
            let response = forward(upstream, head, body);
            fault != Some(2) && client.write_all(&response).is_ok()
        }
    }
}

/// One request: its head with `Connection: close` (so the server's response ends at EOF)
/// and its body. None at the end of the connection.
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<(String, Vec<u8>)> {
    let mut head = String::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(value) = lower.strip_prefix("content-length:") {
            length = value.trim().parse().unwrap();
        }
        assert!(!lower.starts_with("transfer-encoding:"), "the proxy handles only Content-Length bodies: {line}");
        if !lower.starts_with("connection:") {
            head.push_str(&line);
        }
    }
    head.push_str("Connection: close\r\n\r\n");
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((head, body))
}

/// The server's whole response; empty when the server could not be reached, which the
/// client sees as a dropped connection.
fn forward(upstream: &str, head: &str, body: &[u8]) -> Vec<u8> {
    let exchange = || -> std::io::Result<Vec<u8>> {
        let mut server = TcpStream::connect(upstream)?;
        server.write_all(head.as_bytes())?;
        server.write_all(body)?;
        let mut response = Vec::new();
        server.read_to_end(&mut response)?;
        Ok(response)
    };
    exchange().unwrap_or_default()
}
