//! Figure 4: Redis memory per pending key, with 1 and 10 small values a key, against the
//! same values in one LIST, and in a LIST per key.

use std::fmt::Write as _;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::plan::Plan;
use crate::probe::{field, info, Server};
use crate::publish::{value, IN_FLIGHT, VALUE_BYTES};
use crate::report::Line;
use crate::runtime;

/// The window: nothing comes due while the figure runs.
const WINDOW: Duration = Duration::from_secs(3600);

/// One case: bytes per key on each side, and where keyed-batch's go.
pub(crate) struct Case {
    keys: u64,
    per_key: u64,
    keyed: f64,
    one_list: f64,
    lists: f64,
    /// `MEMORY USAGE` of one key's LIST and HASH, and the `due` ZSET's share per key.
    parts: (u64, u64, f64),
}

pub(crate) fn run(plan: &Plan, server: &Server) -> Vec<Case> {
    if !server.own {
        eprintln!("  memory: a server others may use (--url): its used_memory moves with theirs");
    }
    runtime().block_on(async {
        let mut admin = server.conn().await;
        // The publish script is cached in the server once, for every queue: load it first.
        let warm = server.name("memory-warm");
        let queue = keyed_batch::redis::Builder::new(server.url.as_str(), warm.as_str(), WINDOW);
        let tx = queue.sender::<u64, Vec<u8>>().await.expect("a sender opens");
        tx.send(0, value(0)).await.expect("sent");
        drop(tx);
        Server::clean(&mut admin, &warm).await;

        let mut cases = Vec::new();
        for &(keys, per_key) in &plan.memory_cases {
            let case = case(server, &mut admin, keys, per_key).await;
            eprintln!(
                "  memory {keys} keys × {per_key}: keyed {:.0} B/key, one LIST {:.0}, a LIST a key {:.0}",
                case.keyed, case.one_list, case.lists
            );
            cases.push(case);
        }
        cases
    })
}

/// Bytes the server holds for data: `used_memory` less the clients' buffers, which come
/// and go with the traffic; once nothing is left to free in the background.
async fn used(conn: &mut MultiplexedConnection) -> i64 {
    loop {
        let memory = info(conn, "memory").await;
        if field::<u64>(&memory, "lazyfree_pending_objects") == 0 {
            return field::<i64>(&memory, "used_memory")
                - field::<i64>(&memory, "mem_clients_normal");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn case(server: &Server, admin: &mut MultiplexedConnection, keys: u64, per_key: u64) -> Case {
    let values = keys * per_key;
    let encoded = |i: u64| postcard::to_stdvec(&value(i)).expect("encoded");
    let key_of = move |i: u64| i % keys;

    // keyed-batch: the queue is opened (and its meta data made) before the first count.
    let name = server.name("memory");
    let queue = keyed_batch::redis::Builder::new(server.url.as_str(), name.as_str(), WINDOW);
    let tx = queue
        .sender::<u64, Vec<u8>>()
        .await
        .expect("a sender opens");
    let before = used(admin).await;
    let mut tasks = Vec::new();
    for t in 0..IN_FLIGHT as u64 {
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = t;
            while i < values {
                tx.send(key_of(i), value(i)).await.expect("sent");
                i += IN_FLIGHT as u64;
            }
        }));
    }
    for task in tasks {
        task.await.expect("a send task");
    }
    drop(tx);
    let keyed = (used(admin).await - before) as f64 / keys as f64;
    let sample = postcard::to_stdvec(&0u64).expect("encoded");
    let usage = |suffix: &str| {
        let mut key = format!("{{{name}}}:{suffix}").into_bytes();
        if suffix != "due" {
            key.extend_from_slice(&sample);
        }
        key
    };
    let mut parts = (0, 0, 0.0);
    for (i, suffix) in ["l:", "s:", "due"].into_iter().enumerate() {
        let bytes: Option<u64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(usage(suffix))
            .arg("SAMPLES")
            .arg(0)
            .query_async(admin)
            .await
            .expect("MEMORY USAGE");
        let bytes = bytes.unwrap_or(0);
        match i {
            0 => parts.0 = bytes,
            1 => parts.1 = bytes,
            _ => parts.2 = bytes as f64 / keys as f64,
        }
    }
    Server::clean(admin, &name).await;

    // Plain: one LIST holding the same encoded values.
    let name = server.name("memory-plain");
    let list = format!("{{{name}}}:list");
    let before = used(admin).await;
    let mut i = 0;
    while i < values {
        let chunk: Vec<Vec<u8>> = (i..values.min(i + 1000)).map(encoded).collect();
        i += chunk.len() as u64;
        let _: i64 = redis::cmd("RPUSH")
            .arg(&list)
            .arg(chunk)
            .query_async(admin)
            .await
            .expect("RPUSH");
    }
    let one_list = (used(admin).await - before) as f64 / keys as f64;
    Server::clean(admin, &name).await;

    // Plain: a LIST a key, named as keyed-batch names them, in one pipeline per 1000 values.
    let name = server.name("memory-lists");
    let before = used(admin).await;
    let mut i = 0;
    while i < values {
        let mut pipe = redis::pipe();
        for i in i..values.min(i + 1000) {
            let mut key = format!("{{{name}}}:l:").into_bytes();
            key.extend_from_slice(&postcard::to_stdvec(&key_of(i)).expect("encoded"));
            pipe.cmd("RPUSH").arg(key).arg(encoded(i)).ignore();
        }
        i = values.min(i + 1000);
        let () = pipe.query_async(admin).await.expect("RPUSH");
    }
    let lists = (used(admin).await - before) as f64 / keys as f64;
    Server::clean(admin, &name).await;

    Case {
        keys,
        per_key,
        keyed,
        one_list,
        lists,
        parts,
    }
}

pub(crate) fn table(cases: &[Case]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n### 4. Redis memory per pending key\n");
    let _ = writeln!(
        out,
        "- `used_memory` less `mem_clients_normal` (client buffers), after the values were \
         sent less before, over the keys. {VALUE_BYTES}-byte values (`Vec<u8>`, {} bytes \
         encoded), `u64` keys, window {} s (nothing due), no receiver.\n\
         - one LIST: the same encoded values `RPUSH`ed to one LIST (the baseline of figures \
         1 and 2). A LIST a key: each key's values in a LIST of its own, named as \
         keyed-batch names it: what any keyed layout in Redis needs at least.\n\
         - where keyed-batch's go: `MEMORY USAGE` of one key's LIST (`:l:<key>`) and HASH \
         (`:s:<key>`), and the `:due` ZSET over the keys.\n",
        VALUE_BYTES + 1,
        WINDOW.as_secs()
    );
    let _ = writeln!(
        out,
        "| keys × values | keyed B/key | one LIST B/key | ×one LIST | a LIST a key B/key | ×a LIST a key | keyed LIST, HASH, ZSET share B |"
    );
    let _ = writeln!(out, "|---|--:|--:|--:|--:|--:|--:|");
    for c in cases {
        let _ = writeln!(
            out,
            "| {} × {} | {:.0} | {:.0} | {:.1} | {:.0} | {:.2} | {}, {}, {:.0} |",
            c.keys,
            c.per_key,
            c.keyed,
            c.one_list,
            c.keyed / c.one_list,
            c.lists,
            c.keyed / c.lists,
            c.parts.0,
            c.parts.1,
            c.parts.2,
        );
    }
    out
}

pub(crate) fn lines(cases: &[Case]) -> Vec<Line> {
    cases
        .iter()
        .map(|c| Line {
            what: format!(
                "Redis memory per pending key, {} keys × {} value{}",
                c.keys,
                c.per_key,
                if c.per_key == 1 { "" } else { "s" }
            ),
            keyed: format!("{:.0} B", c.keyed),
            plain: format!(
                "{:.0} B (one LIST); {:.0} B (a LIST a key)",
                c.one_list, c.lists
            ),
            ratio: format!("{:.1}; {:.2}", c.keyed / c.one_list, c.keyed / c.lists),
            target: "report it".into(),
            met: None,
        })
        .collect()
}

pub(crate) fn json(cases: &[Case]) -> serde_json::Value {
    serde_json::Value::Array(
        cases
            .iter()
            .map(|c| {
                serde_json::json!({
                    "keys": c.keys,
                    "values_per_key": c.per_key,
                    "keyed_bytes_per_key": c.keyed,
                    "one_list_bytes_per_key": c.one_list,
                    "list_per_key_bytes_per_key": c.lists,
                    "keyed_sample_list_bytes": c.parts.0,
                    "keyed_sample_hash_bytes": c.parts.1,
                    "keyed_due_zset_bytes_per_key": c.parts.2,
                })
            })
            .collect(),
    )
}
