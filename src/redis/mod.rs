//! One `timed` queue shared by many processes on many machines, kept in Redis.
//!
//! Producers anywhere [`send`](Sender::send) into the queue by name; receivers anywhere take
//! due keys from it as a [`Stream`] of batches of [`Delivery`]s: the same type the in-memory
//! acknowledging receiver hands out, so code written against one moves to the other. Keys
//! and values are serde types, encoded with [postcard](https://docs.rs/postcard).
//!
//! ```no_run
//! use std::time::Duration;
//! use futures::StreamExt;
//! use keyed_batch::{ack, redis};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), redis::Error> {
//! let queue = redis::Builder::new("redis://127.0.0.1/", "webhooks", Duration::from_secs(1));
//! let tx = queue.sender::<String, String>().await?;
//! let mut rx = queue.receiver::<String, String>().await?;
//!
//! tx.send("customer-1".to_string(), "order placed".to_string()).await.unwrap();
//! let batch = rx.next().await.unwrap();
//! assert_eq!(batch[0].values(), ["order placed".to_string()]);
//! ack::ack_all(batch).await.unwrap();
//! # Ok(())
//! # }
//! ```
//!
//! # How it differs from the in-memory channel
//!
//! | | in memory (`timed::Builder::acked`) | Redis |
//! |---|---|---|
//! | time | tokio's clock, to the tick | the Redis server's clock, to the millisecond: deadlines are rounded up, so nothing is early; the machines' clocks do not matter (the handles' own timeouts and waits are tokio timers, which need tokio's clock running, not paused), and [`entered`](crate::ack::Delivery::entered) is the server's time, kept in whole milliseconds, turned into a local `Instant`: off by up to the pull's round trip and a millisecond |
//! | close | when every sender is gone, or `close()` | only an explicit [`Sender::close`] or [`Receiver::close`], and for good: the queue's name stays closed (unless its data is deleted or lost, when the next handle creates it afresh, open) |
//! | no receiver | sends fail once every receiver is gone | sends succeed: values wait in Redis for a receiver to come |
//! | delivery | exactly once | at least once: a delivery whose lease runs out (its holder died or stalled) goes out again with `attempt + 1` once a receiver's pull reclaims the lease (on its last attempt, to the dead letters instead), and a decision made after that fails with [`LeaseLost`]; a `recv` dropped before it returns also costs its batch an attempt, and so does a decision (or a delivery dropped undecided) that a task on the runtime has not yet sent when the runtime stops |
//! | order | per key, and by deadline across keys | per key; by deadline within a shard, then by arrival, told by the shard's run counter modulo 4,096: of runs due in the same millisecond, one may come before an earlier one when the counter wraps between them (it counts each run started, each `send_by` that may lower a deadline, and each first value sent while its key is in flight); a retried key keeps the place it went out with, even when values came for it meanwhile, in flight or while a `retry_after` held it, and so does the rest of it that a batch cap splits off (in memory the key is then due when its retry is, or its delay ends, or by a `send_by` deadline sent during the delay); best effort across [`shards`](Builder::shards) |
//! | a full queue | a waiting `send` has its place in line | a waiting `send` retries with a backoff of up to 50 ms, in no fixed order; `capacity` counts per shard |
//! | dead letters | count toward `capacity` | kept in Redis, outside `capacity`, until a stream takes them; fetched one a shard at a time while a task awaits the stream, and [`DeadLetters::try_recv`](crate::ack::DeadLetters::try_recv) sees only those fetched (a call that finds none starts a fetch); a letter fetched into a process that dies before handing it out, or whose runtime stops before the task that puts it back runs, is lost |
//! | `len` | pending values only (`Stats::in_flight_values` counts those in flight) | pending and in flight, in one round trip (async, and it may fail) |
//! | undecodable values | cannot happen | the delivery goes to [`Receiver::take_undecodable`] with its reason |
//! | a server error | cannot happen | [`Sender::send`] fails with [`SendError::Failed`]; [`Receiver::recv`], `len`, `is_empty` and `take_undecodable` return [`Error`]; decisions fail with [`Io`]; the batch and dead-letter streams retry until the server is back |
//!
//! # In Redis
//!
//! A queue named `q` lives under the hash tag `{q}` (`{q:0}`, `{q:1}`, … for its shards): a
//! LIST of values per key, a sorted set of the keys that wait, ordered by deadline and then
//! by arrival, a sorted set of the keys a `retry_after` holds, and the leases of the
//! deliveries in flight. It needs Redis 6.2 or later (the scripts use `ZADD … LT` and
//! `LPOP` with a count). The client is a single-node client: Redis Cluster is not
//! supported, though the hash tags keep each shard in one slot. Every change to a key's
//! values or state is one Lua script, which reads the server's `TIME`. A waiting receiver
//! sleeps on a tokio timer set to the next deadline or lease expiry the server reported,
//! and is woken early by a marker it pops with `BZPOPMIN` on a connection of its own. A
//! send sets the marker when it moves the first deadline earlier, a `retry_after` when its
//! delay is the first to end, and a receiver that takes a batch sets it when more waits, so
//! that another receiver learns of it. One marker wakes one receiver; since a marker can be
//! lost with a connection, or with a receiver dropped as it pops one, a waiting receiver
//! also looks once a second.
//!
//! A pull is one script too, and is kept short, since a script holds the server: it
//! reclaims at most 100 leases that ran out, moves at most 1,000 keys whose retry delay is
//! over (or, once the queue is closed, that a delay holds) back into line, and takes at
//! most 10,000 keys. What it leaves is due at once: the receiver's timer is set to now, and
//! its next pull goes on from there.
//!
//! A value is decoded as the receiver's `V` only if it takes all of its bytes, but postcard
//! does not record types: a value of another type with a compatible encoding (a `u32` read
//! as a `u64`) decodes without error.
//!
//! What survives a Redis restart is what Redis persists: with `appendonly yes` and
//! `appendfsync always`, no value whose `send` returned is lost (dead letters fetched into
//! a process aside, as the table says). A server that comes back from an older snapshot
//! rolls the queue back to it: a delivery taken after the snapshot decides nothing of it
//! (its decisions fail with [`LeaseLost`]), and what the snapshot holds of its values goes
//! out again; a delivery that the snapshot holds in flight is still held, and decided as
//! usual.
//!
//! [`Stream`]: futures_core::Stream
//! [`Delivery`]: crate::ack::Delivery
//! [`LeaseLost`]: crate::error::DeliveryError::LeaseLost
//! [`Io`]: crate::error::DeliveryError::Io

mod receiver;
mod sender;

use std::fmt;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{RedisError, Script};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use receiver::{Receiver, Undecodable};
pub use sender::{SendError, Sender};

/// The version of the layout in Redis, checked at open.
const VERSION: &str = "2";
const FLAVOUR: &str = "timed";

/// Builds senders and receivers of one queue in Redis: its server, its name, and its window.
///
/// Every sender and receiver of a queue must be built with the same window and number of
/// shards; the first to open the queue records them, and the others are refused with
/// [`Error::Mismatch`] if theirs differ. A window is recorded in whole microseconds,
/// rounded up, so two windows within the same microsecond are the same. The other settings
/// are each handle's own.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use keyed_batch::redis::Builder;
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), keyed_batch::redis::Error> {
/// let queue = Builder::new("redis://127.0.0.1/", "pushes", Duration::from_millis(500))
///     .max_batch(500)
///     .lease(Duration::from_secs(10))
///     .max_attempts(5);
/// let rx = queue.receiver::<u64, Vec<u8>>().await?;
/// # drop(rx);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
#[must_use]
pub struct Builder {
    url: String,
    name: String,
    window: Duration,
    max_batch: usize,
    capacity: u64,
    lease: Duration,
    max_attempts: u32,
    shards: u16,
}

// By hand, so that a password in the URL stays out of logs.
impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("url", &redacted(&self.url))
            .field("name", &self.name)
            .field("window", &self.window)
            .field("max_batch", &self.max_batch)
            .field("capacity", &self.capacity)
            .field("lease", &self.lease)
            .field("max_attempts", &self.max_attempts)
            .field("shards", &self.shards)
            .finish()
    }
}

/// `url` with its passwords, if any, replaced by `***`: the one in its user info
/// (`redis://:pw@h` and `redis://user:pw@h` keep their user, and user info with no `:` goes
/// whole, since a URL may carry a password alone there; see `redacted_user_info` for
/// where it ends), and the value of every `pass` parameter in its query (where a
/// `redis+unix://` URL carries one).
fn redacted(url: &str) -> String {
    let url = redacted_user_info(url);
    let Some((head, query)) = url.split_once('?') else {
        return url;
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if form_decoded(name) == b"pass" => format!("{name}=***"),
            _ => pair.to_string(),
        })
        .collect();
    format!("{head}?{}", pairs.join("&"))
}

fn redacted_user_info(url: &str) -> String {
    // The user info starts after `://`. A URL that lacks it (a `/` or the `:` left out) is
    // one that fails to parse, and so one that an error shows: there it starts after the
    // first `:/` and the slashes that follow, or at the URL's start if it has no `:/`.
    let start = match url.find("://").or_else(|| url.find(":/")) {
        Some(i) => url.len() - url[i + 1..].trim_start_matches('/').len(),
        None => 0,
    };
    let (head, rest) = url.split_at(start);
    // Not the authority's end at the first `/`: a password may hold a `/`, `?` or `#`
    // that is not percent-encoded, and a URL that fails to parse for it is the one that an
    // error shows. The user info ends at the last `@` before the query or fragment, or at
    // the last `@` of all if none is before them (hiding more than a password, at worst).
    let query = rest.find(['?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..query].rfind('@').or_else(|| rest.rfind('@')) else {
        return url.to_string();
    };
    let (user_info, host) = (&rest[..at], &rest[at + 1..]);
    let user = user_info.split_once(':').map_or("", |(user, _)| user);
    format!("{head}{user}:***@{host}")
}

/// A query parameter's name as the client reads it: `+` is a space and `%XX` a byte.
fn form_decoded(name: &str) -> Vec<u8> {
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|hex| hex.iter().all(u8::is_ascii_hexdigit));
        let hex = hex.map(|hex| {
            let digits = std::str::from_utf8(hex).expect("ASCII");
            u8::from_str_radix(digits, 16).expect("two hex digits")
        });
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
                continue;
            }
            (b'+', _) => out.push(b' '),
            (byte, _) => out.push(byte),
        }
        i += 1;
    }
    out
}

impl Builder {
    /// A queue named `name` on the server at `url` (such as `redis://127.0.0.1:6379/`), whose
    /// keys are due `window` after their first waiting value arrived.
    ///
    /// By default a batch holds at most 1,000 values, the queue has no capacity limit, a
    /// lease lasts 30 seconds, retries are unlimited, and there is one shard.
    pub fn new(url: impl Into<String>, name: impl Into<String>, window: Duration) -> Self {
        Builder {
            url: url.into(),
            name: name.into(),
            window,
            max_batch: 1000,
            capacity: 0,
            lease: Duration::from_secs(30),
            max_attempts: 0,
            shards: 1,
        }
    }

    /// The most values in one batch, over all of its keys. A key whose values do not fit in
    /// what is left of the batch is split: the rest goes out once the part before it is
    /// decided. A batch also holds at most 10,000 keys (see *In Redis* in the module docs).
    ///
    /// # Panics
    ///
    /// Panics if `n` is 0.
    #[track_caller]
    pub fn max_batch(mut self, n: usize) -> Self {
        assert!(n > 0, "max_batch must be at least 1");
        self.max_batch = n;
        self
    }

    /// The most values each shard of the queue holds, those in flight included (dead
    /// letters not): a sender's `send` waits while its value's shard is full. Each sender
    /// enforces its own setting.
    ///
    /// # Panics
    ///
    /// Panics if `n` is 0.
    #[track_caller]
    pub fn capacity(mut self, n: u64) -> Self {
        assert!(n > 0, "capacity must be at least 1");
        self.capacity = n;
        self
    }

    /// How long a delivery is leased to its receiver, in whole milliseconds (a fraction of
    /// one is dropped). A receiver renews the leases of the deliveries it holds every third
    /// of this. A lease that runs out (its holder died or stalled) stays its holder's until
    /// a pull reclaims it (a renewal that comes first keeps it): the next pull of its
    /// shard, by any receiver, reclaims up to 100 leases a pull (see *In Redis* in the
    /// module docs): the values go out again with
    /// `attempt + 1`, or, on the last attempt by that receiver's `max_attempts`, to the dead
    /// letters.
    ///
    /// # Panics
    ///
    /// Panics if `d` is under 10 ms.
    #[track_caller]
    pub fn lease(mut self, d: Duration) -> Self {
        assert!(
            d >= Duration::from_millis(10),
            "a lease must be at least 10 ms"
        );
        self.lease = d;
        self
    }

    /// The most attempts a key's values get: a retry of attempt `n` (a delivery dropped
    /// undecided included), or a lease that runs out on it, sends them to the
    /// [dead letters](Receiver::dead_letters) instead. Each receiver applies its own setting
    /// to the decisions on its deliveries and to the leases its pulls reclaim.
    ///
    /// # Panics
    ///
    /// Panics if `n` is 0.
    #[track_caller]
    pub fn max_attempts(mut self, n: u32) -> Self {
        assert!(n > 0, "max_attempts must be at least 1");
        self.max_attempts = n;
        self
    }

    /// Splits the queue into `n` sub-queues, each under its own hash tag. A key always lives
    /// in the same shard (by a hash of its encoding); receivers take from the shards in
    /// turn, so order across shards is best effort.
    ///
    /// # Panics
    ///
    /// Panics if `n` is 0.
    #[track_caller]
    pub fn shards(mut self, n: u16) -> Self {
        assert!(n > 0, "shards must be at least 1");
        self.shards = n;
        self
    }

    /// Opens the queue for sending, creating it in Redis if it is not there.
    ///
    /// # Errors
    ///
    /// [`Error::Url`] if the URL does not parse, [`Error::Connection`] if the server cannot
    /// be reached, [`Error::Server`] if it refuses the connection (a wrong password, a
    /// database it does not have), [`Error::Mismatch`] if the queue was created with another
    /// window, number of shards or flavour.
    pub async fn sender<K: Serialize, V: Serialize>(&self) -> Result<Sender<K, V>, Error> {
        Ok(Sender::new(Queue::open(self).await?))
    }

    /// Opens the queue for receiving, creating it in Redis if it is not there.
    ///
    /// # Errors
    ///
    /// As for [`sender`](Self::sender).
    pub async fn receiver<K, V>(&self) -> Result<Receiver<K, V>, Error>
    where
        K: DeserializeOwned + Send + 'static,
        V: DeserializeOwned + Send + 'static,
    {
        let queue = Queue::open(self).await?;
        let blocking = queue.connect(None).await?;
        Ok(Receiver::new(queue, blocking))
    }
}

/// Why a Redis queue could not be opened or used.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Error {
    /// The URL does not parse.
    Url {
        /// The URL, with any password in it replaced by `***`. A password may hold a `/`,
        /// `?` or `#` that is not percent-encoded, so in a URL whose only `@` comes after a
        /// `?` or `#`, everything from the first `:` after `://` to that `@` is replaced. In
        /// a URL without `://`, the user info is taken to start after the first `:/` and
        /// the slashes after it, or at the URL's start.
        url: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The server cannot be reached, or the connection to it broke.
    Connection(RedisError),
    /// The server answered with an error.
    Server(RedisError),
    /// The queue in Redis was created with other settings.
    Mismatch {
        /// The queue's name.
        queue: String,
        /// Which setting, with the queue's value and the builder's.
        detail: String,
    },
    /// The queue's data is no longer in Redis (it was deleted, or the server restarted
    /// without persistence), and it was gone again right after this handle created it
    /// afresh. Handles create a queue that is gone afresh by themselves, and go on.
    Gone {
        /// The queue's name.
        queue: String,
    },
    /// A key or value could not be encoded.
    Encode(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Url { url, detail } => write!(f, "bad Redis URL {url:?}: {detail}"),
            Error::Connection(err) => write!(f, "cannot reach Redis: {err}"),
            Error::Server(err) => write!(f, "Redis answered with an error: {err}"),
            Error::Mismatch { queue, detail } => {
                write!(
                    f,
                    "the queue {queue:?} in Redis has other settings: {detail}"
                )
            }
            Error::Gone { queue } => write!(
                f,
                "the queue {queue:?} is no longer in Redis (deleted, or the server restarted \
                 without persistence)"
            ),
            Error::Encode(detail) => write!(f, "a key or value does not encode: {detail}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Connection(err) | Error::Server(err) => Some(err),
            _ => None,
        }
    }
}

impl Error {
    /// An error from making a connection: a server that refused it (a wrong password, a
    /// database it does not have) answered with an error, although the client would
    /// reconnect after a failed login.
    fn from_connecting(err: RedisError, queue: &str) -> Self {
        match err.kind() {
            ::redis::ErrorKind::AuthenticationFailed => Error::Server(err),
            _ => Error::from_redis(err, queue),
        }
    }

    fn from_redis(err: RedisError, queue: &str) -> Self {
        if err.code() == Some("KBGONE") {
            Error::Gone {
                queue: queue.to_string(),
            }
        } else if err.is_io_error()
            || err.is_connection_dropped()
            || err.is_timeout()
            || err.is_unrecoverable_error()
        {
            Error::Connection(err)
        } else {
            Error::Server(err)
        }
    }
}

/// The scripts, each the shared prelude and its own body.
struct Scripts {
    open: Script,
    publish: Script,
    pull: Script,
    decide: Script,
    extend: Script,
    close: Script,
    dead: Script,
}

macro_rules! script {
    ($opening:literal, $body:literal) => {
        Script::new(concat!(
            "local OPENING = ",
            $opening,
            "\n",
            include_str!("lua/prelude.lua"),
            include_str!($body)
        ))
    };
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            open: script!("true", "lua/open.lua"),
            publish: script!("false", "lua/publish.lua"),
            pull: script!("false", "lua/pull.lua"),
            decide: script!("false", "lua/decide.lua"),
            extend: script!("false", "lua/extend.lua"),
            close: script!("false", "lua/close.lua"),
            dead: script!("false", "lua/dead.lua"),
        }
    }
}

/// One open queue: its settings, its scripts, and a connection that reconnects by itself.
struct Queue {
    config: Builder,
    client: ::redis::Client,
    conn: ConnectionManager,
    /// The hash-tagged prefix of each shard.
    shards: Vec<String>,
    scripts: Scripts,
}

impl Queue {
    async fn open(config: &Builder) -> Result<std::sync::Arc<Queue>, Error> {
        let client = ::redis::Client::open(config.url.as_str()).map_err(|err| Error::Url {
            url: redacted(&config.url),
            detail: err.to_string(),
        })?;
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(10)))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_with_config(client.clone(), manager)
            .await
            .map_err(|err| Error::from_connecting(err, &config.name))?;
        let shards = if config.shards == 1 {
            vec![format!("{{{}}}", config.name)]
        } else {
            (0..config.shards)
                .map(|i| format!("{{{}:{i}}}", config.name))
                .collect()
        };
        let queue = Queue {
            config: config.clone(),
            client,
            conn,
            shards,
            scripts: Scripts::new(),
        };
        queue.check_all().await?;
        Ok(std::sync::Arc::new(queue))
    }

    /// Creates the meta data under `prefix` if it is not there, and compares it with ours.
    async fn check(&self, prefix: &str) -> Result<(), Error> {
        let window = window_us(self.config.window).to_string();
        let shards = self.config.shards.to_string();
        let found: Vec<Option<String>> = self
            .invoke_once(
                self.scripts
                    .open
                    .arg(prefix)
                    .arg(&window)
                    .arg(FLAVOUR)
                    .arg(&shards)
                    .arg(VERSION),
            )
            .await?;
        let ours = [
            ("window (µs)", window.as_str()),
            ("flavour", FLAVOUR),
            ("shards", shards.as_str()),
            ("layout version", VERSION),
        ];
        for ((what, mine), theirs) in ours.iter().zip(&found) {
            let theirs = theirs.as_deref().unwrap_or("none");
            if theirs != *mine {
                return Err(Error::Mismatch {
                    queue: self.config.name.clone(),
                    detail: format!("{what} is {theirs} in Redis, {mine} in this builder"),
                });
            }
        }
        Ok(())
    }

    /// Runs a script on the shared connection. If the queue's data is gone (a server that
    /// restarted without persistence), the queue is created afresh and the script runs
    /// once more: what was lost is lost, and the handles go on.
    async fn invoke<T: ::redis::FromRedisValue>(
        &self,
        invocation: &::redis::ScriptInvocation<'_>,
    ) -> Result<T, Error> {
        match self.invoke_once(invocation).await {
            Err(Error::Gone { .. }) => {
                self.check_all().await?;
                self.invoke_once(invocation).await
            }
            outcome => outcome,
        }
    }

    async fn invoke_once<T: ::redis::FromRedisValue>(
        &self,
        invocation: &::redis::ScriptInvocation<'_>,
    ) -> Result<T, Error> {
        let mut conn = self.conn.clone();
        invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|err| Error::from_redis(err, &self.config.name))
    }

    /// Checks, or creates, the meta data of the queue and of each shard.
    async fn check_all(&self) -> Result<(), Error> {
        // The queue's own tag records its settings even when its data is in shards, so that
        // a builder with another number of shards is refused.
        let whole = format!("{{{}}}", self.config.name);
        if self.shards.len() > 1 {
            self.check(&whole).await?;
        }
        for prefix in &self.shards {
            self.check(prefix).await?;
        }
        Ok(())
    }

    /// The shard that holds the key whose encoding is `key`: FNV-1a, so that every process,
    /// on any platform and any Rust, routes a key alike.
    fn shard_of(&self, key: &[u8]) -> usize {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in key {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        (hash % self.shards.len() as u64) as usize
    }

    /// Closes every shard.
    async fn close(&self) -> Result<(), Error> {
        for prefix in &self.shards {
            let _: i64 = self.invoke(&self.scripts.close.arg(prefix)).await?;
        }
        Ok(())
    }

    /// A connection of its own, for blocking commands: `None` disables the response timeout.
    async fn connect(
        &self,
        response_timeout: Option<Duration>,
    ) -> Result<::redis::aio::MultiplexedConnection, Error> {
        let config = ::redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(response_timeout);
        self.client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|err| Error::from_connecting(err, &self.config.name))
    }
}

/// A duration in µs, rounded up, as the scripts take it.
fn window_us(d: Duration) -> i64 {
    let us = d.as_nanos().div_ceil(1000);
    i64::try_from(us).unwrap_or(i64::MAX)
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, Error> {
    postcard::to_stdvec(value).map_err(|err| Error::Encode(err.to_string()))
}
