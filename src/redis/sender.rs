//! The sending half: sends wait in a line per shard, and one task per shard takes all that
//! wait into one script call, so that concurrent sends share a round trip.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use super::{encode, window_us, Error, Queue};

/// The most sends one script call takes.
const MOST_PER_CALL: usize = 512;
/// The longest wait between tries of a send that found the queue full.
const MOST_FULL_BACKOFF: Duration = Duration::from_millis(50);

/// The sending half of a Redis queue: cheap to clone, and each clone shares the connection
/// and the lines of waiting sends.
///
/// Concurrent sends, from clones or from tasks that share one sender, go to Redis together
/// in one script call per shard: while one call is in flight, the next gathers the sends
/// that arrive.
pub struct Sender<K, V> {
    shared: Arc<Shared>,
    _types: PhantomData<fn(K, V)>,
}

struct Shared {
    queue: Arc<Queue>,
    /// One line per shard, served by its task.
    lines: Vec<mpsc::UnboundedSender<Send>>,
}

/// One send, encoded, with the place its outcome goes.
struct Send {
    key: Vec<u8>,
    value: Vec<u8>,
    /// µs until the value is due at the latest, or -1 for the window.
    within: i64,
    outcome: oneshot::Sender<Outcome>,
}

enum Outcome {
    Sent,
    /// The queue was full: the key and value come back, encoded, for the next try.
    Full(Vec<u8>, Vec<u8>),
    Closed,
    Failed(Error),
}

/// Why a send failed: the key and value come back in it.
#[non_exhaustive]
pub enum SendError<T> {
    /// The queue is closed.
    Closed(T),
    /// The send may not have reached Redis, or Redis refused it. After an error of the
    /// connection (a reply lost, say) the value may be in the queue already: sending it
    /// again may send it twice.
    Failed {
        /// What was sent.
        value: T,
        /// Why it failed.
        error: Error,
    },
}

impl<T> SendError<T> {
    /// The value that was not sent.
    pub fn into_inner(self) -> T {
        match self {
            SendError::Closed(value) | SendError::Failed { value, .. } => value,
        }
    }
}

// As `error::SendError` and tokio's: printing one needs no `T: Debug`.
impl<T> fmt::Debug for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::Closed(_) => f.write_str("Closed(..)"),
            SendError::Failed { error, .. } => (f.debug_struct("Failed"))
                .field("error", error)
                .finish_non_exhaustive(),
        }
    }
}

impl<T> fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::Closed(_) => f.write_str("sending on a closed queue"),
            SendError::Failed { error, .. } => write!(f, "the send failed: {error}"),
        }
    }
}

impl<T> std::error::Error for SendError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SendError::Closed(_) => None,
            SendError::Failed { error, .. } => Some(error),
        }
    }
}

impl<K: Serialize, V: Serialize> Sender<K, V> {
    pub(super) fn new(queue: Arc<Queue>) -> Self {
        let lines = (0..queue.shards.len())
            .map(|shard| {
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(serve(Arc::clone(&queue), shard, rx));
                tx
            })
            .collect();
        Sender {
            shared: Arc::new(Shared { queue, lines }),
            _types: PhantomData,
        }
    }

    /// Sends `value` under `key`: due a window after the first of its key's waiting values
    /// arrived, by the server's clock. Resolves when Redis has the value. While the queue is
    /// full, it waits, trying again with a backoff of up to 50 ms.
    ///
    /// # Errors
    ///
    /// [`SendError::Closed`] if the queue is closed, [`SendError::Failed`] if the key or
    /// value does not encode, or the server could not be reached, the connection broke, or
    /// the server refused (or, as [`Error::Connection`], if the tokio runtime the sender was
    /// made on has shut down, since its connection was there). The key and value come back
    /// in either.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: from its first poll the value is with a task that sends it whether
    /// or not the future is kept, so a `send` dropped after its first poll may have put the
    /// value in the queue; one dropped while it waits out a full queue's backoff has not.
    pub async fn send(&self, key: K, value: V) -> Result<(), SendError<(K, V)>> {
        self.send_within(key, value, -1).await
    }

    /// Sends `value` under `key`, due within `within` at the latest: the earlier of
    /// `within` from now and the window after the first of its key's waiting values, by
    /// the server's clock. A key that a `retry_after` holds stays held until its delay
    /// ends: the value joins it.
    ///
    /// # Errors
    ///
    /// As for [`send`](Self::send).
    pub async fn send_by(
        &self,
        key: K,
        value: V,
        within: Duration,
    ) -> Result<(), SendError<(K, V)>> {
        self.send_within(key, value, window_us(within)).await
    }

    async fn send_within(&self, key: K, value: V, within: i64) -> Result<(), SendError<(K, V)>> {
        let encoded = encode(&key).and_then(|k| Ok((k, encode(&value)?)));
        let (key_bytes, value_bytes) = match encoded {
            Ok(encoded) => encoded,
            Err(error) => {
                return Err(SendError::Failed {
                    value: (key, value),
                    error,
                })
            }
        };
        let line = &self.shared.lines[self.shared.queue.shard_of(&key_bytes)];
        let mut backoff = Duration::from_millis(1);
        let mut encoded = (key_bytes, value_bytes);
        loop {
            let (tx, rx) = oneshot::channel();
            let send = Send {
                key: encoded.0,
                value: encoded.1,
                within,
                outcome: tx,
            };
            // The line's task lives as long as the line, which we hold, unless the runtime
            // it was spawned on has shut down: then its connection is gone with it.
            let answer = match line.send(send) {
                Ok(()) => rx.await.ok(),
                Err(_) => None,
            };
            let Some(answer) = answer else {
                return Err(SendError::Failed {
                    value: (key, value),
                    error: runtime_gone(),
                });
            };
            match answer {
                Outcome::Sent => return Ok(()),
                Outcome::Closed => return Err(SendError::Closed((key, value))),
                Outcome::Failed(error) => {
                    return Err(SendError::Failed {
                        value: (key, value),
                        error,
                    })
                }
                Outcome::Full(key_bytes, value_bytes) => {
                    encoded = (key_bytes, value_bytes);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MOST_FULL_BACKOFF);
                }
            }
        }
    }

    /// Closes the queue for good, for every sender and receiver of it: sends fail from now
    /// on, every waiting key is due at once (keys that a retry delay holds come back into
    /// line 1,000 a pull: see *In Redis* in the module docs), and receivers' streams end
    /// once the queue is empty and nothing is in flight.
    ///
    /// # Errors
    ///
    /// If the server could not be reached, or answered with an error.
    pub async fn close(&self) -> Result<(), Error> {
        self.shared.queue.close().await
    }
}

/// Serves one shard's line: takes every send that waits, up to [`MOST_PER_CALL`], into one
/// publish call, and tells each its outcome. Ends when every sender is gone.
async fn serve(queue: Arc<Queue>, shard: usize, mut line: mpsc::UnboundedReceiver<Send>) {
    let mut sends = Vec::with_capacity(MOST_PER_CALL);
    while line.recv_many(&mut sends, MOST_PER_CALL).await > 0 {
        let mut call = queue.scripts.publish.prepare_invoke();
        call.arg(&queue.shards[shard]).arg(queue.config.capacity);
        for send in &sends {
            call.arg(&send.key).arg(&send.value).arg(send.within);
        }
        let taken: Result<i64, Error> = queue.invoke(&call).await;
        for (i, send) in sends.drain(..).enumerate() {
            let outcome = match &taken {
                Ok(-1) => Outcome::Closed,
                Ok(n) if (i as i64) < *n => Outcome::Sent,
                Ok(_) => Outcome::Full(send.key, send.value),
                Err(err) => Outcome::Failed(err.clone()),
            };
            // A send that was cancelled no longer waits for its outcome.
            let _ = send.outcome.send(outcome);
        }
    }
}

impl<K, V> Clone for Sender<K, V> {
    fn clone(&self) -> Self {
        Sender {
            shared: Arc::clone(&self.shared),
            _types: PhantomData,
        }
    }
}

impl<K, V> fmt::Debug for Sender<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender")
            .field("queue", &self.shared.queue.config.name)
            .finish_non_exhaustive()
    }
}

/// The error of a send whose line's task is gone: the runtime the sender was made on has
/// shut down, and the connection with it.
fn runtime_gone() -> Error {
    let gone = std::io::Error::new(
        std::io::ErrorKind::BrokenPipe,
        "the tokio runtime this sender was made on has shut down",
    );
    Error::Connection(gone.into())
}
