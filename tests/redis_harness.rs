//! The harness the `redis` tests stand on: a real `redis-server` that starts, answers,
//! dies by `SIGKILL` and comes back. Skips where `redis-server` is not on `PATH`, unless
//! `CI` is set (see `common/redis_server.rs`).

#[path = "common/redis_server.rs"]
mod redis_server;

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use redis_server::RedisServer;

/// Whether anything accepts a connection on the port.
fn accepts(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
}

#[test]
fn smoke() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    assert_eq!(
        server.url(),
        format!("redis://127.0.0.1:{}/", server.port())
    );
    assert!(server.dir().is_dir());
    assert!(server.command(&["PING"]).contains("PONG"));
    assert_eq!(
        server.command(&["SET", "greeting", "hello world"]),
        "+OK\r\n"
    );
    assert_eq!(
        server.command(&["GET", "greeting"]),
        "$11\r\nhello world\r\n"
    );
    assert_eq!(server.command(&["GET", "missing"]), "$-1\r\n");
    assert_eq!(server.command(&["INCRBY", "n", "5"]), ":5\r\n");
    assert!(server.command(&["NOSUCHCOMMAND"]).starts_with("-ERR"));
    assert_eq!(
        server.command(&["MGET", "greeting", "n"]),
        "*2\r\n$11\r\nhello world\r\n$1\r\n5\r\n"
    );
    // Tests may use DEBUG (Redis 7 refuses it unless allowed).
    assert_eq!(server.command(&["DEBUG", "SLEEP", "0"]), "+OK\r\n");
    // The defaults hold: no append-only file, no snapshots.
    assert_eq!(
        server.command(&["CONFIG", "GET", "appendonly"]),
        "*2\r\n$10\r\nappendonly\r\n$2\r\nno\r\n"
    );
    assert_eq!(
        server.command(&["CONFIG", "GET", "save"]),
        "*2\r\n$4\r\nsave\r\n$0\r\n\r\n"
    );
}

#[test]
fn kill_and_restart() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let port = server.port();
    let first = server.pid();
    assert_eq!(server.command(&["SET", "k", "v"]), "+OK\r\n");

    server.kill();
    assert!(
        !accepts(port),
        "something still listens on {port} after kill"
    );

    server.restart();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), first);
    assert!(server.command(&["PING"]).contains("PONG"));
    // Without an append-only file or snapshots, a killed server forgets.
    assert_eq!(server.command(&["GET", "k"]), "$-1\r\n");
}

#[test]
fn aof_survives_sigkill() {
    let Some(mut server) =
        RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
    else {
        return;
    };
    assert_eq!(
        server.command(&["SET", "kept", "after the kill"]),
        "+OK\r\n"
    );
    server.kill();
    server.restart();
    assert_eq!(
        server.command(&["GET", "kept"]),
        "$14\r\nafter the kill\r\n"
    );
}

#[test]
fn drop_kills_and_cleans_up() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let (port, dir) = (server.port(), server.dir().to_path_buf());
    drop(server);
    assert!(
        !accepts(port),
        "something still listens on {port} after drop"
    );
    assert!(!dir.exists(), "{} is still there after drop", dir.display());
}
