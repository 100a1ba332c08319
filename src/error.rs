//! Error types for sending and receiving.
//!
//! A send that fails hands the value back, inside the error, so nothing is lost.

use std::error::Error;
use std::fmt;

/// The channel is closed: returned by `send` and `blocking_send` once the channel is closed
/// or every receiver is gone (or this sender was closed as a `Sink`), and by `requeue` once
/// a receiver has seen the end of the stream.
///
/// The value that could not be sent is inside, and [`into_inner`](Self::into_inner) hands it
/// back.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use keyed_batch::{error::SendError, timed};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (tx, rx) = timed::channel::<&str, i32>(Duration::from_secs(1));
/// drop(rx);
/// let err = tx.send("a", 1).await.unwrap_err();
/// assert_eq!(err, SendError(("a", 1)));
/// assert_eq!(err.into_inner(), ("a", 1));
/// # }
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SendError<T>(pub T);

/// Why [`try_send`](crate::timed::Sender::try_send) could not send: returned by the
/// `try_send` methods.
///
/// Either way, the value is inside.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use keyed_batch::{error::TrySendError, timed};
///
/// let (tx, rx) = timed::Builder::new(Duration::from_secs(1))
///     .capacity(1)
///     .build::<&str, i32>();
/// tx.try_send("a", 1).unwrap();
/// assert_eq!(tx.try_send("a", 2), Err(TrySendError::Full(("a", 2))));
/// rx.close();
/// assert_eq!(tx.try_send("a", 3), Err(TrySendError::Closed(("a", 3))));
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum TrySendError<T> {
    /// The channel has no room for the value now: a limit (`capacity`, `max_weight`,
    /// `max_keys`) is reached, or earlier `send` or `blocking_send` calls wait for room, or
    /// (with `max_keys`) an earlier send of the same key waits for a key slot. A value held
    /// by a `Sink` does not count.
    Full(T),
    /// The channel is closed or every receiver is gone, or this sender was closed as a
    /// `Sink`.
    Closed(T),
}

/// Why [`try_recv`](crate::timed::Receiver::try_recv) returned no batch: returned by the
/// `try_recv` methods.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use keyed_batch::{error::TryRecvError, timed};
///
/// let (tx, mut rx) = timed::channel::<&str, i32>(Duration::from_secs(1));
/// tx.try_send("a", 1).unwrap();
/// assert_eq!(rx.try_recv(), Err(TryRecvError::Empty)); // pending, but not due yet
/// drop(tx); // closing makes everything due at once
/// assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])]));
/// assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TryRecvError {
    /// Nothing can go out now: no key is due yet (values may be pending with a later
    /// deadline), or, in an acknowledging channel, every pending key is in flight or held
    /// by `retry_after`. From a dead-letter stream: no letter is there yet.
    Empty,
    /// The channel is closed and every pending value has been delivered (in an
    /// acknowledging channel, and every delivery decided).
    Disconnected,
}

// ===== impl SendError =====

impl<T> SendError<T> {
    /// Returns the value that could not be sent.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::error::SendError;
    ///
    /// assert_eq!(SendError(("a", 1)).into_inner(), ("a", 1));
    /// ```
    pub fn into_inner(self) -> T {
        self.0
    }

    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> SendError<U> {
        SendError(f(self.0))
    }
}

impl<T> fmt::Debug for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SendError(..)")
    }
}

impl<T> fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sending on a closed channel")
    }
}

impl<T> Error for SendError<T> {}

// ===== impl TrySendError =====

impl<T> TrySendError<T> {
    /// Returns the value that could not be sent.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::error::TrySendError;
    ///
    /// assert_eq!(TrySendError::Full(7).into_inner(), 7);
    /// ```
    pub fn into_inner(self) -> T {
        match self {
            TrySendError::Full(value) | TrySendError::Closed(value) => value,
        }
    }

    /// Whether the channel had no room.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::error::TrySendError;
    ///
    /// assert!(TrySendError::Full(()).is_full());
    /// ```
    pub fn is_full(&self) -> bool {
        matches!(self, TrySendError::Full(_))
    }

    /// Whether the channel was closed.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_batch::error::TrySendError;
    ///
    /// assert!(TrySendError::Closed(()).is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        matches!(self, TrySendError::Closed(_))
    }

    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> TrySendError<U> {
        match self {
            TrySendError::Full(value) => TrySendError::Full(f(value)),
            TrySendError::Closed(value) => TrySendError::Closed(f(value)),
        }
    }
}

impl<T> From<SendError<T>> for TrySendError<T> {
    fn from(err: SendError<T>) -> Self {
        TrySendError::Closed(err.0)
    }
}

impl<T> fmt::Debug for TrySendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrySendError::Full(_) => f.write_str("Full(..)"),
            TrySendError::Closed(_) => f.write_str("Closed(..)"),
        }
    }
}

impl<T> fmt::Display for TrySendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrySendError::Full(_) => f.write_str("sending on a full channel"),
            TrySendError::Closed(_) => f.write_str("sending on a closed channel"),
        }
    }
}

impl<T> Error for TrySendError<T> {}

// ===== impl TryRecvError =====

impl fmt::Display for TryRecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryRecvError::Empty => f.write_str("no batch is due yet"),
            TryRecvError::Disconnected => f.write_str("receiving on a closed and drained channel"),
        }
    }
}

impl Error for TryRecvError {}

/// Why a decision on a [`Delivery`](crate::ack::Delivery) did not take effect: the output of
/// the futures that `ack`, `retry`, `retry_after` and `give_up` return.
///
/// An in-memory channel never returns it: its decisions take effect when they are made.
/// Modes whose decisions are I/O can.
///
/// # Examples
///
/// ```
/// use keyed_batch::error::DeliveryError;
///
/// assert_eq!(DeliveryError::LeaseLost.to_string(), "the delivery's lease ran out");
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum DeliveryError {
    /// The delivery's lease ran out before the decision arrived: its values went back into
    /// the queue, for any receiver, or on their last attempt to the dead letters; or the
    /// queue's data was lost or rolled back with the server. Only a channel whose deliveries
    /// are leased (Redis) returns it.
    LeaseLost,
    /// The decision may not have been recorded: written to a durable channel's log, or sent
    /// to the Redis server (where a reply lost on the way back leaves it unknown). Only
    /// those modes return it.
    Io(std::sync::Arc<std::io::Error>),
}

// ===== impl DeliveryError =====

impl fmt::Display for DeliveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeliveryError::LeaseLost => f.write_str("the delivery's lease ran out"),
            DeliveryError::Io(err) => write!(f, "the decision could not be recorded: {err}"),
        }
    }
}

impl Error for DeliveryError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            DeliveryError::LeaseLost => None,
            DeliveryError::Io(err) => Some(&**err),
        }
    }
}

/// Why a durable channel could not open: returned by
/// [`DurableBuilder::open`](crate::durable::DurableBuilder).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use keyed_batch::{durable::OpenError, timed};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # let dir = std::env::temp_dir().join(format!("kb-doc-e-{}", std::process::id()));
/// # let _ = std::fs::remove_dir_all(&dir);
/// let first = timed::Builder::new(Duration::from_secs(1)).durable(&dir).open::<u8, u8>().await;
/// let second = timed::Builder::new(Duration::from_secs(1)).durable(&dir).open::<u8, u8>().await;
/// assert!(matches!(second, Err(OpenError::Locked { .. })));
/// # drop(first);
/// # }
/// ```
#[cfg(feature = "durable")]
#[cfg_attr(docsrs, doc(cfg(feature = "durable")))]
#[derive(Debug)]
#[non_exhaustive]
pub enum OpenError {
    /// Another channel, in this process or another, has the directory open: a channel
    /// holds it until its every handle is gone, deliveries and decision futures included,
    /// or until its log fails.
    /// (A child process forked in that time holds a copy of the lock until it execs.)
    Locked {
        /// The log's directory.
        dir: std::path::PathBuf,
    },
    /// A segment's header is not this format's: another format version, another codec, or
    /// not a log at all (or a damaged header). `salvage()` does not open past it.
    Header {
        /// The segment.
        segment: std::path::PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// A record that is not at the end of the log is torn or corrupt. `salvage()` opens
    /// with what comes before it.
    Corrupt {
        /// The segment.
        segment: std::path::PathBuf,
        /// Where in it the bad record starts.
        offset: u64,
    },
    /// A pending value's key, value or input (a `timed` deadline, an `ordered` sort key) in
    /// the log does not decode as the type the channel was opened with. (The log does not
    /// record types: another type with a compatible encoding decodes without error.)
    Decode {
        /// The segment.
        segment: std::path::PathBuf,
        /// Where in it the value's record starts.
        offset: u64,
        /// `"key"`, `"value"` or `"input"`.
        what: &'static str,
        /// The codec's message.
        detail: String,
    },
    /// A file or directory of the log could not be read or written.
    Io {
        /// Which one.
        path: std::path::PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
}

#[cfg(feature = "durable")]
impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Locked { dir } => write!(
                f,
                "the log in {} is open already: its lock is held",
                dir.display()
            ),
            OpenError::Header { segment, detail } => {
                write!(f, "segment {}: {detail}", segment.display())
            }
            OpenError::Corrupt { segment, offset } => write!(
                f,
                "segment {}: corrupt record at offset {offset}",
                segment.display()
            ),
            OpenError::Decode {
                segment,
                offset,
                what,
                detail,
            } => write!(
                f,
                "segment {}: the {what} of the record at offset {offset} does not decode: {detail}",
                segment.display()
            ),
            OpenError::Io { path, source } => write!(f, "{}: {source}", path.display()),
        }
    }
}

#[cfg(feature = "durable")]
impl Error for OpenError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            OpenError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
