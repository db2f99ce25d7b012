//! Path rules: which requests the balancer touches, and who may reach management paths.
//!
//! Health checks and metrics are different things: a load balancer probes a light health path and
//! routes by it alone; metrics and management endpoints are not business traffic, must not be
//! reachable through the business entry point except from internal networks, and their heavy
//! scrapes must not pollute the latency statistics. So:
//! - health probes pass untouched: never steered, never sampled;
//! - management paths are answered with a local 403 unless the client is in the allowlist;
//! - excluded paths (long polls, streams, uploads) are left to the fallback and never sampled,
//!   since their duration says nothing about the host's speed.
//!
//! Paths are compared after normalisation (query dropped, percent-decoding, dot segments, repeated
//! slashes, `;` parameters, case), so `/Actuator/./env;x` cannot slip past a rule, and a prefix
//! matches whole segments, so `/actuator/health` is not a prefix of `/actuator/healthdump`. The
//! client writes the path, so normalising it is linear in its length whatever it holds, and a path
//! a backend could read as another one than the rules do (an encoded separator, a NUL, still
//! encoded after a few decodings) is guarded like a management path rather than guessed at.

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

/// What a request's path makes of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathClass {
    Health,
    Management,
    Excluded,
    Business,
}

/// The compiled rules: normalised paths and parsed networks.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rules {
    pub(crate) health: CompiledSet,
    pub(crate) management: CompiledSet,
    pub(crate) excluded: CompiledSet,
    /// The networks of `management.allowed_cidrs`.
    pub(crate) allowed: Vec<IpNet>,
}

/// Exact paths and prefixes, normalised (`normalize`).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct CompiledSet {
    pub(crate) exact: Vec<Vec<u8>>,
    pub(crate) prefix: Vec<Vec<u8>>,
}

impl CompiledSet {
    fn matches(&self, path: &[u8]) -> bool {
        self.matching(path).is_some()
    }

    /// Which rule matches `path`: its kind (`exact`, `prefix`) and index, the first that does.
    fn matching(&self, path: &[u8]) -> Option<(&'static str, usize)> {
        let exact =
            |e: &Vec<u8>| path == e.as_slice() || path.strip_suffix(b"/") == Some(e.as_slice());
        let prefix = |p: &Vec<u8>| {
            path.strip_prefix(p.as_slice())
                .is_some_and(|rest| p.ends_with(b"/") || rest.is_empty() || rest.starts_with(b"/"))
        };
        self.exact
            .iter()
            .position(exact)
            .map(|i| ("exact", i))
            .or_else(|| self.prefix.iter().position(prefix).map(|i| ("prefix", i)))
    }
}

impl Rules {
    /// The `health_paths` rule that makes `path` a probe: its kind (`exact` or `prefix`) and
    /// index. `None` when `path` is ambiguous or no health rule matches it.
    pub(crate) fn health_rule(&self, path: &str) -> Option<(&'static str, usize)> {
        let normal = normalize(path);
        if normal.is_ambiguous() {
            return None;
        }
        self.health.matching(normal.as_bytes())
    }

    /// Classifies a request by its `:path`. Health wins over management, so the default
    /// `/actuator/health` stays a probe while the rest of `/actuator` is guarded: safe only
    /// because both match whole segments and an ambiguous path is guarded first.
    pub fn classify(&self, raw_path: &str) -> PathClass {
        self.classify_bytes(raw_path.as_bytes())
    }

    /// `classify` of a path as the host hands it over: bytes, not necessarily UTF-8.
    pub fn classify_bytes(&self, raw_path: &[u8]) -> PathClass {
        self.classify_normalized(&normalize_bytes(raw_path))
    }

    /// `classify` for a path `normalize` already returned. An ambiguous path is management
    /// whatever the rules say: neither a probe that passes untouched nor business traffic.
    pub(crate) fn classify_normalized(&self, path: &NormalPath<'_>) -> PathClass {
        let bytes = path.as_bytes();
        if path.is_ambiguous() {
            PathClass::Management
        } else if self.health.matches(bytes) {
            PathClass::Health
        } else if self.management.matches(bytes) {
            PathClass::Management
        } else if self.excluded.matches(bytes) {
            PathClass::Excluded
        } else {
            PathClass::Business
        }
    }

    /// May the client reach a management path? `source` is Envoy's `source.address`
    /// (`IP:port`). X-Forwarded-For is never read here: Envoy's connection manager already
    /// folds the hops it trusts into `source.address`, and only those.
    pub fn management_allowed(&self, source: Option<&str>) -> bool {
        source
            .and_then(parse_ip)
            .is_some_and(|ip| self.allowed.iter().any(|net| net.contains(&ip)))
    }
}

/// An IP from `IP`, `IP:port` or `[IPv6]:port`; IPv4-mapped IPv6 counts as IPv4. Unix socket
/// paths and anything else give `None`.
fn parse_ip(s: &str) -> Option<IpAddr> {
    let ip = s
        .parse::<SocketAddr>()
        .map(|a| a.ip())
        .or_else(|_| s.parse::<IpAddr>())
        .ok()?;
    Some(ip.to_canonical())
}

// === Normalisation ===

/// How many times a path is percent-decoded before it is compared. Envoy's `normalize_path`
/// leaves `%25` encoded, so every level a client nests reaches the plugin. A client encodes a
/// path once and each proxy or framework behind Envoy decodes it at most once more: double
/// encoding (`%252e`) is the classic bypass, and scanners' payload lists go to three or four
/// levels. Four rounds cover that for at most four passes over the path; a path still encoded
/// after them is ambiguous, hence guarded, not decoded further. Decoding to a fixpoint cost one
/// pass per nesting level instead: 20 000 nested `%25` held an Envoy worker for 13 s.
pub const MAX_DECODINGS: usize = 4;

/// The most bytes `normalize_counting` reads per byte of its input: one pass each to find the
/// query and to check for the fast path, at most two per decoding round (a search for the first
/// escape, then the round), one to check that nothing is left to decode, one to resolve segments.
pub const MAX_SCANNED_PER_BYTE: usize = 2 * MAX_DECODINGS + 4;

/// A path in the form the rules compare. Bytes, not a string: an escape may decode to any byte,
/// and a byte that is not UTF-8 must not stop the decoding of the others.
#[derive(Clone, PartialEq, Eq)]
pub struct NormalPath<'a> {
    bytes: Cow<'a, [u8]>,
    ambiguous: bool,
}

impl<'a> NormalPath<'a> {
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The backend may read this path as another one than the rules do. Backends disagree on
    /// what a separator or a dot segment is once it is encoded: nginx and Go's `net/http`
    /// decode `%2F` into a segment break and resolve `..` across it, Tomcat refuses it or passes
    /// it through as data, Express matches the raw path. So `/actuator/env/..%2F..%2Fhealth` is
    /// `/health` to nginx and an argument of `/actuator/env/{name}` to a Spring application
    /// whose Tomcat passes `%2F` through. Ambiguous:
    /// - a separator that came from decoding (`%2F`, `%5C`, `%252F`, ...), or any backslash,
    ///   which IIS and Windows file APIs read as a separator and most others as a byte;
    /// - a dot segment spelt with an escape (`%2e%2e` is a name to Express; Envoy's
    ///   `normalize_path` resolves it but leaves `%252e` for the backend to decode or not), or
    ///   one only once its `;` parameters are dropped (`..;x`: Tomcat resolves it, Go does not);
    /// - an escape left after `MAX_DECODINGS` rounds;
    /// - a control byte (a C backend stops at NUL, so `/actuator/env%00/../../health` is a probe
    ///   to the rules and `/actuator/env` to it) or overlong UTF-8 that lenient decoders read
    ///   as ASCII (`%c0%ae` as `.`).
    ///
    /// Such a path is classified as management, whatever the rules say.
    pub fn is_ambiguous(&self) -> bool {
        self.ambiguous
    }

    /// The bytes; borrowed from the request's path when that was already normal.
    pub fn into_bytes(self) -> Cow<'a, [u8]> {
        self.bytes
    }
}

/// Byte for byte, whether ambiguous or not.
impl PartialEq<str> for NormalPath<'_> {
    fn eq(&self, other: &str) -> bool {
        *self.bytes == *other.as_bytes()
    }
}

impl PartialEq<&str> for NormalPath<'_> {
    fn eq(&self, other: &&str) -> bool {
        *self == **other
    }
}

impl PartialEq<String> for NormalPath<'_> {
    fn eq(&self, other: &String) -> bool {
        *self == **other
    }
}

impl fmt::Debug for NormalPath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.bytes.escape_ascii())?;
        if self.ambiguous {
            f.write_str(" (ambiguous)")?;
        }
        Ok(())
    }
}

/// The form paths are compared in: no query or fragment; percent-decoded at most
/// `MAX_DECODINGS` times, with `%3F` and `%23` kept encoded; backslashes as slashes; `;`
/// parameters dropped; no empty or `.` segments; `..` resolved; ASCII lower case; a trailing
/// slash kept. Linear in the path's length; a path that is already normal is borrowed. Whether
/// a backend could read it otherwise is `NormalPath::is_ambiguous`.
pub fn normalize(raw: &str) -> NormalPath<'_> {
    normalize_bytes(raw.as_bytes())
}

/// `normalize` of a path as the host hands it over: bytes, not necessarily UTF-8.
pub fn normalize_bytes(raw: &[u8]) -> NormalPath<'_> {
    normalize_counting(raw).0
}

/// `normalize_bytes`, and how many bytes it read on the way: at most `MAX_SCANNED_PER_BYTE`
/// times the length of `raw`. The tests bound this count rather than a time.
pub fn normalize_counting(raw: &[u8]) -> (NormalPath<'_>, usize) {
    let mut scanned = 0;
    let path = before_query(raw, &mut scanned);
    if is_normal(path, &mut scanned) {
        return (
            NormalPath {
                bytes: Cow::Borrowed(path),
                ambiguous: false,
            },
            scanned,
        );
    }
    let (decoded, found) = decode(path, &mut scanned);
    let (bytes, odd) = resolve_segments(&decoded, found.dot, &mut scanned);
    (
        NormalPath {
            bytes: Cow::Owned(bytes),
            ambiguous: found.still_encoded || found.separator || odd,
        },
        scanned,
    )
}

/// The path without its query or fragment.
fn before_query<'p>(raw: &'p [u8], scanned: &mut usize) -> &'p [u8] {
    match raw.iter().position(|&b| b == b'?' || b == b'#') {
        Some(end) => {
            *scanned += end + 1;
            raw.get(..end).unwrap_or_default()
        }
        None => {
            *scanned += raw.len();
            raw
        }
    }
}

/// True for the common path that normalising would not change: lower case, digits and `-_~.`,
/// slash-separated segments none of which is empty, `.` or `..` (a trailing slash is kept).
fn is_normal(path: &[u8], scanned: &mut usize) -> bool {
    let plain = |b: u8| {
        b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'~' | b'.')
    };
    let proper_segment = |s: &[u8]| !matches!(s, b"" | b"." | b"..");
    let mut segment_start = 1;
    for (i, &b) in path.iter().enumerate() {
        *scanned += 1;
        match b {
            b'/' if i == 0 => {}
            _ if i == 0 => return false,
            b'/' => {
                if !path.get(segment_start..i).is_some_and(proper_segment) {
                    return false;
                }
                segment_start = i + 1;
            }
            _ if !plain(b) => return false,
            _ => {}
        }
    }
    // The last segment may be empty: a trailing slash, or the path "/".
    path.get(segment_start..)
        .is_some_and(|last| last.is_empty() || proper_segment(last))
}

/// What decoding turned up that a backend may read otherwise.
#[derive(Clone, Copy, Default)]
struct Decoded {
    /// An escape became `/` or `\`.
    separator: bool,
    /// An escape became `.`.
    dot: bool,
    /// An escape is left after the last round.
    still_encoded: bool,
}

/// Percent-decodes `path` up to `MAX_DECODINGS` times, stopping at the first round that finds
/// nothing to decode; and says what the escapes it decoded, or left, were.
fn decode<'p>(path: &'p [u8], scanned: &mut usize) -> (Cow<'p, [u8]>, Decoded) {
    let mut current = Cow::Borrowed(path);
    let mut found = Decoded::default();
    for _ in 0..MAX_DECODINGS {
        match decode_once(&current, scanned, &mut found) {
            Some(next) => current = Cow::Owned(next),
            None => return (current, found),
        }
    }
    found.still_encoded = first_escape(&current, scanned).is_some();
    (current, found)
}

/// One round: every escape becomes its byte, whatever that byte is. `None` if there was none.
fn decode_once(input: &[u8], scanned: &mut usize, found: &mut Decoded) -> Option<Vec<u8>> {
    let first = first_escape(input, scanned)?;
    let (unchanged, mut rest) = input.split_at_checked(first)?;
    *scanned += input.len();
    let mut out = Vec::with_capacity(input.len());
    out.extend_from_slice(unchanged);
    // Whatever lies between two `%` is copied in one go.
    while let Some(at) = find_percent(rest) {
        let (plain, from_percent) = rest.split_at_checked(at)?;
        out.extend_from_slice(plain);
        let (byte, width) = escaped_byte(from_percent, 0).map_or((b'%', 1), |v| (v, 3));
        if width == 3 {
            found.separator |= matches!(byte, b'/' | b'\\');
            found.dot |= byte == b'.';
        }
        out.push(byte);
        rest = from_percent.get(width..)?;
    }
    out.extend_from_slice(rest);
    Some(out)
}

/// Where the first escape that decoding would change starts.
fn first_escape(input: &[u8], scanned: &mut usize) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = input.get(from..).and_then(find_percent) {
        let i = from + at;
        if escaped_byte(input, i).is_some() {
            *scanned += i + 3;
            return Some(i);
        }
        from = i + 1;
    }
    *scanned += input.len();
    None
}

/// Where the first `%` is. Eight bytes at a time: a path of `2525…` between two `%` is just what
/// an attacker sends, and each decoding round crosses it.
fn find_percent(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH_BITS: u64 = u64::from_ne_bytes([0x80; 8]);
    const PERCENTS: u64 = u64::from_ne_bytes([b'%'; 8]);
    let mut skipped = 0;
    for chunk in bytes.chunks_exact(8) {
        let word = u64::from_ne_bytes(chunk.try_into().ok()?) ^ PERCENTS;
        // Nonzero exactly when some byte of `word` is zero, i.e. some byte of `chunk` is `%`.
        if word.wrapping_sub(ONES) & !word & HIGH_BITS != 0 {
            break;
        }
        skipped += 8;
    }
    let at = bytes.get(skipped..)?.iter().position(|&b| b == b'%')?;
    Some(skipped + at)
}

/// The byte a `%XX` at `i` stands for. `%3F` and `%23` stay encoded: decoded, they would read as
/// a query or fragment the next round. A `%` without two hex digits is just a `%`.
fn escaped_byte(input: &[u8], i: usize) -> Option<u8> {
    let hex = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        b'A'..=b'F' => Some(d - b'A' + 10),
        _ => None,
    };
    match input.get(i..i.saturating_add(3))? {
        [b'%', high, low] => {
            Some(hex(*high)? << 4 | hex(*low)?).filter(|v| !matches!(v, b'?' | b'#'))
        }
        _ => None,
    }
}

/// Backslashes as slashes, `;` parameters dropped, empty and `.` segments removed, `..`
/// resolved, ASCII lower case, a trailing slash kept. Also says whether a byte or a segment
/// makes the path ambiguous (see `NormalPath::is_ambiguous`); `decoded_dot` says an escape
/// became a `.` somewhere, so that any dot segment may be spelt with one.
fn resolve_segments(decoded: &[u8], decoded_dot: bool, scanned: &mut usize) -> (Vec<u8>, bool) {
    let mut out = Vec::with_capacity(decoded.len() + 1);
    // Where each kept segment's slash is in `out`: `..` drops the last one in constant time.
    let mut kept: Vec<usize> = Vec::new();
    let mut segment_start = 0;
    let mut in_parameters = false;
    let mut ambiguous = false;
    let mut previous = 0;
    out.push(b'/');
    for &b in decoded {
        *scanned += 1;
        ambiguous |= is_ambiguous_byte(previous, b);
        previous = b;
        match b {
            b'/' | b'\\' => {
                ambiguous |= b == b'\\';
                let dot = close_segment(&mut out, &mut kept, segment_start);
                ambiguous |= dot && (decoded_dot || in_parameters);
                segment_start = out.len();
                out.push(b'/');
                in_parameters = false;
            }
            b';' => in_parameters = true,
            _ if !in_parameters => out.push(b.to_ascii_lowercase()),
            _ => {}
        }
    }
    let dot = close_segment(&mut out, &mut kept, segment_start);
    ambiguous |= dot && (decoded_dot || in_parameters);
    if out.is_empty() || matches!(decoded.last(), Some(b'/' | b'\\')) {
        out.push(b'/');
    }
    (out, ambiguous)
}

/// Ends the segment whose slash is at `start` in `out`: keeps it, drops it, or drops it and
/// the one kept before it. True when it was a dot segment.
fn close_segment(out: &mut Vec<u8>, kept: &mut Vec<usize>, start: usize) -> bool {
    match out.get(start + 1..) {
        Some(b"..") => {
            out.truncate(kept.pop().unwrap_or(start));
            true
        }
        Some(b".") => {
            out.truncate(start);
            true
        }
        Some(b"") | None => {
            out.truncate(start);
            false
        }
        Some(_) => {
            kept.push(start);
            false
        }
    }
}

/// Control bytes (NUL ends a path in C; CR and LF split log lines), and overlong UTF-8, which no
/// valid client sends but lenient decoders read as ASCII: `C0 AE` as `.`, `E0 80 AF` as `/`.
fn is_ambiguous_byte(previous: u8, b: u8) -> bool {
    b.is_ascii_control()
        || matches!(
            (previous, b),
            (0xC0 | 0xC1, 0x80..=0xBF) | (0xE0, 0x80..=0x9F) | (0xF0, 0x80..=0x8F)
        )
}
