//! The origin design's demo, on `keyed_batch::timed`.
//!
//! Four producer tasks each publish `key_k -> value_j_k` every 15 ms (`j` is the producer,
//! `k` counts up). Each key is due 3 s after its first value arrived, and one consumer
//! prints every key's values as they come out, stamped with the wall clock as `mmss.fff`.
//!
//! After `--seconds N` (default 10) the producers stop, the channel closes, whatever is
//! pending comes out at once, and the program exits.
//!
//! ```text
//! cargo run --example customers -- --seconds 5
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keyed_batch::timed;

const PRODUCERS: usize = 4;
const WINDOW: Duration = Duration::from_secs(3);
const EVERY: Duration = Duration::from_millis(15);

#[tokio::main]
async fn main() {
    let seconds = parse_seconds();
    // The origin pulls at most 100 values at a time.
    let (tx, mut rx) = timed::Builder::new(WINDOW).max_batch(100).build();

    let stop = tokio::time::Instant::now() + Duration::from_secs(seconds);
    for j in 0..PRODUCERS {
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(EVERY);
            for k in 0.. {
                if tick.tick().await >= stop {
                    break;
                }
                if tx
                    .send(format!("key_{k}"), format!("value_{j}_{k}"))
                    .await
                    .is_err()
                {
                    break;
                }
            }
            // Dropping the last sender closes the channel: what is pending comes out at once.
        });
    }
    drop(tx);

    let (mut keys, mut values) = (0, 0);
    while let Some(batch) = rx.recv().await {
        let stamp = mmss_fff(SystemTime::now());
        for (key, vals) in batch {
            keys += 1;
            values += vals.len();
            println!("{stamp}: {key}, {}", vals.join(","));
        }
    }
    println!("done: {values} values in {keys} key batches");
}

/// Reads `--seconds N`; 10 when absent.
fn parse_seconds() -> u64 {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => 10,
        [flag, n] if flag == "--seconds" => n
            .parse()
            .unwrap_or_else(|_| usage(&format!("not a number of seconds: {n}"))),
        _ => usage("unknown arguments"),
    }
}

fn usage(problem: &str) -> ! {
    eprintln!("{problem}\nusage: customers [--seconds N]");
    std::process::exit(2)
}

/// The wall clock's minutes, seconds and milliseconds, as the origin prints them.
fn mmss_fff(now: SystemTime) -> String {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs() % 3600;
    format!(
        "{:02}{:02}.{:03}",
        secs / 60,
        secs % 60,
        since.subsec_millis()
    )
}
