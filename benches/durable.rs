//! Durable channels: send rates per fsync policy against a bare append-and-sync loop,
//! recovery time, and disk use under a long-held delivery. (Being written.)

fn main() {}
