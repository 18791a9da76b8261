//! Debian's redis-server as a real target: started on a free loopback
//! port, spoken to in its protocol (RESP), pipelined as a busy client does.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Debian's redis-server on a free loopback port, without persistence;
/// killed when dropped.
pub struct RedisServer {
    pub child: Child,
    pub port: u16,
    /// redis' own log, printed when the test fails (a crash report, a
    /// closed client).
    log: std::path::PathBuf,
}

impl RedisServer {
    pub fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free loopback port")
            .port();
        let log = super::json_path(&format!("redis-{port}")).with_extension("log");
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--logfile")
            .arg(&log)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server is installed by `cargo xtask setup`");
        let server = Self { child, port, log };
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.connect().is_err() {
            assert!(Instant::now() < deadline, "redis-server did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    pub fn connect(&self) -> std::io::Result<TcpStream> {
        let stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(stream)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let status = self.child.try_wait();
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("redis-server (exit: {status:?}) logged:\n{log}");
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// One command in the redis protocol (RESP).
pub fn resp(args: &[&str]) -> Vec<u8> {
    let mut command = format!("*{}\r\n", args.len());
    for arg in args {
        command.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    command.into_bytes()
}

/// Sends `commands` at once and reads until `replies` replies ending in
/// `\r\n` have come back; returns the replies' text.
pub fn pipeline(stream: &mut TcpStream, commands: &[u8], replies: usize) -> String {
    stream
        .write_all(commands)
        .expect("redis takes the commands");
    let mut text = Vec::new();
    let mut chunk = [0u8; 65536];
    while text.windows(2).filter(|pair| pair == b"\r\n").count() < replies {
        let read = stream.read(&mut chunk).expect("redis answers");
        assert!(read > 0, "redis closed the connection");
        text.extend_from_slice(&chunk[..read]);
    }
    String::from_utf8(text).expect("redis answers in text")
}

/// SETs `key:000000 .. key:{keys - 1}` to distinct values in pipelined
/// batches of `batch`, as a busy client would, checking every reply.
pub fn set_keys(stream: &mut TcpStream, keys: usize, batch: usize) {
    for batch in (0..keys).collect::<Vec<_>>().chunks(batch) {
        let sets: Vec<u8> = batch
            .iter()
            .flat_map(|key| resp(&["SET", &format!("key:{key:06}"), &format!("value:{key:010}")]))
            .collect();
        let replies = pipeline(stream, &sets, batch.len());
        assert_eq!(replies, "+OK\r\n".repeat(batch.len()));
    }
}
