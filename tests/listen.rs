//! `--listen`: what tracer serves over HTTP, read by the real tools that
//! gather it from a fleet: Debian's Prometheus scraping /metrics every
//! second, and `go tool pprof` fetching /debug/pprof/heap.

use crate::harness;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use harness::*;
use serde_json::Value;

/// A client on this machine other than 127.0.0.1.
const OTHER_CLIENT: std::net::Ipv4Addr = std::net::Ipv4Addr::new(127, 0, 0, 2);

/// How long Prometheus may take to start, and to scrape a new value.
const PROMETHEUS_TIMEOUT: Duration = Duration::from_secs(30);

/// A port nobody listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (byte as char).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// Debian's Prometheus, on a free loopback port, scraping one target
/// every second; its data lives in a temporary directory.
struct Prometheus {
    child: Child,
    directory: PathBuf,
    address: String,
}

impl Prometheus {
    fn start(scraped: &str) -> Prometheus {
        let directory =
            std::env::temp_dir().join(format!("tracer-test-prometheus-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&directory);
        std::fs::create_dir_all(&directory).expect("prometheus directory");
        let config = directory.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: tracer\n    static_configs:\n      \
                 - targets: ['{scraped}']\n"
            ),
        )
        .expect("prometheus config");
        let address = format!("127.0.0.1:{}", free_port());
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                directory.join("data").display()
            ))
            .arg(format!("--web.listen-address={address}"))
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(directory.join("prometheus.log")).expect("prometheus log"),
            )
            .spawn()
            .expect("could not start prometheus: run `cargo xtask setup` (Debian's prometheus)");
        let prometheus = Prometheus {
            child,
            directory,
            address,
        };
        let deadline = Instant::now() + PROMETHEUS_TIMEOUT;
        while TcpStream::connect(&prometheus.address).is_err()
            || http_get(&prometheus.address, "/-/ready").0 != 200
        {
            assert!(
                Instant::now() < deadline,
                "prometheus did not start: {}",
                prometheus.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        prometheus
    }

    /// The instant vector of `expression` now: each series' labels and value.
    fn query(&self, expression: &str) -> Vec<(BTreeMap<String, String>, String)> {
        let (status, body) = http_get(
            &self.address,
            &format!("/api/v1/query?query={}", url_encode(expression)),
        );
        let json: Value = serde_json::from_slice(&body).expect("prometheus answers JSON");
        assert_eq!(status, 200, "prometheus rejected {expression}: {json}");
        json["data"]["result"]
            .as_array()
            .expect("a result vector")
            .iter()
            .map(|series| {
                let labels = series["metric"]
                    .as_object()
                    .expect("labels")
                    .iter()
                    .map(|(key, value)| (key.clone(), value.as_str().unwrap_or("").to_owned()))
                    .collect();
                let value = series["value"][1].as_str().expect("a value").to_owned();
                (labels, value)
            })
            .collect()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.directory.join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.directory);
    }
}

/// Waits for a snapshot in which leak_here holds `bytes` (tracer's
/// /metrics).
fn wait_for_leak_here(address: &str, bytes: i64) {
    wait_for_samples(address, &format!("{bytes} B of leak_here"), |samples| {
        samples
            .iter()
            .any(|(_, site, live)| site.starts_with("leak_here") && *live == bytes)
    });
}

#[test]
fn prometheus_scrapes_the_leak_and_its_verdict() {
    let mut fixture = Fixture::start("leaky", &[]);
    let mut trace = Record::pid(fixture.pid)
        .interval("250ms")
        .top(20)
        .args(["--listen", "0"])
        .attach();
    let address = listen_address(&mut trace.tracer);
    let prometheus = Prometheus::start(&address);
    // Churn once: its kept blocks are a one-time step, not a leak.
    let churn = fixture.cmd("churn 20");
    // Then leak steadily, each step in a snapshot of its own (32 steps,
    // 250 ms apart: 8 s), and hold still.
    let mut leaked = 0;
    for _ in 0..32 {
        leaked += field(&fixture.cmd("leak 5"), "count");
        wait_for_leak_here(&address, leaked * LEAK_SIZE_BYTES);
    }
    let expected = (leaked * LEAK_SIZE_BYTES).to_string();

    let leak_bytes = r#"tracer_stack_live_bytes{job="tracer",site=~"leak_here.*"}"#;
    let leak_verdict = r#"tracer_stack_suspected_leak{job="tracer",site=~"leak_here.*"}"#;
    let deadline = Instant::now() + PROMETHEUS_TIMEOUT;
    let (bytes, verdict) = loop {
        let bytes = prometheus.query(leak_bytes);
        let verdict = prometheus.query(leak_verdict);
        let done =
            bytes.len() == 1 && bytes[0].1 == expected && verdict.len() == 1 && verdict[0].1 == "1";
        if done || Instant::now() > deadline {
            break (bytes, verdict);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("query {leak_bytes}: {bytes:?}\nquery {leak_verdict}: {verdict:?}");
    assert_eq!(
        bytes.len(),
        1,
        "one leak_here stack in Prometheus: {bytes:?}\n{}",
        prometheus.log()
    );
    assert_eq!(
        bytes[0].1, expected,
        "Prometheus holds leaky's {leaked} blocks of {LEAK_SIZE_BYTES} B: {bytes:?}"
    );
    assert_eq!(bytes[0].0["pid"], fixture.pid.to_string());
    assert_eq!(bytes[0].0["comm"], "leaky");
    assert_eq!(bytes[0].0["kind"], "heap");
    assert!(
        bytes[0].0["site"].starts_with("leak_here (leaky.c:"),
        "{bytes:?}"
    );
    assert_eq!(verdict.len(), 1);
    assert_eq!(verdict[0].1, "1", "the steady leak is suspected");
    assert_eq!(
        verdict[0].0["stack"], bytes[0].0["stack"],
        "on the same stack: {verdict:?}"
    );

    let churn_verdicts = prometheus.query(r#"tracer_stack_suspected_leak{site=~"churn.*"}"#);
    let churn_bytes = prometheus.query(r#"tracer_stack_live_bytes{site=~"churn.*"}"#);
    assert!(
        churn_verdicts
            .iter()
            .any(|(labels, _)| labels["site"].starts_with("churn_keep")),
        "churn_keep holds blocks and is listed: {churn_verdicts:?}"
    );
    for (labels, value) in &churn_verdicts {
        assert_eq!(value, "0", "a one-time churn step is no leak: {labels:?}");
    }
    let keep: i64 = churn_bytes
        .iter()
        .find(|(labels, _)| labels["site"].starts_with("churn_keep"))
        .map(|(_, value)| value.parse().expect("an integer"))
        .expect("churn_keep's live bytes");
    assert_eq!(
        keep,
        field(&churn, "churn_keep"),
        "churn_keep holds what leaky says"
    );
    let up = prometheus.query(r#"up{job="tracer"}"#);
    assert_eq!(up.len(), 1);
    assert_eq!(up[0].1, "1", "every scrape succeeded");
    trace.stop();
}

#[test]
fn go_pprof_names_the_leak_with_exact_bytes() {
    let (mut fixture, trace, address) = serve_leaky(&[], "200ms", &[]);
    let leaked = field(&fixture.cmd("leak 7"), "bytes");
    let directory = std::env::temp_dir().join(format!("tracer-test-pprof-{}", std::process::id()));
    std::fs::create_dir_all(&directory).expect("pprof directory");
    let url = format!("http://{address}/debug/pprof/heap");
    let deadline = Instant::now() + Duration::from_secs(20);
    let top = loop {
        let output = Command::new("go")
            .args(["tool", "pprof", "-top", "-unit=B", &url])
            .env("PPROF_TMPDIR", &directory)
            .env("HOME", &directory)
            .output()
            .expect("could not run go tool pprof: run `cargo xtask setup` (golang-go)");
        let top = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        let named = top.lines().any(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            words.first() == Some(&format!("{leaked}B").as_str())
                && words.last() == Some(&"leak_here")
        });
        if named || Instant::now() > deadline {
            break (named, top);
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    let _ = std::fs::remove_dir_all(&directory);
    eprintln!("{}", top.1);
    assert!(
        top.0,
        "go tool pprof -top shows leak_here holding {leaked}B flat:\n{}",
        top.1
    );
    assert!(top.1.contains("Type: inuse_space"), "{}", top.1);
    trace.stop();
}

#[test]
fn growth_profile_holds_what_grew_since_the_previous_fetch() {
    let (mut fixture, trace, address) = serve_leaky(&[], "100ms", &[]);
    // Each fetch once a snapshot holds the blocks leaked before it.
    let leaked_in_a_snapshot = |count: i64| wait_for_leak_here(&address, count * LEAK_SIZE_BYTES);
    fixture.cmd("leak 4");
    leaked_in_a_snapshot(4);
    let (status, first) = http_get(&address, "/debug/pprof/growth");
    assert_eq!(status, 200);
    fixture.cmd("leak 3");
    leaked_in_a_snapshot(7);
    let (status, second) = http_get(&address, "/debug/pprof/growth");
    assert_eq!(status, 200);
    assert_eq!(
        pprof_flat_bytes(&first, "leak_here"),
        Some(4 * LEAK_SIZE_BYTES),
        "the first fetch: growth since attach"
    );
    assert_eq!(
        pprof_flat_bytes(&second, "leak_here"),
        Some(3 * LEAK_SIZE_BYTES),
        "the second fetch: growth since the first"
    );
    // Another client's first fetch is its own (since attach), and leaves
    // this client's base where it was.
    fixture.cmd("leak 2");
    leaked_in_a_snapshot(9);
    let (status, other) = http_get_from(OTHER_CLIENT, &address, "/debug/pprof/growth");
    assert_eq!(status, 200);
    assert_eq!(
        pprof_flat_bytes(&other, "leak_here"),
        Some(9 * LEAK_SIZE_BYTES),
        "another client's first fetch: growth since attach"
    );
    let (status, third) = http_get(&address, "/debug/pprof/growth");
    assert_eq!(status, 200);
    assert_eq!(
        pprof_flat_bytes(&third, "leak_here"),
        Some(2 * LEAK_SIZE_BYTES),
        "the third fetch: growth since this client's second, not the other's"
    );
    assert_eq!(http_get(&address, "/debug/pprof/growth?seconds=0").0, 400);
    assert_eq!(http_get(&address, "/debug/pprof/growth?seconds=x").0, 400);
    assert_eq!(http_get(&address, "/healthz"), (200, b"ok\n".to_vec()));
    assert_eq!(http_get(&address, "/../../etc/passwd").0, 404);
    assert_eq!(http_get(&address, "/debug/pprof/").0, 404);
    trace.stop();
}

/// The inuse_space `function` holds itself (flat) in a profile, read
/// with `go tool pprof -top -unit=B`; `None` if it is not listed.
fn pprof_flat_bytes(profile: &[u8], function: &str) -> Option<i64> {
    let path = std::env::temp_dir().join(format!(
        "tracer-test-growth-{}-{}.pb.gz",
        std::process::id(),
        profile.len()
    ));
    std::fs::write(&path, profile).expect("write the profile");
    let output = Command::new("go")
        .args(["tool", "pprof", "-top", "-unit=B", "-nodecount=1000"])
        .arg(&path)
        .env("HOME", std::env::temp_dir())
        .output()
        .expect("go tool pprof");
    let _ = std::fs::remove_file(&path);
    let top = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "go tool pprof failed: {output:?}");
    top.lines().find_map(|line| {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.last() != Some(&function) {
            return None;
        }
        words.first()?.strip_suffix('B')?.parse().ok()
    })
}

#[test]
fn clients_that_never_read_do_not_stall_snapshots() {
    let (_fixture, trace, address) = serve_leaky(&["--auto"], "200ms", &["--duration", "11s"]);
    wait_for_samples(&address, "the auto leak in a snapshot", |samples| {
        !samples.is_empty()
    });
    // 20 connections that never send a request, and one that sends 500
    // requests for a profile and never reads an answer.
    let silent: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(&address).expect("connect"))
        .collect();
    let mut greedy = TcpStream::connect(&address).expect("connect");
    greedy
        .set_write_timeout(Some(Duration::from_secs(2)))
        .expect("write timeout");
    for _ in 0..500 {
        if greedy
            .write_all(b"GET /debug/pprof/heap HTTP/1.1\r\nHost: x\r\n\r\n")
            .is_err()
        {
            break;
        }
    }
    // The greedy client's requests are all sent, or the tracer stopped
    // reading them (the write timed out): either way the clients are stuck.
    // A scraper (another address than theirs) is answered beside them.
    let asked_at = Instant::now();
    let (status, metrics) = http_get_from(OTHER_CLIENT, &address, "/metrics");
    let answered_in = asked_at.elapsed();
    assert_eq!(status, 200);
    assert!(
        String::from_utf8_lossy(&metrics).contains("tracer_stack_live_bytes{"),
        "{}",
        String::from_utf8_lossy(&metrics)
    );
    // Stuck clients would hold the scrape until --duration ends (11 s).
    assert_took_under(
        "a new scrape beside the stuck clients",
        answered_in,
        Duration::from_secs(6),
        &"(/metrics)",
    );
    let traced = trace.wait_exit();
    drop((silent, greedy));
    let snapshots = traced.report.int("/snapshots");
    assert!(
        snapshots >= 52,
        "11 s every 200 ms is 55 snapshots; the stuck clients let {snapshots} happen"
    );
    let status_lines = traced
        .output
        .stderr
        .lines()
        .filter(|line| line.contains(" dropped") && line.starts_with("tracer: "))
        .count();
    assert!(
        status_lines >= 2,
        "the status line kept its pace (every 5 s):\n{}",
        traced.output
    );
}

#[test]
fn listen_addresses_that_cannot_work_fail_in_one_line() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("address").port().to_string();
    let pid = std::process::id().to_string();
    for (listen, code, message) in [
        (port.as_str(), 8, "cannot listen on 127.0.0.1:"),
        ("192.0.2.1:9464", 8, "cannot listen on 192.0.2.1:9464"),
        (":9464", 2, "has no address"),
        ("localhost", 2, "is not PORT, IP:PORT"),
        ("70000", 2, "is not PORT, IP:PORT"),
    ] {
        let output =
            Tracer::start(["record", "--pid", &pid, "--listen", listen]).wait_exit(EXIT_TIMEOUT);
        let line = assert_one_line_error(&output, code);
        assert!(line.contains(message), "--listen {listen}: {output}");
    }
}

/// The reachability of the one heap stack of `report` (JSON) whose site
/// is `function`.
fn reachability_at<'a>(report: &'a Value, function: &str) -> &'a Value {
    let stacks: Vec<&Value> = report["stacks"]
        .as_array()
        .expect("stacks in /holders")
        .iter()
        .filter(|stack| stack["kind"] == "heap" && stack["site"]["function"] == function)
        .collect();
    assert_eq!(stacks.len(), 1, "one {function} stack: {report}");
    &stacks[0]["reachability"]
}

/// GET /holders: the report it answers, as JSON.
fn get_holders(address: &str) -> Value {
    let (status, body) = http_get(address, "/holders");
    let body = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(status, 200, "/holders: {body}");
    serde_json::from_str(&body).unwrap_or_else(|error| panic!("/holders: {error}: {body}"))
}

/// GET /holders until it is not refused for the rate (429).
fn get_holders_when_allowed(address: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = http_get(address, "/holders");
        if status != 429 {
            let body = String::from_utf8_lossy(&body).into_owned();
            assert_eq!(status, 200, "/holders: {body}");
            return serde_json::from_str(&body)
                .unwrap_or_else(|error| panic!("/holders: {error}: {body}"));
        }
        assert!(Instant::now() < deadline, "/holders refused for a minute");
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn holders_are_served_on_request_by_record_holders() {
    require_root();
    let mut fixture = Fixture::start("holders", &[]);
    let mut trace = Record::pid(fixture.pid)
        .args(["--holders", "--listen", "0"])
        .attach();
    let address = listen_address(&mut trace.tracer);
    let first = fixture.cmd("cache 30");
    let report = get_holders(&address);
    let cached = reachability_at(&report, "cache_put");
    assert_eq!(
        cached["unreachable_bytes"].as_i64(),
        Some(field(&first, "lost_bytes")),
        "{cached}"
    );
    assert!(
        cached["held_by"]
            .as_array()
            .expect("held_by")
            .iter()
            .any(|holder| holder["name"] == "g_newest in holders"),
        "{cached}"
    );
    // A request right after is refused: one scan every 10 s.
    let (status, body) = http_get(&address, "/holders");
    assert_eq!(status, 429, "{}", String::from_utf8_lossy(&body));
    // The next scans again: the figures follow the target.
    let second = fixture.cmd("cache 20");
    let report = get_holders_when_allowed(&address);
    let cached = reachability_at(&report, "cache_put");
    assert_eq!(
        cached["unreachable_bytes"].as_i64(),
        Some(field(&second, "lost_bytes")),
        "{cached}"
    );
    let traced = trace.stop();
    assert!(
        traced.output.stderr.contains("scanned "),
        "the scan is named on stderr: {}",
        traced.output
    );
    assert_eq!(
        traced.report.json["holders_scans"].as_array().map(Vec::len),
        Some(1),
        "--holders: the final report has its own scan: {}",
        traced.report.json["holders_scans"]
    );
}

/// `tracer_window_seconds` of /metrics (0 before the first snapshot).
fn window_seconds(address: &str) -> f64 {
    let (status, body) = http_get(address, "/metrics");
    assert_eq!(status, 200);
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|line| line.strip_prefix("tracer_window_seconds "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn snapshots_go_on_while_holders_are_scanned() {
    require_root();
    let mut fixture = Fixture::start("holders", &[]);
    let mut trace = Record::pid(fixture.pid)
        .interval("200ms")
        .args(["--holders", "--listen", "0"])
        .attach();
    let address = listen_address(&mut trace.tracer);
    fixture.cmd("cache 3");
    // 1.5 GiB to scan, twice (the scan and its check): seconds.
    fixture.cmd("fill 1536");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut before = window_seconds(&address);
    while before == 0.0 {
        assert!(Instant::now() < deadline, "no snapshot");
        std::thread::sleep(Duration::from_millis(50));
        before = window_seconds(&address);
    }
    let scanned = {
        let address = address.clone();
        std::thread::spawn(move || get_holders(&address))
    };
    // Snapshots go on while the scan runs (the collection does not wait
    // for it): the window grows by a second before the answer comes.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut grew_while_scanning = false;
    while !scanned.is_finished() && Instant::now() < deadline {
        if window_seconds(&address) >= before + 1.0 {
            grew_while_scanning = !scanned.is_finished();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let report = scanned.join().expect("the /holders request");
    let seconds = report["holders_scans"][0]["seconds"]
        .as_f64()
        .unwrap_or(0.0);
    assert!(
        grew_while_scanning,
        "no snapshot while /holders scanned for {seconds:.1} s"
    );
    trace.stop();
    fixture.cmd("quit");
}

#[test]
fn holders_are_not_served_without_holders() {
    require_root();
    let mut fixture = Fixture::start("holders", &[]);
    let mut trace = Record::pid(fixture.pid).args(["--listen", "0"]).attach();
    let address = listen_address(&mut trace.tracer);
    fixture.cmd("cache 3");
    let (status, body) = http_get(&address, "/holders");
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&body));
    let traced = trace.stop();
    assert!(
        !traced.output.stderr.contains("scanned "),
        "{}",
        traced.output
    );

    let pid = fixture.pid.to_string();
    let mut tracer = Tracer::start(["top", "--pid", &pid, "--interval", "200ms", "--listen", "0"]);
    let address = listen_address(&mut tracer);
    tracer.wait_attached(ATTACH_TIMEOUT);
    assert_eq!(http_get(&address, "/holders").0, 404);
    tracer.stop().assert_success();
}

#[test]
fn a_client_holds_at_most_its_share_of_connections() {
    let (_fixture, trace, address) = serve_leaky(&[], "200ms", &[]);
    // 16 connections from 127.0.0.1 that send nothing: its share.
    let held: Vec<TcpStream> = (0..16)
        .map(|_| TcpStream::connect(&address).expect("connect"))
        .collect();
    // Its next is closed unanswered (accepted after the 16, in order).
    let mut over = TcpStream::connect(&address).expect("connect");
    over.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    let _ = over.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut answer = Vec::new();
    let _ = std::io::Read::read_to_end(&mut over, &mut answer);
    assert!(
        answer.is_empty(),
        "a 17th connection was served: {}",
        String::from_utf8_lossy(&answer)
    );
    // Another client is served meanwhile.
    assert_eq!(
        http_get_from(OTHER_CLIENT, &address, "/healthz"),
        (200, b"ok\n".to_vec())
    );
    drop(held);
    trace.stop();
}
