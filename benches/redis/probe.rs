//! The server the figures run against, and what a run cost it and us: CPU time on each
//! side of the socket, and the server's own count of commands (`INFO commandstats`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;

/// The server, and names for what each run puts in it.
pub(crate) struct Server {
    pub(crate) url: String,
    /// Whether it is ours (started for this run) rather than one `--url` named.
    pub(crate) own: bool,
    client: redis::Client,
    next: AtomicU32,
}

impl Server {
    pub(crate) fn new(url: String, own: bool) -> Server {
        let client = redis::Client::open(url.as_str()).expect("a Redis URL");
        Server {
            url,
            own,
            client,
            next: AtomicU32::new(0),
        }
    }

    /// A name no other run uses: `kb-bench-PID-N-what`. Everything a run puts in Redis is
    /// under the hash tag `{name}`, so [`clean`](Self::clean) finds it.
    pub(crate) fn name(&self, what: &str) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("kb-bench-{}-{n}-{what}", std::process::id())
    }

    /// A connection of the `redis` crate, pipelining the commands of concurrent tasks, with
    /// the library's response timeout (10 s) rather than the crate's 500 ms.
    pub(crate) async fn conn(&self) -> MultiplexedConnection {
        self.connect(Some(Duration::from_secs(10))).await
    }

    /// A connection for blocking commands: no response timeout.
    pub(crate) async fn blocking_conn(&self) -> MultiplexedConnection {
        self.connect(None).await
    }

    async fn connect(&self, response_timeout: Option<Duration>) -> MultiplexedConnection {
        let config = AsyncConnectionConfig::new().set_response_timeout(response_timeout);
        self.client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .expect("a connection to Redis")
    }

    /// Removes every key under the hash tag `{name}`, with `DEL` rather than `UNLINK`, so
    /// that the memory is free when this returns.
    pub(crate) async fn clean(conn: &mut MultiplexedConnection, name: &str) {
        // `{` and `}` are not special in a `SCAN` pattern; `*`, `?`, `[` and `\` are, and
        // our names have none.
        let pattern = format!("{{{name}}}*");
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(conn)
                .await
                .expect("SCAN");
            if !keys.is_empty() {
                let _: i64 = redis::cmd("DEL")
                    .arg(keys)
                    .query_async(conn)
                    .await
                    .expect("DEL");
            }
            if next == 0 {
                return;
            }
            cursor = next;
        }
    }
}

/// The fields of one `INFO` section.
pub(crate) async fn info(
    conn: &mut MultiplexedConnection,
    section: &str,
) -> HashMap<String, String> {
    let text: String = redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .expect("INFO");
    text.lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

/// A field of an `INFO` section, parsed.
pub(crate) fn field<T: std::str::FromStr>(info: &HashMap<String, String>, name: &str) -> T {
    info.get(name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("INFO has no {name}"))
}

/// CPU time of every thread of this process so far: the client's side, since the server is
/// another process.
fn client_cpu() -> f64 {
    crate::common::cpu_secs()
}

/// CPU time on both sides, and the server's command counts, at one moment.
pub(crate) struct Snap {
    client_cpu: f64,
    server_cpu: f64,
    /// Command name to (calls, µs), as `INFO commandstats` has them: a command a script
    /// runs counts too, under its own name.
    commands: HashMap<String, (u64, u64)>,
}

impl Snap {
    pub(crate) async fn take(conn: &mut MultiplexedConnection) -> Snap {
        let client_cpu = client_cpu();
        let cpu = info(conn, "cpu").await;
        let server_cpu = field::<f64>(&cpu, "used_cpu_user") + field::<f64>(&cpu, "used_cpu_sys");
        let commands = info(conn, "commandstats")
            .await
            .into_iter()
            .filter_map(|(k, v)| {
                let name = k.strip_prefix("cmdstat_")?.to_string();
                let mut calls = 0;
                let mut usec = 0;
                for part in v.split(',') {
                    match part.split_once('=') {
                        Some(("calls", n)) => calls = n.parse().ok()?,
                        Some(("usec", n)) => usec = n.parse().ok()?,
                        _ => {}
                    }
                }
                Some((name, (calls, usec)))
            })
            .collect();
        Snap {
            client_cpu,
            server_cpu,
            commands,
        }
    }

    /// What happened between `earlier` and this.
    pub(crate) fn since(&self, earlier: &Snap) -> Usage {
        let commands = self
            .commands
            .iter()
            .map(|(name, &(calls, usec))| {
                let (c0, u0) = earlier.commands.get(name).copied().unwrap_or((0, 0));
                (name.clone(), (calls - c0, usec - u0))
            })
            .filter(|(_, (calls, _))| *calls > 0)
            .collect();
        Usage {
            client_cpu: self.client_cpu - earlier.client_cpu,
            server_cpu: self.server_cpu - earlier.server_cpu,
            commands,
        }
    }
}

/// What one run cost: CPU seconds on each side, and the server's commands.
#[derive(Clone, Default)]
pub(crate) struct Usage {
    pub(crate) client_cpu: f64,
    pub(crate) server_cpu: f64,
    pub(crate) commands: HashMap<String, (u64, u64)>,
}

impl Usage {
    /// Calls of `command` (lower case, as `INFO commandstats` names it).
    pub(crate) fn calls(&self, command: &str) -> u64 {
        self.commands.get(command).map_or(0, |c| c.0)
    }

    /// µs the server spent in `command`; a script's time includes the commands it ran.
    pub(crate) fn usec(&self, command: &str) -> u64 {
        self.commands.get(command).map_or(0, |c| c.1)
    }

    /// Every command, most time first, as JSON.
    pub(crate) fn json(&self) -> serde_json::Value {
        let mut commands: Vec<_> = self.commands.iter().collect();
        commands.sort_by_key(|(_, (_, usec))| std::cmp::Reverse(*usec));
        serde_json::json!({
            "client_cpu_s": self.client_cpu,
            "server_cpu_s": self.server_cpu,
            "commands": commands
                .iter()
                .map(|(name, (calls, usec))| serde_json::json!({
                    "command": name, "calls": calls, "usec": usec,
                }))
                .collect::<Vec<_>>(),
        })
    }
}
