//! The Redis flavour when things go wrong: the server killed and restarted (with and without
//! persistence), a bad URL, values that do not decode, a builder whose settings differ from
//! the queue's, leases that run out or are renewed, and a receiver left idle while keys are
//! due. Each test starts its own server.

#[path = "common/redis_server.rs"]
mod redis_server;

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use keyed_batch::ack;
use keyed_batch::error::DeliveryError;
use keyed_batch::redis::{self, Error, Receiver, SendError, Sender};
use redis_server::RedisServer;

const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The most any step that should be quick may take before the test fails instead of hanging.
const STEP: Duration = Duration::from_secs(15);

fn builder(server: &RedisServer, queue: &str, window: Duration) -> redis::Builder {
    redis::Builder::new(server.url(), queue, window)
}

/// Awaits `f`, failing the test if it takes longer than [`STEP`].
async fn step<F: Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(STEP, f).await {
        Ok(out) => out,
        Err(_) => panic!("{what} did not finish within {STEP:?}"),
    }
}

/// Retries `f` every 50 ms while it fails with [`Error::Connection`] (the client is still
/// reconnecting), for [`STEP`] at most; returns the first other outcome, and how many tries
/// failed to connect before it.
async fn past_reconnect<T, F, Fut>(what: &str, mut f: F) -> (Result<T, Error>, u32)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let deadline = Instant::now() + STEP;
    let mut refused = 0;
    loop {
        match f().await {
            Err(Error::Connection(err)) => {
                assert!(
                    Instant::now() < deadline,
                    "{what} still cannot reach the restarted server after {STEP:?}: {err}"
                );
                refused += 1;
                tokio::time::sleep(ms(50)).await;
            }
            other => return (other, refused),
        }
    }
}

/// Whether `err` is a failed send of `value` for want of a connection.
fn failed_to_connect<T: PartialEq + std::fmt::Debug>(err: &SendError<T>, value: &T) -> bool {
    match err {
        SendError::Failed {
            value: v,
            error: Error::Connection(_),
        } => {
            assert_eq!(v, value, "the failed send handed back another value");
            true
        }
        _ => false,
    }
}

/// The error of a failed send of `value`; panics if the send failed otherwise.
fn failure<T: PartialEq + std::fmt::Debug>(err: SendError<T>, value: &T) -> Error {
    match err {
        SendError::Failed { value: v, error } => {
            assert_eq!(&v, value, "the failed send handed back another value");
            error
        }
        other => panic!("the send did not fail as expected: {other:?}"),
    }
}

// ===== a restart with persistence =====

/// With `appendfsync always`, every value whose send returned `Ok` before the server was
/// killed is there after the restart; the old handles reconnect by themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_aof_keeps_every_sent_value() {
    const VALUES: u32 = 2_000;
    const KEYS: u32 = 100;
    // Divides KEYS, so that each key's values all come from one task, in order.
    const TASKS: u32 = 20;
    let Some(mut server) =
        RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
    else {
        return;
    };
    let queue = builder(&server, "aof", ms(20));
    let tx: Sender<u32, u32> = queue.sender().await.unwrap();
    let mut rx: Receiver<u32, u32> = queue.receiver().await.unwrap();

    // Each task sends its values in order and stops at its first failure.
    let ok = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let tx = tx.clone();
            let ok = Arc::clone(&ok);
            tokio::spawn(async move {
                for v in (task..VALUES).step_by(TASKS as usize) {
                    match tx.send(v % KEYS, v).await {
                        Ok(()) => ok.lock().unwrap().push(v),
                        Err(err) => {
                            assert!(failed_to_connect(&err, &(v % KEYS, v)), "{err:?}");
                            return Some(v);
                        }
                    }
                }
                None
            })
        })
        .collect();

    // Kill the server while sends are in flight: once a quarter have returned.
    let deadline = Instant::now() + STEP;
    while ok.lock().unwrap().len() < VALUES as usize / 4 {
        assert!(Instant::now() < deadline, "the sends are too slow");
        tokio::time::sleep(ms(1)).await;
    }
    server.kill();
    let mut failed = 0;
    for task in tasks {
        if step("a sender task", task).await.unwrap().is_some() {
            failed += 1;
        }
    }
    let ok: Vec<u32> = std::mem::take(&mut *ok.lock().unwrap());
    assert!(
        failed > 0,
        "every send returned before the kill ({} ok): the test did not kill mid-stream",
        ok.len()
    );

    server.restart();
    // The old sender reconnects: its first sends may still fail to connect.
    let started = Instant::now();
    let (sent, refused) = past_reconnect("the old sender", || async {
        let sent = tx.send(7, 1_000_000).await;
        sent.map_err(|err| failure(err, &(7, 1_000_000)))
    })
    .await;
    sent.expect("the old sender sends again after the restart");
    let reconnected_after = started.elapsed();

    // A new handle opens the queue as it was: not gone, the same settings.
    let fresh: Receiver<u32, u32> = queue.receiver().await.unwrap();
    let len = fresh.len().await.unwrap();
    assert!(
        len > ok.len() as u64 && len <= u64::from(VALUES) + 1,
        "{len} values in the queue after the restart; {} sends returned Ok",
        ok.len()
    );
    drop(fresh);

    // The old receiver drains it all once the queue is closed.
    tx.close().await.unwrap();
    let mut got: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let mut seen = HashSet::new();
    step("draining after the restart", async {
        while let Some(batch) = rx.next().await {
            for d in &batch {
                for v in d.values() {
                    assert!(seen.insert(*v), "{v} delivered twice");
                    got.entry(*d.key()).or_default().push(*v);
                }
            }
            ack::ack_all(batch).await.unwrap();
        }
    })
    .await;
    for v in &ok {
        assert!(
            seen.contains(v),
            "{v} was sent (Ok) before the kill but is gone"
        );
    }
    assert!(
        seen.contains(&1_000_000),
        "the send after the restart is missing"
    );
    for (key, values) in &got {
        let mut sorted = values.clone();
        sorted.sort_unstable();
        assert_eq!(values, &sorted, "key {key}'s values out of order");
        assert!(values.iter().all(|v| *v == 1_000_000 || v % KEYS == *key));
    }
    eprintln!(
        "aof: {} sends Ok and {failed} failed at the kill; {} values after the restart; the \
         old sender failed to connect {refused} times, sent again after {reconnected_after:?}",
        ok.len(),
        len
    );
}

// ===== a restart without persistence =====

/// A killed server fails sends and `recv` with `Error::Connection`, promptly, with the value
/// handed back; once it is back empty, the old handles create the queue afresh and go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_goes_away_and_comes_back_empty() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let queue = builder(&server, "away", ms(20));
    let tx: Sender<String, u32> = queue.sender().await.unwrap();
    let mut rx: Receiver<String, u32> = queue.receiver().await.unwrap();
    tx.send("a".into(), 1).await.unwrap();
    let batch = step("the first recv", rx.recv()).await.unwrap().unwrap();
    assert_eq!(batch[0].values(), [1]);
    ack::ack_all(batch).await.unwrap();

    server.kill();
    let started = Instant::now();
    let err = step("a send to a dead server", tx.send("b".into(), 2))
        .await
        .unwrap_err();
    assert!(failed_to_connect(&err, &("b".to_string(), 2)), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("the send failed: cannot reach Redis"),
        "{err}"
    );
    let send_failed_after = started.elapsed();

    let started = Instant::now();
    let err = step("a recv from a dead server", rx.recv())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Connection(_)), "{err:?}");
    assert!(std::error::Error::source(&err).is_some());
    let recv_failed_after = started.elapsed();
    // The stream keeps trying through the outage rather than ending.
    assert!(
        tokio::time::timeout(ms(1500), rx.next()).await.is_err(),
        "the stream ended or yielded while the server was down"
    );

    server.restart();
    // The data went with the server. The old handles find the queue gone, create it afresh
    // and go on: the first send that reaches the new server goes in.
    let (sent, _) = past_reconnect("the old sender", || async {
        let sent = tx.send("c".into(), 3).await;
        sent.map_err(|err| failure(err, &("c".to_string(), 3)))
    })
    .await;
    sent.unwrap();
    let batch = step("the stream after the queue came back", rx.next())
        .await
        .unwrap();
    assert_eq!(batch.len(), 1);
    assert_eq!(
        (batch[0].key().as_str(), batch[0].values()),
        ("c", &[3][..]),
        "the queue came back empty but for the new send"
    );
    ack::ack_all(batch).await.unwrap();
    assert_eq!(rx.len().await.unwrap(), 0);
    eprintln!(
        "away: a send failed {send_failed_after:?} after the kill, a recv {recv_failed_after:?}"
    );
}

/// A delivery held from before the queue's data was deleted decides nothing of the queue
/// made afresh: its ack is `LeaseLost`. Delivery ids started again at 1 there, so it used to
/// acknowledge the new delivery of its key, whose value was then lost without a trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_from_before_the_data_went_decides_nothing_new() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let queue = builder(&server, "stale", ms(10));
    let tx: Sender<u32, u32> = queue.sender().await.unwrap();
    let mut rx: Receiver<u32, u32> = queue.receiver().await.unwrap();
    tx.send(7, 1).await.unwrap();
    let old = step("the first recv", rx.recv()).await.unwrap().unwrap();
    server.command(&["FLUSHALL"]);
    // The sender finds the queue gone, makes it afresh, and goes on.
    tx.send(7, 2).await.unwrap();
    let new = step("the recv after the flush", rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(new[0].values(), [2]);
    let old_ack = ack::ack_all(old).await;
    assert!(
        matches!(old_ack, Err(DeliveryError::LeaseLost)),
        "{old_ack:?}"
    );
    ack::ack_all(new).await.unwrap();
    assert_eq!(rx.len().await.unwrap(), 0);
}

/// A server restarted from an older snapshot (RDB, or an AOF with `everysec`) rolls the
/// queue back, its delivery count included. A delivery held from before the restart decides
/// nothing of the new delivery of its key: its ack is `LeaseLost`. Ids held only the count
/// and the queue's epoch, so it used to acknowledge the new delivery, and the value sent
/// after the restart went with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_from_before_a_rollback_decides_nothing_new() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let queue = builder(&server, "rollback", ms(10));
    let tx: Sender<u32, u32> = queue.sender().await.unwrap();
    let mut a: Receiver<u32, u32> = queue.receiver().await.unwrap();
    tx.send(7, 1).await.unwrap();
    // The snapshot: key 7 waits with [1]; no delivery yet.
    assert_eq!(server.command(&["SAVE"]), "+OK\r\n");
    let old = step("the first recv", a.recv()).await.unwrap().unwrap();
    assert_eq!(old[0].values(), [1]);

    // The server comes back from the snapshot.
    server.restart();
    let (sent, _) = past_reconnect("the old sender", || async {
        tx.send(7, 2).await.map_err(|e| failure(e, &(7, 2)))
    })
    .await;
    sent.unwrap();
    let mut b: Receiver<u32, u32> = queue.receiver().await.unwrap();
    let new = step("the recv after the restart", b.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(new[0].values(), [1, 2]);

    // The stale holder's connection is back too.
    past_reconnect("the old receiver", || a.len())
        .await
        .0
        .unwrap();
    let old_ack = step("the stale ack", ack::ack_all(old)).await;
    let new_ack = step("the new ack", ack::ack_all(new)).await;
    let left = b.len().await.unwrap();
    assert!(
        matches!(old_ack, Err(DeliveryError::LeaseLost)) && new_ack.is_ok(),
        "stale ack {old_ack:?}, new ack {new_ack:?}, {left} values left"
    );
    assert_eq!(left, 0);
}

/// A delivery that was in flight when the snapshot was taken is in flight in it too: after
/// the server comes back from the snapshot, its ack is taken, and its values do not go out
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_the_snapshot_holds_is_decided_as_usual() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let queue = builder(&server, "held-in-snapshot", ms(10));
    let tx: Sender<u32, u32> = queue.sender().await.unwrap();
    let mut rx: Receiver<u32, u32> = queue.receiver().await.unwrap();
    tx.send(7, 1).await.unwrap();
    let held = step("the recv", rx.recv()).await.unwrap().unwrap();
    // The snapshot: key 7 in flight with [1].
    assert_eq!(server.command(&["SAVE"]), "+OK\r\n");
    server.restart();
    past_reconnect("the receiver", || rx.len()).await.0.unwrap();
    step("the ack", ack::ack_all(held)).await.unwrap();
    assert_eq!(rx.len().await.unwrap(), 0);
}

/// A proxy to the server at `port` that holds each chunk a client sends for `delay`: every
/// round trip takes at least `delay`.
fn slow_proxy(port: u16, delay: Duration) -> u16 {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    fn pass(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
        let mut buf = vec![0; 1 << 16];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            std::thread::sleep(delay);
            if to.write_all(&buf[..n]).is_err() {
                return;
            }
        }
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let server = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let (back, up) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || pass(server, back, Duration::ZERO));
            std::thread::spawn(move || pass(client, up, delay));
        }
    });
    proxy
}

/// `len` reads every shard's count in one round trip: with each request held 250 ms on its
/// way, eight shards read one after another would take 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn len_is_one_round_trip_however_many_shards() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let delay = ms(250);
    let port = slow_proxy(server.port(), delay);
    let tx: Sender<u32, u32> = builder(&server, "len", ms(20))
        .shards(8)
        .sender()
        .await
        .unwrap();
    let slow = redis::Builder::new(format!("redis://127.0.0.1:{port}/"), "len", ms(20));
    let rx: Receiver<u32, u32> = slow.shards(8).receiver().await.unwrap();
    for key in 0..32 {
        tx.send(key, 1).await.unwrap();
    }
    let start = Instant::now();
    assert_eq!(rx.len().await.unwrap(), 32);
    let took = start.elapsed();
    assert!(took >= delay && took < 4 * delay, "len took {took:?}");
}

// ===== bad addresses =====

#[tokio::test]
async fn nothing_listens_at_the_url() {
    let queue = redis::Builder::new("redis://127.0.0.1:1/", "nowhere", ms(20));
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(10), queue.sender::<u32, u32>())
        .await
        .expect("opening a queue at a closed port must fail within 10 s")
        .unwrap_err();
    assert!(matches!(err, Error::Connection(_)), "{err:?}");
    let text = err.to_string();
    assert!(text.starts_with("cannot reach Redis: "), "{text}");
    assert!(text.to_lowercase().contains("refused"), "{text}");
    let err = tokio::time::timeout(Duration::from_secs(10), queue.receiver::<u32, u32>())
        .await
        .expect("opening a queue at a closed port must fail within 10 s")
        .unwrap_err();
    assert!(matches!(err, Error::Connection(_)), "{err:?}");
    eprintln!("closed port: both refused within {:?}", started.elapsed());
}

/// A sender used after the runtime it was made on has shut down fails with
/// `Error::Connection` and hands its value back: its connection was on that runtime. It
/// used to panic, as if the crate had a bug.
#[test]
fn a_sender_outliving_its_runtime_fails_with_its_value() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    let tx = first.block_on(async {
        let tx = builder(&server, "gone", ms(20))
            .sender::<u32, u32>()
            .await
            .unwrap();
        tx.send(1, 10).await.unwrap();
        tx
    });
    drop(first);
    let sent = runtime().block_on(async { step("send", tx.send(2, 20)).await });
    let err = sent.unwrap_err();
    assert!(failed_to_connect(&err, &(2, 20)), "{err:?}");
}

/// A server that is reached but refuses the connection (a database it does not have, a
/// wrong password) answered with an error: `Error::Server`, not `Error::Connection`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_a_server_error() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let port = server.port();
    let database = redis::Builder::new(format!("redis://127.0.0.1:{port}/99"), "q", ms(20));
    let err = database.sender::<u32, u32>().await.unwrap_err();
    assert!(matches!(err, Error::Server(_)), "{err:?}");
    let err = database.receiver::<u32, u32>().await.unwrap_err();
    assert!(matches!(err, Error::Server(_)), "{err:?}");

    let set = server.command(&["CONFIG", "SET", "requirepass", "hunter2"]);
    assert_eq!(set, "+OK\r\n");
    let password = redis::Builder::new(format!("redis://:wrong@127.0.0.1:{port}/"), "q", ms(20));
    let err = password.sender::<u32, u32>().await.unwrap_err();
    assert!(matches!(err, Error::Server(_)), "{err:?}");
    let err = password.receiver::<u32, u32>().await.unwrap_err();
    assert!(matches!(err, Error::Server(_)), "{err:?}");
}

#[tokio::test]
async fn url_that_does_not_parse() {
    let queue = redis::Builder::new("not a url", "q", ms(20));
    let err = queue.sender::<u32, u32>().await.unwrap_err();
    match &err {
        Error::Url { url, detail } => {
            assert_eq!(url, "not a url");
            assert!(!detail.is_empty());
        }
        other => panic!("{other:?}"),
    }
    let text = err.to_string();
    assert!(text.starts_with("bad Redis URL \"not a url\": "), "{text}");
    let err = queue.receiver::<u32, u32>().await.unwrap_err();
    assert!(matches!(err, Error::Url { .. }), "{err:?}");
}

/// A password in the URL stays out of what a log would print: the builder's `Debug`, and
/// the URL a bad-URL error carries.
#[tokio::test]
async fn a_password_in_the_url_is_not_printed() {
    let queue = redis::Builder::new("redis://user:hunter2@127.0.0.1:70000/", "q", ms(20));
    let shown = format!("{queue:?}");
    assert!(
        shown.contains("redis://user:***@127.0.0.1:70000/"),
        "{shown}"
    );
    let err = queue.sender::<u32, u32>().await.unwrap_err();
    let Error::Url { url, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(url, "redis://user:***@127.0.0.1:70000/");
    for text in [err.to_string(), format!("{err:?}")] {
        assert!(!text.contains("hunter2"), "{text}");
    }
    let alone = redis::Builder::new("redis://hunter2@127.0.0.1/", "q", ms(20));
    assert!(!format!("{alone:?}").contains("hunter2"));
}

/// A password with a `/`, `?` or `#` in it, not percent-encoded, makes a URL that may not
/// parse (these do not, for their port), whose error shows it: the password stays out of
/// that, and of the builder's `Debug`, all the same.
#[tokio::test]
async fn a_password_with_a_slash_or_a_query_mark_is_not_printed() {
    for (url, user) in [
        ("redis://user:hun/ter2@127.0.0.1:70000/", "user"),
        ("redis://:hun/ter2@127.0.0.1:70000/0", ""),
        ("redis://user:hun?ter2@127.0.0.1:70000/", "user"),
        ("redis://user:hun#ter2@127.0.0.1:70000/", "user"),
    ] {
        let queue = redis::Builder::new(url, "q", ms(20));
        let shown = format!("{queue:?}");
        assert!(!shown.contains("ter2"), "{shown}");
        let err = queue.sender::<u32, u32>().await.unwrap_err();
        let Error::Url { url: shown, .. } = &err else {
            panic!("{err:?}");
        };
        let host = format!("redis://{user}:***@127.0.0.1:70000/");
        assert!(shown.starts_with(&host), "{shown}");
        for text in [err.to_string(), format!("{err:?}")] {
            assert!(!text.contains("ter2"), "{text}");
        }
    }
    // With no `@` before the query, one in it may end such a password: from the first `:`
    // to it goes, as `Error::Url` says.
    let queue = redis::Builder::new("redis://127.0.0.1:70000/?x=a@b", "q", ms(20));
    let err = queue.sender::<u32, u32>().await.unwrap_err();
    let Error::Url { url, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(url, "redis://127.0.0.1:***@b");
}

/// A URL with a `/` or the `:` of `://` left out does not parse, and its error shows it:
/// the password the user meant stays out of that, and of the builder's `Debug`.
#[tokio::test]
async fn a_password_in_a_url_without_its_double_slash_is_not_printed() {
    for (url, redacted) in [
        ("redis:/:s3cret@localhost/", "redis:/:***@localhost/"),
        ("redis//:s3cret@localhost/", "redis//:***@localhost/"),
        (
            "redis:/user:s3cret@localhost/",
            "redis:/user:***@localhost/",
        ),
    ] {
        let queue = redis::Builder::new(url, "q", ms(20));
        assert!(!format!("{queue:?}").contains("s3cret"), "{queue:?}");
        let err = queue.sender::<u32, u32>().await.unwrap_err();
        let Error::Url { url: shown, .. } = &err else {
            panic!("{url}: {err:?}");
        };
        assert_eq!(shown, redacted);
        for text in [err.to_string(), format!("{err:?}")] {
            assert!(!text.contains("s3cret"), "{text}");
        }
    }
}

/// A Unix socket's URL carries its password in the query, as `pass` (which the client also
/// reads percent-encoded): that stays out of what a log would print too.
#[tokio::test]
async fn a_password_in_a_unix_urls_query_is_not_printed() {
    for url in [
        "redis+unix:///tmp/kb.sock?pass=hunter2&db=notanumber",
        "redis+unix:///tmp/kb.sock?db=notanumber&p%61ss=hunter2",
    ] {
        let queue = redis::Builder::new(url, "q", ms(20));
        assert!(!format!("{queue:?}").contains("hunter2"), "{queue:?}");
        let err = queue.sender::<u32, u32>().await.unwrap_err();
        let Error::Url { url, .. } = &err else {
            panic!("{err:?}");
        };
        assert!(url.starts_with("redis+unix:///tmp/kb.sock?"), "{url}");
        assert!(url.contains("ss=***"), "{url}");
        for text in [err.to_string(), format!("{err:?}")] {
            assert!(!text.contains("hunter2"), "{text}");
        }
    }
}

// ===== values that do not decode =====

/// Eleven bytes with the continuation bit set: not a varint postcard accepts, so neither a
/// `u64` nor a `String`'s length. (A `String` value would decode as a `u64`: its length.)
const GARBLED: [u8; 11] = [0xFF; 11];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_deliveries_step_aside() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let queue = builder(&server, "mixed", ms(20));
    let good: Sender<String, u64> = queue.sender().await.unwrap();
    let bad_value: Sender<String, [u8; 11]> = queue.sender().await.unwrap();
    let bad_key: Sender<[u8; 11], u64> = queue.sender().await.unwrap();
    let mut rx: Receiver<String, u64> = queue.receiver().await.unwrap();

    let mut want: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for k in 0..10u64 {
        for v in 0..3 {
            good.send(format!("k{k}"), k * 10 + v).await.unwrap();
            want.entry(format!("k{k}")).or_default().push(k * 10 + v);
        }
    }
    // Two garbled values, in one delivery.
    let (a, b) = tokio::join!(
        bad_value.send("bad".into(), GARBLED),
        bad_value.send("bad".into(), GARBLED)
    );
    a.unwrap();
    b.unwrap();
    // Good values, then a garbled one, under one key: the whole delivery steps aside.
    good.send("mixed".into(), 1).await.unwrap();
    good.send("mixed".into(), 2).await.unwrap();
    bad_value.send("mixed".into(), GARBLED).await.unwrap();
    bad_key.send(GARBLED, 7).await.unwrap();
    // Keys sent after the bad ones still come.
    for k in 10..20u64 {
        for v in 0..3 {
            good.send(format!("k{k}"), k * 10 + v).await.unwrap();
            want.entry(format!("k{k}")).or_default().push(k * 10 + v);
        }
    }

    let mut got: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    step("the good keys", async {
        while got != want {
            let batch = rx.next().await.expect("the queue is open");
            for d in &batch {
                assert!(d.key().starts_with('k'), "key {:?} was delivered", d.key());
                got.entry(d.key().clone()).or_default().extend(d.values());
            }
            ack::ack_all(batch).await.unwrap();
        }
    })
    .await;

    let mut bad = Vec::new();
    step("the undecodable deliveries", async {
        while bad.len() < 3 {
            bad.extend(rx.take_undecodable(10).await.unwrap());
            tokio::time::sleep(ms(10)).await;
        }
    })
    .await;
    assert_eq!(bad.len(), 3, "{bad:?}");
    bad.sort_by(|a, b| a.key.cmp(&b.key));
    // postcard: a string is its length, then its bytes; a small u64 is one byte.
    let garbled = GARBLED.to_vec();
    assert_eq!(bad[0].key, b"\x03bad");
    assert_eq!(bad[0].values, [garbled.clone(), garbled.clone()]);
    assert!(
        bad[0].reason.contains("does not decode"),
        "{}",
        bad[0].reason
    );
    assert!(
        bad[0].reason.starts_with("value 1 of 2 "),
        "{}",
        bad[0].reason
    );
    assert_eq!(bad[1].key, b"\x05mixed");
    assert_eq!(bad[1].values, [vec![1], vec![2], garbled.clone()]);
    assert!(
        bad[1].reason.starts_with("value 3 of 3 does not decode"),
        "{}",
        bad[1].reason
    );
    assert_eq!(bad[2].key, garbled);
    assert_eq!(bad[2].values, [vec![7]]);
    assert!(
        bad[2].reason.starts_with("the key does not decode"),
        "{}",
        bad[2].reason
    );
    for b in &bad {
        assert_eq!(b.attempts, 1, "{b:?}");
    }
    // They were taken: nothing is left, in the list or in the queue.
    assert!(rx.take_undecodable(10).await.unwrap().is_empty());
    assert_eq!(rx.len().await.unwrap(), 0);
    good.close().await.unwrap();
    assert!(step("the end of the stream", rx.next()).await.is_none());
}

/// A value of another type whose encoding begins like a `u64` does not pass for one: a
/// string is its length, then its bytes, and the bytes left over show it is no `u64`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_with_bytes_left_over_is_undecodable() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let queue = builder(&server, "left-over", ms(20));
    let strings: Sender<String, String> = queue.sender().await.unwrap();
    let numbers: Sender<String, u64> = queue.sender().await.unwrap();
    let mut rx: Receiver<String, u64> = queue.receiver().await.unwrap();
    strings.send("s".into(), "hello".into()).await.unwrap();
    numbers.send("n".into(), 1).await.unwrap();

    step("the good key", async {
        loop {
            let batch = rx.next().await.unwrap();
            for d in &batch {
                assert_ne!(
                    d.key(),
                    "s",
                    "the string \"hello\" was delivered as the u64s {:?}",
                    d.values()
                );
            }
            let done = batch.iter().any(|d| d.key() == "n");
            ack::ack_all(batch).await.unwrap();
            if done {
                break;
            }
        }
    })
    .await;
    let bad = step("the undecodable delivery", async {
        loop {
            let bad = rx.take_undecodable(10).await.unwrap();
            if !bad.is_empty() {
                break bad;
            }
            tokio::time::sleep(ms(10)).await;
        }
    })
    .await;
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0].key, b"\x01s");
    assert_eq!(bad[0].values, [b"\x05hello".to_vec()]);
    assert!(
        bad[0].reason.contains("does not decode"),
        "{}",
        bad[0].reason
    );
}

// ===== settings that differ =====

#[tokio::test]
async fn builder_that_differs_from_the_queue_is_refused() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let _created: Sender<u32, u32> = builder(&server, "m", ms(100)).sender().await.unwrap();
    // Settings that are each handle's own may differ.
    let _other: Receiver<u32, u32> = builder(&server, "m", ms(100))
        .lease(ms(50))
        .max_batch(3)
        .capacity(10)
        .max_attempts(2)
        .receiver()
        .await
        .unwrap();

    let mismatch = |err: Error, what: &str| match &err {
        Error::Mismatch { queue, detail } => {
            assert_eq!(queue, "m");
            assert!(detail.starts_with(what), "{detail}");
            let text = err.to_string();
            assert!(
                text.starts_with("the queue \"m\" in Redis has other settings: "),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    };
    let err = builder(&server, "m", ms(200))
        .receiver::<u32, u32>()
        .await
        .unwrap_err();
    mismatch(
        err,
        "window (µs) is 100000 in Redis, 200000 in this builder",
    );
    let err = builder(&server, "m", ms(100))
        .shards(2)
        .sender::<u32, u32>()
        .await
        .unwrap_err();
    mismatch(err, "shards is 1 in Redis, 2 in this builder");

    // A sharded queue opened with one shard, by its own tag.
    let _sharded: Sender<u32, u32> = builder(&server, "s", ms(100))
        .shards(2)
        .sender()
        .await
        .unwrap();
    let err = builder(&server, "s", ms(100))
        .sender::<u32, u32>()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Mismatch { detail, .. } if detail.starts_with("shards is 2 in Redis, 1 ")),
        "{err:?}"
    );

    // A queue of another flavour.
    assert_eq!(
        server.command(&["HSET", "{m}:meta", "flavour", "ordered"]),
        ":0\r\n"
    );
    let err = builder(&server, "m", ms(100))
        .sender::<u32, u32>()
        .await
        .unwrap_err();
    mismatch(err, "flavour is ordered in Redis, timed in this builder");
}

// ===== leases =====

/// A receiver whose runtime stalls past the lease loses the delivery to another receiver,
/// which gets it with the next attempt; the stalled one's ack then says the lease was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_holder_loses_its_lease() {
    const LEASE: Duration = ms(100);
    let Some(server) = RedisServer::start() else {
        return;
    };
    let queue = builder(&server, "stall", ms(20)).lease(LEASE);
    let tx: Sender<String, u32> = queue.sender().await.unwrap();
    let mut b: Receiver<String, u32> = queue.receiver().await.unwrap();

    // Receiver A lives on a runtime of its own, which runs only inside `block_on`: between
    // calls nothing renews its leases.
    let (took, took_rx) = mpsc::channel();
    let (go, go_rx) = mpsc::channel::<()>();
    let a_queue = queue.clone();
    let started = Instant::now();
    let a = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut batch = runtime.block_on(async {
            let mut a: Receiver<String, u32> = a_queue.receiver().await.unwrap();
            took.send(()).unwrap();
            let batch = tokio::time::timeout(STEP, a.next()).await.unwrap().unwrap();
            (a, batch)
        });
        let d = batch.1.pop().unwrap();
        took.send(()).unwrap();
        let seen = (d.key().clone(), d.values().to_vec(), d.attempt());
        // Stalled until B has the values again.
        go_rx.recv().unwrap();
        let outcome = runtime.block_on(d.ack());
        (seen, outcome)
    });
    took_rx.recv().unwrap();
    tx.send("x".into(), 1).await.unwrap();
    tokio::task::spawn_blocking(move || took_rx.recv_timeout(STEP).unwrap())
        .await
        .unwrap();

    let batch = step("the redelivery", b.next()).await.unwrap();
    let waited = started.elapsed();
    assert_eq!(batch.len(), 1);
    assert_eq!(
        (batch[0].key().as_str(), batch[0].values()),
        ("x", &[1][..])
    );
    assert_eq!(batch[0].attempt(), 2);
    assert!(
        waited >= LEASE,
        "redelivered after {waited:?}, before the lease ran out"
    );
    go.send(()).unwrap();
    let ((key, values, attempt), outcome) = tokio::task::spawn_blocking(move || a.join().unwrap())
        .await
        .unwrap();
    assert_eq!((key.as_str(), &values[..], attempt), ("x", &[1][..], 1));
    assert!(
        matches!(outcome, Err(DeliveryError::LeaseLost)),
        "the stalled holder's ack gave {outcome:?}"
    );
    // B's decision stands, and nothing is left.
    ack::ack_all(batch).await.unwrap();
    assert_eq!(b.len().await.unwrap(), 0);
    eprintln!("stall: redelivered {waited:?} after the send");
}

/// A holder whose runtime runs renews its lease: it keeps the delivery well past the
/// lease, nobody else gets it, and its ack succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_lease_is_renewed() {
    const LEASE: Duration = ms(100);
    let Some(server) = RedisServer::start() else {
        return;
    };
    let queue = builder(&server, "renew", ms(20)).lease(LEASE);
    let tx: Sender<String, u32> = queue.sender().await.unwrap();
    let mut a: Receiver<String, u32> = queue.receiver().await.unwrap();
    let mut b: Receiver<String, u32> = queue.receiver().await.unwrap();
    tx.send("x".into(), 1).await.unwrap();
    let batch = step("the delivery", a.next()).await.unwrap();
    assert_eq!(batch[0].attempt(), 1);
    let held = Instant::now();

    // Six leases long, another receiver gets nothing.
    let other = tokio::time::timeout(ms(600), b.next()).await;
    assert!(
        other.is_err(),
        "another receiver got {:?}",
        other.map(|b| b.map(|b| b.len()))
    );
    assert!(held.elapsed() >= ms(600));
    ack::ack_all(batch)
        .await
        .expect("the renewed lease still holds");
    assert_eq!(a.len().await.unwrap(), 0);
    tx.close().await.unwrap();
    assert!(step("the end of the stream", b.next()).await.is_none());
}

// ===== wakes =====

/// Two receivers wait on an empty queue. Two keys are sent 5 ms apart, so the second does
/// not move the first deadline and sets no wake marker. The receiver that takes the first
/// key holds it and stops pulling; the other must still get the second key once it is due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_receiver_gets_keys_the_busy_one_leaves() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let queue = builder(&server, "idle", ms(20));
    let tx: Sender<String, u32> = queue.sender().await.unwrap();
    let (got, mut batches) = tokio::sync::mpsc::unbounded_channel();
    for id in 0..2 {
        let mut rx: Receiver<String, u32> = queue.receiver().await.unwrap();
        let got = got.clone();
        tokio::spawn(async move {
            // Takes one batch, then holds it, undecided, and pulls no more.
            let batch = rx.next().await.unwrap();
            got.send((id, batch[0].key().clone())).unwrap();
            std::future::pending::<()>().await;
            drop(batch);
        });
    }
    // Both have pulled, found nothing, and wait.
    tokio::time::sleep(ms(200)).await;
    let sent = Instant::now();
    tx.send("x".into(), 1).await.unwrap();
    tokio::time::sleep(ms(5)).await;
    tx.send("y".into(), 2).await.unwrap();

    let (first, key) = step("the first key", batches.recv()).await.unwrap();
    assert_eq!(key, "x");
    let second = tokio::time::timeout(Duration::from_secs(3), batches.recv()).await;
    let Ok(Some((other, key))) = second else {
        panic!(
            "receiver {first} holds \"x\"; the other never got \"y\", due {:?} ago \
             (values in the queue: {:?})",
            sent.elapsed() - ms(25),
            server.command(&["HGET", "{idle}:meta", "pending"]),
        );
    };
    assert_eq!((other, key.as_str()), (1 - first, "y"));
}

// ===== dead letters =====

/// Makes a dead letter of each of `keys`: a queue with `max_attempts(1)`, each key's first
/// delivery retried.
async fn make_dead_letters(tx: &Sender<u32, u32>, rx: &mut Receiver<u32, u32>, keys: &[u32]) {
    for &key in keys {
        tx.send(key, key * 10).await.unwrap();
    }
    let mut retried = 0;
    while retried < keys.len() {
        let batch = step("a batch to retry", rx.recv()).await.unwrap().unwrap();
        for delivery in batch {
            delivery.retry().await.unwrap();
            retried += 1;
        }
    }
}

/// Dead letters a process fetched and did not hand out go back to Redis when it lets go
/// of the receiver: none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetched_dead_letters_not_taken_go_back() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let queue = builder(&server, "dead-back", ms(10)).max_attempts(1);
    let tx: Sender<u32, u32> = queue.sender().await.unwrap();
    let first = {
        let mut rx: Receiver<u32, u32> = queue.receiver().await.unwrap();
        make_dead_letters(&tx, &mut rx, &[1, 2, 3]).await;
        let mut dead = rx.dead_letters();
        let letter = step("the first dead letter", dead.recv()).await.unwrap();
        // Let the fetcher take more than was handed out, if it would.
        tokio::time::sleep(ms(300)).await;
        letter.key
    };
    tokio::time::sleep(ms(300)).await;
    let rx: Receiver<u32, u32> = queue.receiver().await.unwrap();
    let mut dead = rx.dead_letters();
    let mut rest = Vec::new();
    while rest.len() < 2 {
        let letter = step("the other dead letters", dead.recv()).await.unwrap();
        assert_eq!(letter.values, [letter.key * 10]);
        assert_eq!(letter.attempts, 1);
        rest.push(letter.key);
    }
    let mut all: Vec<u32> = rest.iter().copied().chain([first]).collect();
    all.sort_unstable();
    assert_eq!(all, [1, 2, 3], "a dead letter was lost or came twice");
    tx.close().await.unwrap();
    assert_eq!(step("the end of the dead letters", dead.recv()).await, None);
}

/// `try_recv` on the dead letters finds one made on the server without any task awaiting
/// the stream: a call that finds none starts a fetch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_try_recv_without_a_waiter() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let queue = builder(&server, "dead-try", ms(10)).max_attempts(1);
    let tx: Sender<u32, u32> = queue.sender().await.unwrap();
    let mut rx: Receiver<u32, u32> = queue.receiver().await.unwrap();
    let mut dead = rx.dead_letters();
    make_dead_letters(&tx, &mut rx, &[7]).await;
    let started = Instant::now();
    let letter = loop {
        match dead.try_recv() {
            Ok(letter) => break letter,
            Err(err) => {
                assert_eq!(err, keyed_batch::error::TryRecvError::Empty);
                assert!(started.elapsed() < STEP, "try_recv never found the letter");
                tokio::time::sleep(ms(20)).await;
            }
        }
    };
    assert_eq!(
        (letter.key, letter.values, letter.attempts),
        (7, vec![70], 1)
    );
}

// ===== capacity =====

/// A full queue makes `send` wait, values in flight included, until a decision makes room;
/// with shards, each shard counts on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_makes_send_wait_until_an_ack() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let queue = builder(&server, "full", ms(10)).capacity(2);
    let tx: Sender<u32, u32> = queue.sender().await.unwrap();
    let mut rx: Receiver<u32, u32> = queue.receiver().await.unwrap();
    tx.send(1, 1).await.unwrap();
    tx.send(2, 2).await.unwrap();
    let third = tokio::spawn({
        let tx = tx.clone();
        async move { tx.send(3, 3).await }
    });
    // The two keys come due up to a send's round trip apart: on a loaded machine that is
    // more than the window, and they come in two batches. Both stay in flight, unacked.
    let mut batch = step("the first batch", rx.recv()).await.unwrap().unwrap();
    if batch.len() < 2 {
        let second = step("the second batch", rx.recv()).await.unwrap().unwrap();
        batch.extend(second);
    }
    assert_eq!(batch.len(), 2);
    tokio::time::sleep(ms(300)).await;
    assert!(
        !third.is_finished(),
        "a send went in while two values were in flight"
    );
    assert_eq!(rx.len().await.unwrap(), 2);
    ack::ack_all(batch).await.unwrap();
    step("the waiting send", third).await.unwrap().unwrap();
    let batch = step("the third value", rx.recv()).await.unwrap().unwrap();
    assert_eq!((*batch[0].key(), batch[0].values()), (3, &[3][..]));
    ack::ack_all(batch).await.unwrap();

    // Four shards of capacity 1: keys in different shards go in side by side, while a
    // second value for a key waits for its shard.
    let queue = builder(&server, "full-shards", ms(10))
        .capacity(1)
        .shards(4);
    let tx: Sender<u32, u32> = queue.sender().await.unwrap();
    let rx: Receiver<u32, u32> = queue.receiver().await.unwrap();
    let mut accepted = HashSet::new();
    for key in 0..64u32 {
        if accepted.len() == 4 {
            break;
        }
        if tokio::time::timeout(ms(100), tx.send(key, key))
            .await
            .is_ok()
        {
            accepted.insert(key);
        }
    }
    assert_eq!(accepted.len(), 4, "four shards took one value each");
    assert_eq!(rx.len().await.unwrap(), 4);
    for key in &accepted {
        assert!(
            tokio::time::timeout(ms(200), tx.send(*key, 0))
                .await
                .is_err(),
            "a second value went into the full shard of key {key}"
        );
    }
    assert_eq!(rx.len().await.unwrap(), 4);
}
