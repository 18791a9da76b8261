//! `--listen ADDR`: a read-only HTTP server for the systems that gather
//! from many hosts, Prometheus (`/metrics`) and the continuous profilers
//! that scrape pprof endpoints (`/debug/pprof/heap`, `/debug/pprof/growth`),
//! plus `/healthz`, and, for `record --holders` only, `/holders` on
//! request: the report as JSON with each listed stack's reachability (the
//! live blocks read by the collection loop at its next snapshot, the scan
//! made off the loop on a thread of its own, at most one every
//! MIN_HOLDERS_INTERVAL).
//!
//! Anyone who can reach the address is a client: each has its own base
//! for `/debug/pprof/growth` (no client resets another's) and at most
//! MAX_CONNECTIONS_PER_CLIENT connections at once.
//!
//! The server runs on a thread and a tokio runtime of its own. The
//! collection loop publishes a `View` of each snapshot into a watch
//! channel and never waits on the server: a slow or stuck client holds only
//! its own connection. No request reaches the file system; every response
//! is built from the latest view, bounded by `--top`.
mod view;

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{Semaphore, oneshot, watch};

use crate::{
    error::{ExitCode, fatal},
    session::{self, Live},
};
pub use view::{StackView, TargetView, View, site_label, stack_hash};

/// Connections served at once (a few KiB each); more wait in the kernel's
/// backlog. Clients that connect and send nothing are closed after
/// `HEADER_TIMEOUT`, so it takes this many at once to delay a scrape.
const MAX_CONNECTIONS: usize = 256;
/// Connections one client address may hold at once; more are closed
/// as they come.
const MAX_CONNECTIONS_PER_CLIENT: usize = 16;
/// Client addresses whose growth base is kept; past it, the oldest is
/// forgotten (its next fetch is since attach).
const MAX_GROWTH_CLIENTS: usize = 64;
/// The shortest time between two `/holders` scans: each reads all of the
/// targets' memory.
const MIN_HOLDERS_INTERVAL: Duration = Duration::from_secs(10);
/// How long a client may take to send its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one connection may stay open beyond a growth profile's
/// `seconds`, whatever the client does.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest `?seconds=N` of `/debug/pprof/growth`.
const MAX_GROWTH_SECONDS: u64 = 300;
/// Views are published at most this often (each builds a report).
const PUBLISH_EVERY: Duration = Duration::from_millis(500);
/// How long `/holders` waits for its scan (the next snapshot, then the
/// scan: about 3 s per GiB of target memory).
const HOLDERS_TIMEOUT: Duration = Duration::from_secs(120);

/// A `/holders` request waiting for the collection loop: the report JSON
/// goes back through it.
type HoldersRequest = oneshot::Sender<String>;

/// The server `--listen` asks for, started and announced on stderr;
/// `/holders` served where `holders` (`record --holders`).
pub fn start_if_asked(listen: Option<SocketAddr>, holders: bool) -> Result<Option<Server>> {
    let Some(address) = listen else {
        return Ok(None);
    };
    let server = Server::start(address, holders)?;
    eprintln!(
        "tracer: serving /metrics, /debug/pprof/heap, /debug/pprof/growth{} on http://{}",
        if holders { ", /holders" } else { "" },
        server.address()
    );
    Ok(Some(server))
}

/// The server, bound: publishes views to its thread.
pub struct Server {
    address: SocketAddr,
    views: watch::Sender<Arc<View>>,
    published_at: Option<Instant>,
    /// `comm` of each PID seen, read once.
    comms: HashMap<u32, String>,
    /// `/holders` requests, at most one waiting, and the one taken at the
    /// last snapshot.
    holders_requests: std::sync::mpsc::Receiver<HoldersRequest>,
    holders_waiting: Option<HoldersRequest>,
}

impl Server {
    /// Binds `address` (before attaching, so a taken port fails fast with
    /// exit code 8) and starts serving on a thread of its own; `/holders`
    /// only where `holders`.
    pub fn start(address: SocketAddr, holders: bool) -> Result<Server> {
        let listener = std::net::TcpListener::bind(address).map_err(|error| {
            fatal(
                ExitCode::Output,
                format!("cannot listen on {address} (--listen): {error}"),
            )
        })?;
        let address = listener.local_addr().unwrap_or(address);
        listener
            .set_nonblocking(true)
            .context("could not set up the --listen socket")?;
        let (views, receiver) = watch::channel(Arc::new(View::default()));
        let (holders_sender, holders_requests) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("tracer-listen".to_owned())
            .spawn(move || serve(listener, receiver, holders.then_some(holders_sender)))
            .context("could not start the --listen thread")?;
        Ok(Server {
            address,
            views,
            published_at: None,
            comms: HashMap::new(),
            holders_requests,
            holders_waiting: None,
        })
    }

    /// Where it listens (the port chosen when 0 was asked for).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Publishes a view of `model`'s latest snapshot, at most every
    /// `PUBLISH_EVERY` unless `now` (the last snapshot).
    pub fn publish(&mut self, live: &mut Live<'_>, now: bool) {
        if !now
            && self
                .published_at
                .is_some_and(|at| at.elapsed() < PUBLISH_EVERY)
        {
            return;
        }
        self.published_at = Some(Instant::now());
        let report = live.report();
        let targets = live.targets();
        self.comms
            .retain(|pid, _| targets.iter().any(|target| target.pid == *pid));
        for target in &targets {
            self.comms
                .entry(target.pid)
                .or_insert_with(|| comm_of(target.pid, &target.command));
        }
        let comms = &self.comms;
        let view = View::build(live.model(), report, &|pid| {
            comms.get(&pid).cloned().unwrap_or_default()
        });
        self.views.send_replace(Arc::new(view));
    }

    /// Answers a waiting `/holders` request, if any: the report of
    /// `model` with the holders of its listed stacks. The collection reads
    /// the live blocks and the stacks' labels; the scan runs on a thread
    /// of its own (the collection goes on; the target is not stopped).
    pub fn answer_holders(&mut self, live: &mut Live<'_>) {
        // A request is answered at the snapshot after the one it came
        // with, so that the stacks are those of a snapshot taken after it.
        let waiting = std::mem::replace(
            &mut self.holders_waiting,
            self.holders_requests.try_recv().ok(),
        );
        let Some(request) = waiting else {
            return;
        };
        let mut report = live.report();
        let pending = live.prepare_holders(&mut report);
        // Not started: the request is dropped, the client told 503.
        let _ = std::thread::Builder::new()
            .name("tracer-holders".to_owned())
            .spawn(move || {
                session::finish_holders(&mut report, pending);
                // The client may have gone meanwhile: nothing to answer then.
                let _ = request.send(crate::output::json::to_json(&report));
            });
    }
}

/// The kernel's command name of `pid` (`/proc/PID/comm`), else the first
/// word of its command line.
fn comm_of(pid: u32, command: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|comm| comm.trim_end().to_owned())
        .unwrap_or_else(|_| {
            let first = command.split_whitespace().next().unwrap_or("");
            first.rsplit('/').next().unwrap_or(first).to_owned()
        })
}

/// The server thread: accepts connections until the process exits.
fn serve(
    listener: std::net::TcpListener,
    views: watch::Receiver<Arc<View>>,
    holders: Option<std::sync::mpsc::SyncSender<HoldersRequest>>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("tracer: --listen: could not start the server: {error}");
            return;
        }
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(error) => {
                eprintln!("tracer: --listen: could not start the server: {error}");
                return;
            }
        };
        let state = Arc::new(State {
            views,
            growth_bases: Mutex::new(HashMap::new()),
            holders,
            holders_at: Mutex::new(None),
            connections: Mutex::new(HashMap::new()),
        });
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        loop {
            let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
                return;
            };
            let Ok((stream, peer)) = listener.accept().await else {
                continue;
            };
            let client = peer.ip();
            let Some(counted) = Connection::count(&state, client) else {
                // Over its share: closed now, the slot free again.
                drop(stream);
                continue;
            };
            let state = Arc::clone(&state);
            tokio::spawn(async move {
                let _counted = counted;
                let service = service_fn(move |request| {
                    let state = Arc::clone(&state);
                    async move {
                        Ok::<_, std::convert::Infallible>(respond(&state, client, request).await)
                    }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service);
                let limit = CONNECTION_TIMEOUT + Duration::from_secs(MAX_GROWTH_SECONDS);
                let _ = tokio::time::timeout(limit, connection).await;
                drop(permit);
            });
        }
    });
}

/// What the handlers share.
struct State {
    views: watch::Receiver<Arc<View>>,
    /// Each client's view of its previous `/debug/pprof/growth` fetch, and
    /// when it fetched.
    growth_bases: Mutex<HashMap<IpAddr, (Instant, Arc<View>)>>,
    /// Where `/holders` requests go to the collection loop (`--holders`
    /// only), and when the last was taken.
    holders: Option<std::sync::mpsc::SyncSender<HoldersRequest>>,
    holders_at: Mutex<Option<Instant>>,
    /// Connections open per client.
    connections: Mutex<HashMap<IpAddr, usize>>,
}

impl State {
    fn view(&self) -> Arc<View> {
        Arc::clone(&self.views.borrow())
    }

    /// `client`'s growth base, replaced by `now`.
    fn replace_growth_base(&self, client: IpAddr, now: &Arc<View>) -> Arc<View> {
        let mut bases = self.growth_bases.lock().expect("growth bases lock");
        if !bases.contains_key(&client)
            && bases.len() >= MAX_GROWTH_CLIENTS
            && let Some(oldest) = bases
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(client, _)| *client)
        {
            bases.remove(&oldest);
        }
        bases
            .insert(client, (Instant::now(), Arc::clone(now)))
            .map(|(_, base)| base)
            .unwrap_or_default()
    }
}

/// One open connection of a client, counted while it lives.
struct Connection {
    state: Arc<State>,
    client: IpAddr,
}

impl Connection {
    /// Counts a connection of `client`; None past its share.
    fn count(state: &Arc<State>, client: IpAddr) -> Option<Connection> {
        let mut connections = state.connections.lock().expect("connections lock");
        let open = connections.entry(client).or_default();
        if *open >= MAX_CONNECTIONS_PER_CLIENT {
            return None;
        }
        *open += 1;
        Some(Connection {
            state: Arc::clone(state),
            client,
        })
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let mut connections = self.state.connections.lock().expect("connections lock");
        if let Some(open) = connections.get_mut(&self.client) {
            *open -= 1;
            if *open == 0 {
                connections.remove(&self.client);
            }
        }
    }
}

type Body = Full<Bytes>;

async fn respond(state: &State, client: IpAddr, request: Request<Incoming>) -> Response<Body> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "read-only: GET only\n");
    }
    let query = request.uri().query().unwrap_or("");
    match request.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/metrics" => Response::builder()
            .header(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )
            .body(Full::new(Bytes::from(state.view().metrics())))
            .expect("a valid response"),
        "/debug/pprof/heap" => profile(state.view().heap_profile(), "heap"),
        "/debug/pprof/growth" => growth(state, client, query).await,
        "/holders" => holders(state).await,
        "/" => text(
            StatusCode::OK,
            if state.holders.is_some() {
                "tracer: /metrics /debug/pprof/heap /debug/pprof/growth[?seconds=N] /holders /healthz\n"
            } else {
                "tracer: /metrics /debug/pprof/heap /debug/pprof/growth[?seconds=N] /healthz\n"
            },
        ),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// `/debug/pprof/growth`: what grew since this client's previous fetch
/// (since attach for its first), or over the next `?seconds=N`.
async fn growth(state: &State, client: IpAddr, query: &str) -> Response<Body> {
    let seconds = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("seconds="));
    let (base, now) = match seconds {
        Some(seconds) => {
            let Some(seconds) = seconds
                .parse::<u64>()
                .ok()
                .filter(|seconds| (1..=MAX_GROWTH_SECONDS).contains(seconds))
            else {
                return text(
                    StatusCode::BAD_REQUEST,
                    &format!("seconds must be 1..={MAX_GROWTH_SECONDS}\n"),
                );
            };
            let base = state.view();
            tokio::time::sleep(Duration::from_secs(seconds)).await;
            (base, state.view())
        }
        None => {
            let now = state.view();
            let base = state.replace_growth_base(client, &now);
            (base, now)
        }
    };
    profile(now.growth_profile(&base), "growth")
}

/// `/holders`: the report as JSON, each listed stack with its
/// reachability, from a scan the collection loop makes for this request.
async fn holders(state: &State) -> Response<Body> {
    let Some(requests) = &state.holders else {
        return text(
            StatusCode::NOT_FOUND,
            "/holders is served by `tracer record --holders` only\n",
        );
    };
    {
        let mut last = state.holders_at.lock().expect("holders lock");
        if let Some(wait) = last
            .map(|at| MIN_HOLDERS_INTERVAL.saturating_sub(at.elapsed()))
            .filter(|wait| !wait.is_zero())
        {
            return Response::builder()
                .status(StatusCode::TOO_MANY_REQUESTS)
                .header(header::RETRY_AFTER, wait.as_secs().max(1).to_string())
                .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
                .body(Full::new(Bytes::from(format!(
                    "one holders scan every {} s: try again in {} s\n",
                    MIN_HOLDERS_INTERVAL.as_secs(),
                    wait.as_secs().max(1)
                ))))
                .expect("a valid response");
        }
        *last = Some(Instant::now());
    }
    let (answer, answered) = oneshot::channel();
    if requests.try_send(answer).is_err() {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "a holders scan is already waiting: try again after it\n",
        );
    }
    match tokio::time::timeout(HOLDERS_TIMEOUT, answered).await {
        Ok(Ok(json)) => Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(json)))
            .expect("a valid response"),
        _ => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "no holders scan came back (tracer stopping, or the scan took too long)\n",
        ),
    }
}

fn profile(bytes: Option<Vec<u8>>, name: &str) -> Response<Body> {
    match bytes {
        Some(bytes) => Response::builder()
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .header(
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}.pb.gz\""),
            )
            .body(Full::new(Bytes::from(bytes)))
            .expect("a valid response"),
        None => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "no snapshot yet: try again after the first interval\n",
        ),
    }
}

fn text(status: StatusCode, body: &str) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("a valid response")
}
