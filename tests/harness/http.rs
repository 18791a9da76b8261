//! tracer's `--listen` server read over plain HTTP: where it serves, one
//! GET, and the `tracer_stack_live_bytes` samples of /metrics.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::{ATTACH_TIMEOUT, Fixture, Record, Trace, Tracer};

/// `HOST:PORT` from the tracer's `serving ... on http://HOST:PORT` line.
pub fn listen_address(tracer: &mut Tracer) -> String {
    tracer.wait_stderr("tracer: serving /metrics", ATTACH_TIMEOUT);
    let line = tracer
        .stderr_lines_with("tracer: serving /metrics")
        .pop()
        .expect("the serving line");
    line.rsplit("http://")
        .next()
        .expect("an address after http://")
        .trim()
        .to_owned()
}

/// Leaky, traced every `interval` with `--listen 0` (and `extra_args`):
/// the fixture, the trace and the address it serves on.
pub fn serve_leaky(
    fixture_args: &[&str],
    interval: &str,
    extra_args: &[&str],
) -> (Fixture, Trace, String) {
    let fixture = Fixture::start("leaky", fixture_args);
    let mut trace = Record::pid(fixture.pid)
        .interval(interval)
        .args(["--listen", "0"])
        .args(extra_args)
        .attach();
    let address = listen_address(&mut trace.tracer);
    (fixture, trace, address)
}

/// GET `target` (path and query) from `address`: the status and body.
pub fn http_get(address: &str, target: &str) -> (u16, Vec<u8>) {
    let stream = TcpStream::connect(address)
        .unwrap_or_else(|error| panic!("could not connect to {address}: {error}"));
    http_get_on(stream, address, target)
}

/// [`http_get`] from the loopback address `source` (127.0.0.2: another
/// client than 127.0.0.1, on the same machine).
pub fn http_get_from(source: std::net::Ipv4Addr, address: &str, target: &str) -> (u16, Vec<u8>) {
    http_get_on(connect_from(source, address), address, target)
}

/// A connection to `address` (IPv4) from the local address `source`.
pub fn connect_from(source: std::net::Ipv4Addr, address: &str) -> TcpStream {
    use std::os::fd::FromRawFd as _;
    let to: std::net::SocketAddrV4 = address.parse().expect("an IPv4 address:port");
    let sockaddr = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let length = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a new socket, bound and connected with sockaddr_in values
    // that live through the calls, then owned by the TcpStream.
    unsafe {
        let socket = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(socket >= 0, "socket");
        let from = sockaddr(source, 0);
        assert_eq!(
            libc::bind(socket, (&raw const from).cast(), length),
            0,
            "bind {source}"
        );
        let to = sockaddr(*to.ip(), to.port());
        assert_eq!(
            libc::connect(socket, (&raw const to).cast(), length),
            0,
            "connect {address} from {source}"
        );
        TcpStream::from_raw_fd(socket)
    }
}

fn http_get_on(mut stream: TcpStream, address: &str, target: &str) -> (u16, Vec<u8>) {
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    write!(
        stream,
        "GET {target} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .expect("send the request");
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .unwrap_or_else(|error| panic!("no answer from {address}{target}: {error}"));
    let split = response
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP header in {:?}", String::from_utf8_lossy(&response)));
    let head = String::from_utf8_lossy(&response[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, response[split + 4..].to_vec())
}

/// The `tracer_stack_live_bytes` samples of /metrics: (pid, site, bytes).
pub fn stack_samples(address: &str) -> Vec<(u32, String, i64)> {
    let (status, body) = http_get(address, "/metrics");
    assert_eq!(status, 200);
    String::from_utf8_lossy(&body)
        .lines()
        .filter_map(|line| line.strip_prefix("tracer_stack_live_bytes{"))
        .map(|rest| {
            let label = |name: &str| -> String {
                let start = rest.find(&format!("{name}=\"")).expect("label") + name.len() + 2;
                rest[start..].split('"').next().expect("value").to_owned()
            };
            let bytes = rest
                .rsplit(' ')
                .next()
                .expect("value")
                .parse()
                .expect("bytes");
            (label("pid").parse().expect("pid"), label("site"), bytes)
        })
        .collect()
}

/// Polls /metrics until `done` holds for the stack samples; returns them.
pub fn wait_for_samples(
    address: &str,
    what: &str,
    done: impl Fn(&[(u32, String, i64)]) -> bool,
) -> Vec<(u32, String, i64)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let samples = stack_samples(address);
        if done(&samples) {
            return samples;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: last /metrics {samples:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
