//! The receiving half: pulls due keys from the shards in turn, sleeps on a tokio timer set
//! to what the server reported, and decides deliveries through the [`Link`] they hold.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use futures_core::stream::{FusedStream, Stream};
use serde::de::DeserializeOwned;
use tokio::sync::{oneshot, watch, Notify};
use tokio::time::Instant;

use super::{window_us, Error, Queue};
use crate::ack::{DeadLetter, DeadLetters, Decided, Decision, Delivery, Link};
use crate::error::{DeliveryError, TryRecvError};

/// The most dead letters one fetch takes from a shard: one, since a letter fetched into a
/// process that dies before handing it out is lost.
const DEAD_PER_FETCH: usize = 1;
/// How often dead letters made by other processes are looked for.
const DEAD_POLL: Duration = Duration::from_secs(1);
/// The longest a waiting receiver sleeps without looking: a wake marker can be lost with a
/// connection, or popped by a receiver that has since stopped waiting.
const LOOK_AGAIN: Duration = Duration::from_secs(1);
/// How long the waking connection blocks at a time: a receiver that stops waiting leaves
/// it blocked this long at most.
const WAKE_BLOCK_SECS: f64 = 1.0;

/// The stream's `recv` in progress.
type NextBatch<K, V> = Pin<Box<dyn Future<Output = Option<Vec<Delivery<K, V>>>> + Send>>;
/// A pull's reply: now (ms), ms until the next wake or -1, closed, pending, deliveries.
type PullReply = (i64, i64, i64, i64, Vec<Taken>);
/// A delivery as the pull script gives it: key, id, attempt, entered (ms), values.
type Taken = (Vec<u8>, String, u32, i64, Vec<Vec<u8>>);
/// A dead-letter fetch's reply: closed, pending, records of key, "attempts|count|reason",
/// values.
type DeadReply = (i64, i64, Vec<(Vec<u8>, String, Vec<Vec<u8>>)>);

/// The receiving half of a Redis queue: a [`Stream`] of batches of [`Delivery`]s, each one
/// key's values, to decide as with the in-memory acknowledging receiver.
///
/// A delivery is leased to this receiver while it is held: the receiver renews the lease
/// every third of [`Builder::lease`](super::Builder::lease), from a task of its own, until
/// the delivery is decided or dropped. While a key has a delivery in flight, its newer
/// values wait. Clones share the deliveries they hold and the connection, and each batch
/// goes to one of them.
///
/// The stream ends once the queue is closed and empty, nothing in flight; through a server
/// outage it keeps trying, with a backoff of up to a second. [`recv`](Self::recv) returns
/// the errors.
///
/// [`Stream`]: futures_core::Stream
pub struct Receiver<K, V> {
    shared: Arc<Shared<K, V>>,
    /// The stream's pending `recv`, kept across polls. Behind a mutex only so that the
    /// receiver is `Sync`, and the futures of its `&self` methods `Send`: only `poll_next`
    /// touches it, through `&mut self`, with no locking.
    next: Mutex<Option<NextBatch<K, V>>>,
    ended: bool,
}

struct Shared<K, V> {
    queue: Arc<Queue>,
    link: Arc<RedisLink<K, V>>,
    /// The shard the next pull starts with.
    turn: AtomicUsize,
    wake: Arc<Wake>,
}

/// Early wakes: a task pops the shards' markers with `BZPOPMIN` while a receiver waits.
struct Wake {
    /// How many receivers wait now.
    waiting: watch::Sender<usize>,
    woken: Notify,
}

/// A delivery, or a dead letter, whose key or values did not decode: it left the queue, and
/// waits in Redis to be taken with [`Receiver::take_undecodable`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Undecodable {
    /// The key, as encoded.
    pub key: Vec<u8>,
    /// The delivery's values, as encoded, in the order they were sent.
    pub values: Vec<Vec<u8>>,
    /// The delivery's attempt.
    pub attempts: u32,
    /// What did not decode, and why.
    pub reason: String,
}

impl<K, V> Receiver<K, V>
where
    K: DeserializeOwned + Send + 'static,
    V: DeserializeOwned + Send + 'static,
{
    pub(super) fn new(queue: Arc<Queue>, blocking: MultiplexedConnection) -> Self {
        let link = Arc::new_cyclic(|me| RedisLink {
            me: me.clone(),
            queue: Arc::clone(&queue),
            handle: tokio::runtime::Handle::current(),
            held: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            dead: Mutex::new(DeadState::default()),
            dead_kick: Arc::new(Notify::new()),
            _types: PhantomData,
        });
        tokio::spawn(renew(Arc::downgrade(&link), queue.config.lease));
        let wake = Arc::new(Wake {
            waiting: watch::Sender::new(0),
            woken: Notify::new(),
        });
        tokio::spawn(watch_wakes(
            Arc::downgrade(&wake),
            Arc::clone(&queue),
            blocking,
        ));
        Receiver {
            shared: Arc::new(Shared {
                queue,
                link,
                turn: AtomicUsize::new(0),
                wake,
            }),
            next: Mutex::new(None),
            ended: false,
        }
    }

    /// Waits for the next batch: the due keys, at most `max_batch` values and 10,000 keys in
    /// all, each key as a [`Delivery`]. `Ok(None)` once the queue is closed and empty,
    /// nothing in flight. A batch holds the keys of one shard. Each look at the queue goes
    /// through the shards in turn, starting one shard further on than the look before it (on
    /// this receiver or a clone), and hands out the keys due in the first shard that has any.
    ///
    /// # Errors
    ///
    /// If the server cannot be reached or answers with an error. The receiver stays
    /// usable: a later call tries again. An error after the pull reached the server (its
    /// reply lost with the connection) costs its batch an attempt, as a dropped `recv` does.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe. A `recv` dropped after its first poll may have taken a batch: if it
    /// is dropped while a pull is on its way, the keys it took stay leased to no one until
    /// the lease runs out; if it is dropped after, its deliveries are dropped, and so retried
    /// at once. Either way the batch goes out again with `attempt + 1`, and on its last
    /// attempt to the dead letters, unseen. The [`Stream`](futures_core::Stream) keeps a pull
    /// in progress across dropped `next()` futures, so `select!` on `next()` loses nothing as
    /// long as the stream is polled again: a pull kept by a stream never polled again costs
    /// its batch an attempt once the lease runs out.
    pub async fn recv(&mut self) -> Result<Option<Vec<Delivery<K, V>>>, Error> {
        Arc::clone(&self.shared).next_batch().await
    }

    /// The dead letters: values retried on their last attempt, or whose lease ran out on
    /// it. While a task awaits the stream they are fetched from Redis, one a shard at a
    /// time: at once when a decision of this receiver makes one, and once a second
    /// otherwise. A letter fetched and not handed out goes back to Redis when the last
    /// handle of this receiver (clones, streams and deliveries) is dropped, by a task on the
    /// tokio runtime; one fetched into a process that dies first, or whose runtime stops
    /// before that task runs, is lost. The stream ends once the queue is closed and
    /// empty and no dead letter is left.
    pub fn dead_letters(&self) -> DeadLetters<K, V> {
        DeadLetters::new(Arc::clone(&self.shared.link) as Arc<dyn Link<K, V>>)
    }

    /// Takes up to `max` of the deliveries whose key or values did not decode as `K` and
    /// `V`, with the reason. Such a delivery (all of its values) leaves the queue when it
    /// is pulled, and the other keys go on; a dead letter that does not decode goes there
    /// too.
    ///
    /// # Errors
    ///
    /// If the server cannot be reached or answers with an error.
    pub async fn take_undecodable(&self, max: usize) -> Result<Vec<Undecodable>, Error> {
        let mut out = Vec::new();
        for shard in 0..self.shared.queue.shards.len() {
            let want = max - out.len();
            if want == 0 {
                break;
            }
            let (_, _, records) = self.shared.queue.take_dead(shard, "bad", want).await?;
            for (key, header, values) in records {
                let (attempts, reason) = parse_header(&header);
                out.push(Undecodable {
                    key,
                    values,
                    attempts,
                    reason,
                });
            }
        }
        Ok(out)
    }

    /// Closes the queue for good, as [`Sender::close`](super::Sender::close) does.
    ///
    /// # Errors
    ///
    /// If the server could not be reached, or answered with an error.
    pub async fn close(&self) -> Result<(), Error> {
        self.shared.queue.close().await
    }

    /// How many values the queue holds, in flight included (dead letters and undecodable
    /// deliveries not counted).
    ///
    /// # Errors
    ///
    /// If the server cannot be reached or answers with an error.
    pub async fn len(&self) -> Result<u64, Error> {
        let mut conn = self.shared.queue.conn.clone();
        // Every shard's count in one pipeline: one round trip, however many shards.
        let mut pipe = ::redis::pipe();
        for prefix in &self.shared.queue.shards {
            pipe.cmd("HGET")
                .arg(format!("{prefix}:meta"))
                .arg("pending");
        }
        let counts: Vec<Option<u64>> = pipe
            .query_async(&mut conn)
            .await
            .map_err(|err| Error::from_redis(err, &self.shared.queue.config.name))?;
        Ok(counts.into_iter().flatten().sum())
    }

    /// Whether the queue holds no value, in flight or not.
    ///
    /// # Errors
    ///
    /// As for [`len`](Self::len).
    pub async fn is_empty(&self) -> Result<bool, Error> {
        Ok(self.len().await? == 0)
    }
}

impl<K, V> Shared<K, V>
where
    K: DeserializeOwned + Send + 'static,
    V: DeserializeOwned + Send + 'static,
{
    async fn next_batch(self: Arc<Self>) -> Result<Option<Vec<Delivery<K, V>>>, Error> {
        let _waiting = Waiting::new(&self.wake);
        let shards = self.queue.shards.len();
        loop {
            // Enabled before the pulls, so that a marker popped meanwhile is not missed.
            let woken = self.wake.woken.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let start = self.turn.fetch_add(1, Ordering::Relaxed);
            let mut wait: Option<u64> = None;
            let mut ended = true;
            for i in 0..shards {
                let shard = (start + i) % shards;
                let (now, next, closed, pending, taken) = self.queue.pull(shard).await?;
                let had = !taken.is_empty();
                let batch = self.deliveries(shard, now, taken).await;
                if !batch.is_empty() {
                    // The pull set the wake marker if more waits.
                    return Ok(Some(batch));
                }
                ended &= closed == 1 && pending == 0;
                // Values that did not decode left: look again at once.
                let next = if had {
                    Some(0)
                } else {
                    u64::try_from(next).ok()
                };
                wait = match (wait, next) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            if ended {
                // The other receivers' streams end too.
                for shard in 0..shards {
                    self.queue.poke(shard).await;
                }
                return Ok(None);
            }
            match wait.map_or(LOOK_AGAIN, |ms| Duration::from_millis(ms).min(LOOK_AGAIN)) {
                Duration::ZERO => tokio::task::yield_now().await,
                wait => {
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = woken => {}
                    }
                }
            }
        }
    }

    /// Decodes what a pull took into deliveries; what does not decode leaves the queue for
    /// the undecodable list.
    async fn deliveries(&self, shard: usize, now: i64, taken: Vec<Taken>) -> Vec<Delivery<K, V>> {
        let mut batch = Vec::with_capacity(taken.len());
        let mut bad = Vec::new();
        let at = Instant::now();
        for (key_bytes, bid, attempt, entered, values) in taken {
            match decode::<K, V>(&key_bytes, &values) {
                Ok((key, values)) => {
                    let ago = Duration::from_millis(u64::try_from(now - entered).unwrap_or(0));
                    let entered = at.checked_sub(ago).unwrap_or(at);
                    let id = self.link.hold(shard, bid, key_bytes);
                    let link = Arc::clone(&self.link) as Arc<dyn Link<K, V>>;
                    batch.push(Delivery::new(key, values, attempt, entered, id, link));
                }
                Err(reason) => bad.push(("bad", bid, key_bytes, reason)),
            }
        }
        if !bad.is_empty() {
            // Should this fail, the lease runs out and the next pull tries again.
            let _ = self.queue.decide(shard, &bad).await;
        }
        batch
    }
}

/// Counts a receiver among those waiting while it lives.
struct Waiting<'a>(&'a Wake);

impl<'a> Waiting<'a> {
    fn new(wake: &'a Wake) -> Self {
        wake.waiting.send_modify(|n| *n += 1);
        Waiting(wake)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.send_modify(|n| *n -= 1);
    }
}

fn decode<K: DeserializeOwned, V: DeserializeOwned>(
    key: &[u8],
    values: &[Vec<u8>],
) -> Result<(K, Vec<V>), String> {
    let key = whole(key).map_err(|err| format!("the key does not decode: {err}"))?;
    let values = values
        .iter()
        .enumerate()
        .map(|(i, value)| {
            whole(value).map_err(|err| {
                format!("value {} of {} does not decode: {err}", i + 1, values.len())
            })
        })
        .collect::<Result<_, _>>()?;
    Ok((key, values))
}

/// Decodes `bytes` as a `T` that takes all of them: bytes left over mean another type.
fn whole<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    match postcard::take_from_bytes(bytes) {
        Ok((value, [])) => Ok(value),
        Ok((_, rest)) => Err(format!("{} bytes are left over", rest.len())),
        Err(err) => Err(err.to_string()),
    }
}

/// Splits a dead letter's "attempts|count|reason".
fn parse_header(header: &str) -> (u32, String) {
    let mut parts = header.splitn(3, '|');
    let attempts = parts.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    let reason = parts.nth(1).unwrap_or("").to_string();
    (attempts, reason)
}

impl Queue {
    async fn pull(&self, shard: usize) -> Result<PullReply, Error> {
        let c = &self.config;
        let lease = u64::try_from(c.lease.as_millis()).unwrap_or(u64::MAX);
        self.invoke(
            self.scripts
                .pull
                .arg(&self.shards[shard])
                .arg(c.max_batch)
                .arg(lease)
                .arg(c.max_attempts)
                .arg(c.max_batch.min(10_000)),
        )
        .await
    }

    /// Runs decisions of one shard: (what, id, key, delay µs or reason) each.
    async fn decide(
        &self,
        shard: usize,
        decisions: &[(&str, String, Vec<u8>, String)],
    ) -> Result<Vec<i64>, Error> {
        let mut call = self.scripts.decide.prepare_invoke();
        call.arg(&self.shards[shard]).arg(self.config.max_attempts);
        for (what, bid, key, arg) in decisions {
            call.arg(*what).arg(bid).arg(key).arg(arg);
        }
        self.invoke(&call).await
    }

    async fn take_dead(&self, shard: usize, list: &str, max: usize) -> Result<DeadReply, Error> {
        self.invoke(
            self.scripts
                .dead
                .arg(&self.shards[shard])
                .arg(list)
                .arg(max),
        )
        .await
    }

    /// Sets a shard's wake marker, so that a waiting receiver looks again.
    async fn poke(&self, shard: usize) {
        let mut conn = self.conn.clone();
        // A marker that does not make it only costs a receiver a wait until its timer.
        let _: Result<i64, _> = ::redis::cmd("ZADD")
            .arg(format!("{}:wake", self.shards[shard]))
            .arg(0)
            .arg("w")
            .query_async(&mut conn)
            .await;
    }
}

/// Pops wake markers while a receiver waits, and wakes the waiting ones. A marker popped
/// when none waits any more goes back, for another receiver. Ends with the receivers.
async fn watch_wakes(wake: Weak<Wake>, queue: Arc<Queue>, mut conn: MultiplexedConnection) {
    let keys: Vec<String> = queue.shards.iter().map(|p| format!("{p}:wake")).collect();
    loop {
        let Some(mut waiting) = wake.upgrade().map(|w| w.waiting.subscribe()) else {
            return;
        };
        if waiting.wait_for(|n| *n > 0).await.is_err() {
            return;
        }
        let popped: Result<Option<(String, String, f64)>, _> = ::redis::cmd("BZPOPMIN")
            .arg(&keys)
            .arg(WAKE_BLOCK_SECS)
            .query_async(&mut conn)
            .await;
        match popped {
            Ok(Some((key, _, _))) => {
                let Some(wake) = wake.upgrade() else { return };
                if *wake.waiting.borrow() > 0 {
                    wake.woken.notify_waiters();
                } else {
                    let _: Result<i64, _> = ::redis::cmd("ZADD")
                        .arg(key)
                        .arg(0)
                        .arg("w")
                        .query_async(&mut conn)
                        .await;
                }
            }
            Ok(None) => {}
            Err(_) => {
                // The server went away: the receiver's timer and its errors carry on; try a
                // new connection in a while.
                tokio::time::sleep(Duration::from_secs(1)).await;
                if let Ok(fresh) = queue.connect(None).await {
                    conn = fresh;
                }
            }
        }
    }
}

/// Renews the leases of the deliveries held, every third of a lease. Ends with the link.
async fn renew<K: 'static, V: 'static>(link: Weak<RedisLink<K, V>>, lease: Duration) {
    let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
    let mut tick = tokio::time::interval(lease / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(link) = link.upgrade() else { return };
        let mut by_shard: HashMap<usize, Vec<String>> = HashMap::new();
        for held in link.held.lock().unwrap_or_else(|e| e.into_inner()).values() {
            by_shard
                .entry(held.shard)
                .or_default()
                .push(held.bid.clone());
        }
        let queue = Arc::clone(&link.queue);
        drop(link);
        for (shard, ids) in by_shard {
            let mut call = queue.scripts.extend.prepare_invoke();
            call.arg(&queue.shards[shard]).arg(lease_ms).arg(ids);
            // A lease that could not be renewed may run out: the delivery's decision then
            // reports it.
            let _: Result<Vec<i64>, _> = queue.invoke(&call).await;
        }
    }
}

/// A delivery's place in Redis.
struct Held {
    shard: usize,
    bid: String,
    key: Vec<u8>,
}

/// Where this receiver's deliveries are decided, and its dead letters come from.
struct RedisLink<K, V> {
    /// Itself, for the dead-letter fetcher it starts.
    me: Weak<RedisLink<K, V>>,
    queue: Arc<Queue>,
    handle: tokio::runtime::Handle,
    /// The deliveries not yet decided, by their local id.
    held: Mutex<HashMap<u64, Held>>,
    next_id: AtomicU64,
    dead: Mutex<DeadState<K, V>>,
    /// Wakes the dead-letter fetcher: a dead letter was made, or someone waits.
    dead_kick: Arc<Notify>,
    _types: PhantomData<fn() -> (K, V)>,
}

struct DeadState<K, V> {
    /// Letters fetched and not yet taken, each with its record as Redis held it, to put
    /// back should this process let go of them.
    letters: VecDeque<(DeadLetter<K, V>, Record)>,
    waiters: HashMap<u64, Waker>,
    next_waiter: u64,
    /// The queue is closed and empty, and no dead letter is left.
    ended: bool,
    fetching: bool,
}

/// A dead letter as Redis holds it: its shard, key, "attempts|count|reason" and values.
struct Record {
    shard: usize,
    key: Vec<u8>,
    header: String,
    values: Vec<Vec<u8>>,
}

impl Queue {
    /// Puts dead letters back in front of their shards' lists, in their order.
    async fn put_back(&self, records: Vec<Record>) {
        let mut conn = self.conn.clone();
        for record in records.into_iter().rev() {
            let mut cmd = ::redis::cmd("LPUSH");
            cmd.arg(format!("{}:dead", self.shards[record.shard]));
            for value in record.values.iter().rev() {
                cmd.arg(value);
            }
            cmd.arg(record.header).arg(record.key);
            // Should this fail, the letter is lost: the server is gone, and so is the
            // process that holds it, soon.
            let _: Result<i64, _> = cmd.query_async(&mut conn).await;
        }
    }
}

impl<K, V> Drop for RedisLink<K, V> {
    fn drop(&mut self) {
        let dead = self.dead.get_mut().unwrap_or_else(|e| e.into_inner());
        let records: Vec<Record> = dead.letters.drain(..).map(|(_, raw)| raw).collect();
        if !records.is_empty() {
            let queue = Arc::clone(&self.queue);
            self.handle
                .spawn(async move { queue.put_back(records).await });
        }
    }
}

impl<K, V> Default for DeadState<K, V> {
    fn default() -> Self {
        DeadState {
            letters: VecDeque::new(),
            waiters: HashMap::new(),
            next_waiter: 0,
            ended: false,
            fetching: false,
        }
    }
}

impl<K, V> RedisLink<K, V> {
    fn hold(&self, shard: usize, bid: String, key: Vec<u8>) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let held = Held { shard, bid, key };
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, held);
        id
    }

    fn take(&self, id: u64) -> Option<Held> {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id)
    }

    fn dead(&self) -> std::sync::MutexGuard<'_, DeadState<K, V>> {
        self.dead.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the dead-letter fetcher if it is not running: it fetches once, and goes on
    /// while someone waits.
    fn start_fetch(&self, dead: &mut DeadState<K, V>)
    where
        K: DeserializeOwned + Send + 'static,
        V: DeserializeOwned + Send + 'static,
    {
        if !dead.fetching {
            dead.fetching = true;
            self.handle.spawn(fetch_dead(
                self.me.clone(),
                Arc::clone(&self.queue),
                Arc::clone(&self.dead_kick),
            ));
        }
    }

    /// Runs decisions of one shard on the runtime, so that they take effect even if
    /// nobody awaits them (a dropped delivery's retry).
    fn run(
        &self,
        shard: usize,
        decisions: Vec<(&'static str, String, Vec<u8>, String)>,
    ) -> Decided<()> {
        let queue = Arc::clone(&self.queue);
        let kick = Arc::clone(&self.dead_kick);
        let (tx, rx) = oneshot::channel();
        self.handle.spawn(async move {
            let outcome = queue.decide(shard, &decisions).await;
            if matches!(&outcome, Ok(codes) if codes.contains(&2)) {
                kick.notify_one();
            }
            let _ = tx.send(outcome);
        });
        Decided::waiting(async move {
            match rx.await {
                Ok(Ok(codes)) if codes.contains(&0) => Err(DeliveryError::LeaseLost),
                Ok(Ok(_)) => Ok(()),
                Ok(Err(err)) => Err(DeliveryError::Io(Arc::new(std::io::Error::other(err)))),
                Err(_) => Err(DeliveryError::Io(Arc::new(std::io::Error::other(
                    "the runtime shut down before the decision was sent",
                )))),
            }
        })
    }
}

impl<K, V> Link<K, V> for RedisLink<K, V>
where
    K: DeserializeOwned + Send + 'static,
    V: DeserializeOwned + Send + 'static,
{
    fn decide(&self, id: u64, decision: Decision<K, V>) -> Decided<()> {
        let Some(held) = self.take(id) else {
            return Decided::done(Err(DeliveryError::LeaseLost));
        };
        let (what, arg) = match decision {
            Decision::Ack | Decision::GiveUp => ("ack", String::new()),
            Decision::Retry { after, .. } => ("retry", window_us(after).to_string()),
        };
        self.run(held.shard, vec![(what, held.bid, held.key, arg)])
    }

    fn ack_all(&self, ids: &[u64]) -> Decided<()> {
        let mut by_shard: HashMap<usize, Vec<_>> = HashMap::new();
        let mut lost = false;
        for id in ids {
            match self.take(*id) {
                Some(held) => by_shard.entry(held.shard).or_default().push((
                    "ack",
                    held.bid,
                    held.key,
                    String::new(),
                )),
                None => lost = true,
            }
        }
        let runs: Vec<_> = by_shard
            .into_iter()
            .map(|(shard, decisions)| self.run(shard, decisions))
            .collect();
        Decided::waiting(async move {
            let mut outcome = if lost {
                Err(DeliveryError::LeaseLost)
            } else {
                Ok(())
            };
            for run in runs {
                outcome = outcome.and(run.await);
            }
            outcome
        })
    }

    fn poll_dead(
        &self,
        waiting: &mut Option<u64>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<DeadLetter<K, V>>> {
        let mut dead = self.dead();
        if let Some((letter, _)) = dead.letters.pop_front() {
            if let Some(id) = waiting.take() {
                dead.waiters.remove(&id);
            }
            return Poll::Ready(Some(letter));
        }
        if dead.ended {
            return Poll::Ready(None);
        }
        let id = *waiting.get_or_insert_with(|| {
            dead.next_waiter += 1;
            dead.next_waiter
        });
        dead.waiters.insert(id, cx.waker().clone());
        self.start_fetch(&mut dead);
        Poll::Pending
    }

    fn try_dead(&self) -> Result<DeadLetter<K, V>, TryRecvError> {
        let mut dead = self.dead();
        match dead.letters.pop_front() {
            Some((letter, _)) => Ok(letter),
            None if dead.ended => Err(TryRecvError::Disconnected),
            None => {
                // One fetch, so that a later call may find what Redis holds.
                self.start_fetch(&mut dead);
                Err(TryRecvError::Empty)
            }
        }
    }

    fn stop_dead(&self, waiting: &mut Option<u64>) {
        if let Some(id) = waiting.take() {
            self.dead().waiters.remove(&id);
        }
    }
}

/// Fetches dead letters while someone waits for them: at once when this process made one,
/// once a second otherwise. Ends when no one waits, or the dead letters have ended.
async fn fetch_dead<K, V>(link: Weak<RedisLink<K, V>>, queue: Arc<Queue>, kick: Arc<Notify>)
where
    K: DeserializeOwned + Send + 'static,
    V: DeserializeOwned + Send + 'static,
{
    loop {
        let mut letters = Vec::new();
        let mut ended = true;
        for shard in 0..queue.shards.len() {
            match queue.take_dead(shard, "dead", DEAD_PER_FETCH).await {
                Ok((closed, pending, records)) => {
                    ended &= closed == 1 && pending == 0 && records.is_empty();
                    for (key, header, values) in records {
                        let (attempts, _) = parse_header(&header);
                        match decode::<K, V>(&key, &values) {
                            Ok((typed_key, typed_values)) => {
                                let letter = DeadLetter {
                                    key: typed_key,
                                    values: typed_values,
                                    attempts,
                                };
                                let record = Record {
                                    shard,
                                    key,
                                    header,
                                    values,
                                };
                                letters.push((letter, record));
                            }
                            Err(reason) => {
                                queue.push_bad(shard, key, attempts, &reason, values).await;
                            }
                        }
                    }
                }
                Err(_) => ended = false,
            }
        }
        let got = !letters.is_empty();
        {
            let Some(link) = link.upgrade() else {
                queue
                    .put_back(letters.into_iter().map(|(_, raw)| raw).collect())
                    .await;
                return;
            };
            let mut dead = link.dead();
            dead.letters.extend(letters);
            dead.ended = ended && dead.letters.is_empty();
            for waker in dead.waiters.values() {
                waker.wake_by_ref();
            }
            // Each waiter takes one letter: with a letter here for each, another fetch would
            // only hold letters that no one awaits, and that a crash would lose. A waiter
            // woken stays in `waiters` until it polls, so this counts it too.
            if dead.ended || dead.waiters.len() <= dead.letters.len() {
                dead.fetching = false;
                return;
            }
        }
        if !got {
            tokio::select! {
                () = kick.notified() => {}
                () = tokio::time::sleep(DEAD_POLL) => {}
            }
        }
    }
}

impl Queue {
    /// Moves a dead letter that does not decode to the undecodable list.
    async fn push_bad(
        &self,
        shard: usize,
        key: Vec<u8>,
        attempts: u32,
        reason: &str,
        values: Vec<Vec<u8>>,
    ) {
        let header = format!("{attempts}|{}|{reason}", values.len());
        let mut conn = self.conn.clone();
        // Should this fail, the letter is lost: it is logged nowhere else.
        let _: Result<i64, _> = ::redis::cmd("RPUSH")
            .arg(format!("{}:bad", self.shards[shard]))
            .arg(key)
            .arg(header)
            .arg(values)
            .query_async(&mut conn)
            .await;
    }
}

impl<K, V> Stream for Receiver<K, V>
where
    K: DeserializeOwned + Send + 'static,
    V: DeserializeOwned + Send + 'static,
{
    type Item = Vec<Delivery<K, V>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let shared = &this.shared;
        let slot = this.next.get_mut().unwrap_or_else(PoisonError::into_inner);
        let next = slot.get_or_insert_with(|| {
            let shared = Arc::clone(shared);
            Box::pin(async move {
                // Through an outage, try again with a backoff of up to a second.
                let mut backoff = Duration::from_millis(50);
                loop {
                    match Arc::clone(&shared).next_batch().await {
                        Ok(batch) => return batch,
                        Err(_) => {
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(Duration::from_secs(1));
                        }
                    }
                }
            })
        });
        let polled = next.as_mut().poll(cx);
        if let Poll::Ready(batch) = &polled {
            *slot = None;
            this.ended = batch.is_none();
        }
        polled
    }
}

impl<K, V> FusedStream for Receiver<K, V>
where
    K: DeserializeOwned + Send + 'static,
    V: DeserializeOwned + Send + 'static,
{
    fn is_terminated(&self) -> bool {
        self.ended
    }
}

impl<K, V> Clone for Receiver<K, V> {
    fn clone(&self) -> Self {
        Receiver {
            shared: Arc::clone(&self.shared),
            next: Mutex::new(None),
            ended: false,
        }
    }
}

impl<K, V> fmt::Debug for Receiver<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver")
            .field("queue", &self.shared.queue.config.name)
            .finish_non_exhaustive()
    }
}
