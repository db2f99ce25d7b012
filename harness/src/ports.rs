//! Free loopback ports for tests that run in parallel.

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::{Mutex, OnceLock};

use anyhow::{bail, Result};

/// Ports already handed out by this process: the OS may offer a port again once its probe socket
/// is closed, and two tests of one run must not both get it.
fn handed_out() -> &'static Mutex<HashSet<u16>> {
    static PORTS: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    PORTS.get_or_init(|| Mutex::new(HashSet::new()))
}

/// A port that was free on 127.0.0.1 a moment ago and that this process has not handed out before.
/// Another process may still take it before it is used: bind soon.
pub fn free_port() -> Result<u16> {
    for _ in 0..64 {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut seen = handed_out().lock().unwrap_or_else(|e| e.into_inner());
        if seen.insert(port) {
            return Ok(port);
        }
    }
    bail!("no fresh free port after 64 tries")
}
