//! A real `redis-server` for the tests of the `redis` feature: started on a free port of
//! 127.0.0.1 in a directory of its own, killed and removed when dropped. Std only, so a test
//! file includes it with `#[path = "common/redis_server.rs"] mod redis_server;`.
//!
//! Where `redis-server` is not on `PATH`, [`RedisServer::start`] returns `None` and the test
//! skips, unless `CI` is `true` or `1`: CI must run these tests (`.ci/run` installs the
//! server), so there it panics.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// How long a start waits for the server to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How many ports a start tries before it gives up.
const ATTEMPTS: usize = 5;
/// How long [`RedisServer::command`] waits for a reply: long enough for a `DEBUG SLEEP`.
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);
/// The file in the server's directory that takes its stdout and stderr: its log, and the
/// errors it prints before the log is set up (a bad argument).
const LOG: &str = "redis.log";

/// Numbers the directories of one test process.
static NEXT_DIR: AtomicU32 = AtomicU32::new(0);

/// A `redis-server` child process, its directory and its port.
///
/// Dropping it kills the server with `SIGKILL` and removes the directory.
#[allow(dead_code)]
#[derive(Debug)]
pub struct RedisServer {
    /// The server binary, as found on `PATH`.
    exe: PathBuf,
    /// The running server; `None` after [`kill`](Self::kill).
    child: Option<Child>,
    /// The id of the last server started.
    pid: u32,
    port: u16,
    dir: PathBuf,
    /// Every argument after `redis-server`, the port's included: a restart reuses them.
    args: Vec<String>,
}

#[allow(dead_code)]
impl RedisServer {
    /// Starts `redis-server` on 127.0.0.1, on a free port, with a fresh directory, no
    /// snapshots and no append-only file; waits until it answers `PING` (10 s at most).
    ///
    /// Returns `None`, after one line on stderr, where `redis-server` is not on `PATH`,
    /// unless `CI` is `true` or `1`.
    ///
    /// # Panics
    ///
    /// If `redis-server` is missing under CI, or does not come up: the message ends with the
    /// tail of its log.
    #[track_caller]
    pub fn start() -> Option<RedisServer> {
        RedisServer::start_with(&[])
    }

    /// Like [`start`](Self::start), with `args` appended to the server's arguments, so they
    /// override the defaults: `&["--appendonly", "yes", "--appendfsync", "always"]`.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    #[track_caller]
    pub fn start_with(args: &[&str]) -> Option<RedisServer> {
        let exe = find_redis_server()?;
        let dir = std::env::temp_dir().join(format!(
            "kb-redis-{}-{}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::Relaxed)
        ));
        // A directory left by an earlier process with the same id holds nothing of ours.
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));

        let mut server = RedisServer {
            exe,
            child: None,
            pid: 0,
            port: 0,
            dir,
            args: Vec::new(),
        };
        let mut failures = Vec::new();
        for _ in 0..ATTEMPTS {
            // Between the listener's drop and the server's bind another process may take
            // the port; the server then exits (or another server answers), and we try again.
            server.port = free_port();
            server.args = server_args(&server.exe, server.port, &server.dir, args);
            let _ = fs::remove_file(server.dir.join(LOG));
            match server.spawn() {
                Ok(()) => return Some(server),
                Err(Failure::Exited(why)) => failures.push(format!("port {}: {why}", server.port)),
                Err(Failure::TimedOut) => panic!(
                    "redis-server on port {} did not answer PING within {READY_TIMEOUT:?}; \
                     log tail:\n{}",
                    server.port,
                    server.log_tail()
                ),
            }
        }
        panic!(
            "redis-server did not come up in {ATTEMPTS} attempts ({}); last log tail:\n{}",
            failures.join("; "),
            server.log_tail()
        );
    }

    /// The URL a client connects with: `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The port the server listens on; a restart keeps it.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's working directory (its append-only files, its log); a restart keeps it.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The process id of the server last started (after [`kill`](Self::kill), of the one
    /// killed).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Kills the server with `SIGKILL`, so it shuts down nothing cleanly, and waits for it
    /// to exit. Does nothing if it is not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // `Child::kill` sends SIGKILL on Unix. It fails only if the child was already
            // reaped, which `wait` then reports harmlessly.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, in the same directory, with the same
    /// arguments, so it reloads what it wrote there (an append-only file); waits until it
    /// answers `PING`. A server still running is killed first, with `SIGKILL`.
    ///
    /// # Panics
    ///
    /// If the server does not come up: the message ends with the tail of its log.
    #[track_caller]
    pub fn restart(&mut self) {
        self.kill();
        match self.spawn() {
            Ok(()) => {}
            Err(Failure::Exited(why)) => panic!(
                "redis-server did not restart on port {}: {why}; log tail:\n{}",
                self.port,
                self.log_tail()
            ),
            Err(Failure::TimedOut) => panic!(
                "restarted redis-server on port {} did not answer PING within \
                 {READY_TIMEOUT:?}; log tail:\n{}",
                self.port,
                self.log_tail()
            ),
        }
    }

    /// Sends one command, as a RESP array of bulk strings, over a new connection, and
    /// returns the reply as the server wrote it: `+PONG\r\n`, `$3\r\nbar\r\n`, `:1\r\n`,
    /// `-ERR ...\r\n`, or an array of these.
    ///
    /// # Panics
    ///
    /// If the server cannot be reached or the reply does not arrive within 60 s.
    #[track_caller]
    pub fn command(&self, args: &[&str]) -> String {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("cannot connect to redis-server at {addr}: {e}"));
        send_command(stream, args, REPLY_TIMEOUT)
            .unwrap_or_else(|e| panic!("{args:?} to redis-server at {addr}: {e}"))
    }

    /// Starts the server with `self.args` and waits until it answers `PING` as itself.
    fn spawn(&mut self) -> Result<(), Failure> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join(LOG))
            .unwrap_or_else(|e| panic!("cannot open {LOG} in {}: {e}", self.dir.display()));
        let stderr = log.try_clone().expect("cannot clone the log's handle");
        let child = Command::new(&self.exe)
            .args(&self.args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.exe.display()));
        self.pid = child.id();
        self.child = Some(child);

        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(Failure::Exited(format!("exited early, {status}")));
            }
            if ping(self.port) {
                // Another server that took the port would answer too: check it is ours.
                let info = self.command(&["INFO", "server"]);
                if info.contains(&format!("process_id:{}\r\n", self.pid)) {
                    return Ok(());
                }
                self.kill();
                return Err(Failure::Exited("another server answers on its port".into()));
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(Failure::TimedOut);
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// The last lines of the server's log, for a panic message.
    fn log_tail(&self) -> String {
        let path = self.dir.join(LOG);
        match fs::read_to_string(&path) {
            Ok(text) => {
                let lines: Vec<&str> = text.lines().collect();
                lines[lines.len().saturating_sub(20)..].join("\n")
            }
            Err(e) => format!("(cannot read {}: {e})", path.display()),
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Why a start failed.
enum Failure {
    /// The server exited, or is not the one answering: a new port may help.
    Exited(String),
    /// It runs but did not answer in time: another port would not help.
    TimedOut,
}

/// `redis-server` from `PATH`; `None`, after a line on stderr, if it is missing there.
///
/// # Panics
///
/// If it is missing and `CI` is `true` or `1`.
#[track_caller]
fn find_redis_server() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("redis-server"))
            .find(|path| is_executable(path))
    });
    if found.is_none() {
        let ci = std::env::var("CI").unwrap_or_default();
        if ci == "true" || ci == "1" {
            panic!(
                "redis-server is not on PATH, and CI={ci}: CI must have redis-server \
                 (.ci/run installs it) so that the redis tests run rather than skip"
            );
        }
        // Straight to stderr, not `eprintln!`: the test harness captures that, and a skip
        // should be seen.
        let _ = writeln!(
            std::io::stderr(),
            "skipping: redis-server is not on PATH (apt-get install redis-server)"
        );
    }
    found
}

#[cfg(unix)]
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(not(unix))]
fn is_executable(path: &Path) -> bool {
    path.is_file()
}

/// The server's arguments: the defaults, then `extra`, which may override them.
fn server_args(exe: &Path, port: u16, dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--bind",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--dir",
        &dir.to_string_lossy(),
        // The log goes to stdout, which `spawn` sends to `LOG` in the directory.
        "--logfile",
        "",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Redis 7 refuses DEBUG unless this allows it, and Redis 6 refuses the option itself.
    if major_version(exe) >= Some(7) {
        args.extend(["--enable-debug-command".into(), "local".into()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// The major version `redis-server --version` reports (`... v=7.0.15 ...`).
fn major_version(exe: &Path) -> Option<u32> {
    let out = Command::new(exe).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text.split_whitespace().find_map(|w| w.strip_prefix("v="))?;
    version.split('.').next()?.parse().ok()
}

/// A port on 127.0.0.1 that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .expect("cannot bind 127.0.0.1:0 to find a free port")
        .port()
}

/// Whether a server answers an inline `PING` on `port` with `+PONG`. A server still
/// loading its data answers `-LOADING`, which is not yet ready.
fn ping(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).is_ok() && line.starts_with("+PONG")
}

/// Writes `args` as a RESP array of bulk strings and reads one whole reply.
fn send_command(
    mut stream: TcpStream,
    args: &[&str],
    timeout: Duration,
) -> std::io::Result<String> {
    stream.set_read_timeout(Some(timeout))?;
    let mut request = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        request.extend_from_slice(arg.as_bytes());
        request.extend_from_slice(b"\r\n");
    }
    stream.write_all(&request)?;
    let mut reader = BufReader::new(stream);
    let mut reply = Vec::new();
    read_reply(&mut reader, &mut reply)?;
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

/// Appends one RESP reply, as read, to `out`: a simple string, error, integer, bulk string
/// or array (of any of these).
fn read_reply(reader: &mut impl BufRead, out: &mut Vec<u8>) -> std::io::Result<()> {
    let start = out.len();
    if reader.read_until(b'\n', out)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let header = String::from_utf8_lossy(&out[start..])
        .trim_end()
        .to_string();
    let count = |rest: &str| {
        rest.parse::<i64>().map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("bad reply header {header:?}"),
            )
        })
    };
    match header.as_bytes().first() {
        Some(b'+' | b'-' | b':') => Ok(()),
        Some(b'$') => {
            // A bulk string: its bytes, then CRLF; `$-1` is nil and has none.
            let len = count(&header[1..])?;
            if len >= 0 {
                let mut body = vec![0; len as usize + 2];
                reader.read_exact(&mut body)?;
                out.extend_from_slice(&body);
            }
            Ok(())
        }
        Some(b'*') => {
            for _ in 0..count(&header[1..])?.max(0) {
                read_reply(reader, out)?;
            }
            Ok(())
        }
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("unknown reply {header:?}"),
        )),
    }
}
