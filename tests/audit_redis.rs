#![cfg(feature = "redis")]
//! Audit of the `redis` module's documented promises, as a user observes them. Each test
//! starts its own `redis-server`.

#[path = "common/redis_server.rs"]
mod redis_server;

use std::time::{Duration, Instant};

use futures::future::join_all;
use keyed_batch::error::DeliveryError;
use keyed_batch::redis::{self, Receiver, Sender};
use redis_server::RedisServer;

const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

const STEP: Duration = Duration::from_secs(10);

async fn step<F: std::future::Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(STEP, f).await {
        Ok(out) => out,
        Err(_) => panic!("{what} did not finish within {STEP:?}"),
    }
}

/// src/redis/mod.rs (table, "order"): "by deadline within a shard, then by arrival among
/// up to 4,096 runs due in the same millisecond". Two runs, A then B, in one script call
/// (so the same deadline): only two runs are due in that millisecond, yet B comes first
/// when the run counter wraps between them.
#[tokio::test]
async fn arrival_order_survives_the_run_counter_wrap() {
    // 4,094 runs, each a fresh key, so that the next two are the 4,095th and 4,096th.
    const WARM: u32 = 4094;
    let Some(server) = RedisServer::start() else {
        return;
    };
    let queue = redis::Builder::new(server.url(), "wrap", ms(20)).max_batch(10_000);
    let tx: Sender<u32, u32> = queue.sender().await.unwrap();
    let mut rx: Receiver<u32, u32> = queue.receiver().await.unwrap();
    let warm: Vec<_> = (0..WARM).map(|k| tx.send(k, 0)).collect();
    for sent in join_all(warm).await {
        sent.unwrap();
    }
    // A current-thread runtime: both sends are in the line before its task runs, so one
    // script call takes A, then B, with the same server time.
    let (a, b) = tokio::join!(tx.send(1_000_000, 1), tx.send(2_000_000, 2));
    a.unwrap();
    b.unwrap();
    tokio::time::sleep(ms(100)).await;
    let mut keys = Vec::new();
    while keys.len() < WARM as usize + 2 {
        let batch = step("the batch", rx.recv()).await.unwrap().unwrap();
        keys.extend(batch.iter().map(|d| *d.key()));
        keyed_batch::ack::ack_all(batch).await.unwrap();
    }
    let pos_a = keys.iter().position(|k| *k == 1_000_000).unwrap();
    let pos_b = keys.iter().position(|k| *k == 2_000_000).unwrap();
    assert!(
        pos_a < pos_b,
        "A (sent first, same deadline) came at {pos_a}, after B at {pos_b}"
    );
}

/// src/redis/mod.rs (table, "time"): "the Redis server's clock, to the millisecond", and
/// src/ack.rs `retry_after`: "the key is held until `delay` has passed". A retry_after
/// made while the receiver already waits sets no wake marker: the receiver only looks
/// again when its 1 s timer runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_while_the_receiver_waits_comes_on_time() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let queue = redis::Builder::new(server.url(), "retry-wait", ms(10));
    let tx: Sender<u32, u32> = queue.sender().await.unwrap();
    let mut rx: Receiver<u32, u32> = queue.receiver().await.unwrap();
    let (got, mut deliveries) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(batch)) = rx.recv().await {
            for d in batch {
                let _ = got.send((Instant::now(), d));
            }
        }
    });
    tx.send(1, 1).await.unwrap();
    let (_, first) = step("the first delivery", deliveries.recv()).await.unwrap();
    assert_eq!(first.attempt(), 1);
    // The consumer loop is back in `recv`, asleep on its timer.
    tokio::time::sleep(ms(150)).await;
    let delay = ms(50);
    let retried = Instant::now();
    first.retry_after(delay).await.unwrap();
    let (at, again) = step("the redelivery", deliveries.recv()).await.unwrap();
    let waited = at - retried;
    assert_eq!(again.attempt(), 2);
    assert!(
        waited < delay + ms(250),
        "retry_after({delay:?}) came back after {waited:?}"
    );
    again.ack().await.unwrap();
}

/// src/redis/mod.rs (table, "delivery"): "a decision made after that fails with
/// [`LeaseLost`]", src/error.rs `LeaseLost`: "its values went back into the queue", and
/// mod.rs `Error::Gone`: "Handles create a queue that is gone afresh by themselves, and go
/// on". After the queue's data is deleted, delivery ids start again at 1: a delivery held
/// from before acks the new delivery of the same key, whose own ack then says LeaseLost,
/// and the new value is gone without being redelivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_from_before_the_data_was_deleted_decides_nothing_new() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let queue = redis::Builder::new(server.url(), "stale", ms(10));
    let tx: Sender<u32, u32> = queue.sender().await.unwrap();
    let mut rx: Receiver<u32, u32> = queue.receiver().await.unwrap();
    tx.send(7, 1).await.unwrap();
    let old = step("the first delivery", rx.recv())
        .await
        .unwrap()
        .unwrap()
        .remove(0);
    assert_eq!(old.values(), [1]);

    server.command(&["FLUSHALL"]);
    // The sender finds the queue gone, creates it afresh, and goes on.
    tx.send(7, 2).await.unwrap();
    let new = step("the delivery after the flush", rx.recv())
        .await
        .unwrap()
        .unwrap()
        .remove(0);
    assert_eq!(new.values(), [2]);

    let old_outcome = old.ack().await;
    let new_outcome = new.ack().await;
    let left = rx.len().await.unwrap();
    assert!(
        matches!(old_outcome, Err(DeliveryError::LeaseLost)),
        "the delivery from before the flush (value 1, gone) acked: {old_outcome:?}; the new \
         delivery's ack then gave {new_outcome:?}, and {left} values are left"
    );
    assert!(new_outcome.is_ok(), "{new_outcome:?}");
}
