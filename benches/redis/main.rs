//! The Redis flavour: publish and pull rates, lateness past due, and memory per pending key,
//! each against plain Redis LISTs driven by the `redis` crate in the same run.
//!
//! ```text
//! cargo bench --bench redis --features redis -- --quick   # under 30 s
//! cargo bench --bench redis --features redis              # the full figures, under 2 min
//! cargo bench --bench redis --features redis -- --url redis://127.0.0.1:6379/
//! ```
//!
//! The bench starts a `redis-server` of its own (from `PATH`, with the tests' harness), or
//! uses the server `--url` names; there it touches only keys under the hash tags it makes
//! (`{kb-bench-PID-...}`), and removes them. Without `redis-server` and without `--url`, it
//! says so and skips. Sizes: `--quick` runs 3 rounds, publishes for 0.4 s a run, pulls
//! 50,000 values over 2,500 keys (and 10,000 over as many keys) and sends for 2 s at the
//! lateness figure; the full run, 5 rounds of 1 s, 200,000 values over 10,000 keys (and
//! 40,000 over as many), 5 s. Both count memory with 10,000 keys. Run without `--bench` or `--quick` (as `cargo test --benches` does), the binary
//! does a smoke check instead: every figure once, tiny.
//!
//! `--only publish,pull,lateness,memory` picks figures; `--rounds N`, `--secs S` (a publish
//! run), `--values N` (the pull fill, 20 a key) and `--keys N` (the pull fill's keys)
//! adjust the size.
//!
//! # Figures
//!
//! 1. **Published values/s.** 1 and 4 `redis::Sender`s, each opened with its own
//!    `Builder::sender()` and so its own connection, each driven by 64 tasks that loop on
//!    `send(..).await`, so that sends coalesce. Against it, in the same round, as many
//!    connections of the `redis` crate, each driven by 64 tasks that loop on `RPUSH` to one
//!    LIST. The ratio is keyed-batch's values/s over plain's, taken within a round, median
//!    over rounds: the machine's noise hits both sides.
//! 2. **Pulled and acked values/s.** A queue with window 0 filled beforehand, then 1 or 2
//!    `redis::Receiver`s that loop on `recv` and `ack_all`; against `LPOP list 1000` from one
//!    LIST holding the same values, on as many connections; and 1 consumer with one value
//!    a key, where what each key costs shows.
//! 3. **Lateness.** Values sent at 1,000 a second, each under its own key, with a 50 ms
//!    window; how long past its due time each delivery comes, by this process's clock and
//!    by `Delivery::entered()`. Against a plain LIST handed over with `BLPOP`, and the
//!    in-memory `timed` channel.
//! 4. **Memory per pending key.** `INFO memory` before and after 10,000 keys with 1 and
//!    10 values each; against the same values in one LIST, and in a LIST a key.
//!
//! Each figure's table says where the time goes: CPU time of the server (`INFO cpu`) and of
//! this process (all client) per value, and the server's calls and time per command
//! (`INFO commandstats`). The summary table closes the run, and every figure goes to
//! `redis-bench.json` in the target directory.

//! # Where things are
//!
//! [`plan`] reads the flags; [`probe`] holds the server and what a run cost it;
//! [`publish`], [`pull`], [`lateness`] and [`memory`] each run one figure and write its
//! table; [`report`] has what the tables share and the summary.

#![forbid(unsafe_code)]

use std::env;
use std::time::Instant;

use common::{runtime, target_dir};
use plan::Plan;
use probe::Server;
use redis_server::RedisServer;

#[path = "../common/mod.rs"]
mod common;
#[path = "../../tests/common/redis_server.rs"]
mod redis_server;

mod plan;
mod probe;
// One module a figure.
mod lateness;
mod memory;
mod publish;
mod pull;
// The tables.
mod report;

fn main() {
    let args: Vec<String> = env::args().skip(1).collect();
    let plan = Plan::from_args(&args);
    // Ours lives until the end of `main`, and is killed when dropped.
    let (server, _own) = match &plan.url {
        Some(url) => (Server::new(url.clone(), false), None),
        None => match RedisServer::start() {
            Some(own) => (Server::new(own.url(), true), Some(own)),
            // The harness said why on stderr.
            None => return,
        },
    };
    let started = Instant::now();
    let version = runtime().block_on(async {
        let mut conn = server.conn().await;
        probe::info(&mut conn, "server")
            .await
            .remove("redis_version")
            .unwrap_or_default()
    });
    let where_ = match server.own {
        true => format!("its own redis-server at {}", server.url),
        false => format!("{} (--url)", server.url),
    };
    print!("{}", report::header(plan.label, &where_, &version));

    let mut lines = Vec::new();
    let mut json = serde_json::json!({
        "size": plan.label,
        "cores": report::cores(),
        "server": server.url,
        "own_server": server.own,
        "redis_version": version,
    });
    if plan.covers("publish") {
        let rows = publish::run(&plan, &server);
        print!("{}", publish::table(&plan, &rows));
        lines.extend(publish::lines(&rows));
        json["publish"] = publish::json(&rows);
    }
    if plan.covers("pull") {
        let rows = pull::run(&plan, &server);
        print!("{}", pull::table(&plan, &rows));
        lines.extend(pull::lines(&rows));
        json["pull"] = pull::json(&rows);
    }
    if plan.covers("lateness") {
        let figures = lateness::run(&plan, &server);
        print!("{}", lateness::table(&plan, &figures));
        lines.extend(lateness::lines(&figures));
        json["lateness"] = lateness::json(&figures);
    }
    if plan.covers("memory") {
        let cases = memory::run(&plan, &server);
        print!("{}", memory::table(&cases));
        lines.extend(memory::lines(&cases));
        json["memory"] = memory::json(&cases);
    }
    print!("{}", report::summary(&lines));
    json["summary"] = lines.iter().map(report::Line::json).collect();
    let secs = started.elapsed().as_secs_f64();
    json["secs"] = secs.into();
    let path = target_dir().join("redis-bench.json");
    let written = std::fs::create_dir_all(target_dir())
        .and_then(|()| std::fs::write(&path, serde_json::to_string_pretty(&json).expect("JSON")));
    match written {
        Ok(()) => println!("\nFigures written to {}.", path.display()),
        Err(e) => eprintln!("cannot write {}: {e}", path.display()),
    }
    println!("Time: {secs:.0} s in all.");
}
