use super::*;

/// A redis-server of its own on a free port, stopped when dropped.
struct Server {
    child: std::process::Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl Server {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("rp-redis-{}", Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(&dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server (Debian's redis-server package; .ci/run installs it)");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { child, port, dir }
    }

    async fn store(&self, holder: &str) -> Store {
        Store::connect(&format!("redis://127.0.0.1:{}/0", self.port), holder, None)
            .await
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn held(acquired: Acquired) -> (Lease, u64) {
    match acquired {
        Acquired::Held(lease, length) => (lease, length),
        other => panic!("not held: {other:?}"),
    }
}

#[tokio::test]
async fn a_session_is_created_once_and_read_back_in_order() {
    let server = Server::start();
    let store = server.store("a").await;
    let id = Uuid::new_v4();
    assert!(store.create(id, 12.5, b"first").await.unwrap());
    assert!(
        !store.create(id, 13.0, b"again").await.unwrap(),
        "the id is taken"
    );
    let (lease, length) = held(store.acquire(id, Duration::from_secs(5)).await.unwrap());
    assert_eq!(length, 1);
    assert_eq!(
        store.append(&lease, 1, b"second", &[]).await.unwrap(),
        Appended::At(2)
    );
    assert_eq!(
        store.entries(id, 0).await.unwrap(),
        Some(vec![b"first".to_vec(), b"second".to_vec()])
    );
    assert_eq!(
        store.entries(id, 1).await.unwrap(),
        Some(vec![b"second".to_vec()])
    );
    assert_eq!(store.sessions().await.unwrap(), [(id, 12.5)]);
    assert_eq!(store.entries(Uuid::new_v4(), 0).await.unwrap(), None);
}

#[tokio::test]
async fn one_replica_at_a_time_holds_a_session_and_tokens_only_grow() {
    let server = Server::start();
    let (a, b) = (server.store("a").await, server.store("b").await);
    let id = Uuid::new_v4();
    a.create(id, 0.0, b"created").await.unwrap();
    let (lease, _) = held(a.acquire(id, Duration::from_secs(5)).await.unwrap());
    let Acquired::Busy(wait) = b.acquire(id, Duration::from_secs(5)).await.unwrap() else {
        panic!("a second holder");
    };
    assert!(wait <= Duration::from_secs(5) && wait > Duration::ZERO);
    assert!(a.release(&lease).await.unwrap());
    assert!(!a.release(&lease).await.unwrap(), "released once");
    let (taken, length) = held(b.acquire(id, Duration::from_secs(5)).await.unwrap());
    assert_eq!(length, 1);
    assert!(taken.token > lease.token);
    assert_eq!(
        a.acquire(Uuid::new_v4(), Duration::from_secs(5))
            .await
            .unwrap(),
        Acquired::Missing
    );
}

/// The fencing guarantee: a replica whose lease ran out while it worked (a pause, a partition)
/// writes nothing once another took the session over, and a replica that missed an entry
/// writes nothing either.
#[tokio::test]
async fn a_lapsed_or_stale_replica_writes_nothing() {
    let server = Server::start();
    let (a, b) = (server.store("a").await, server.store("b").await);
    let id = Uuid::new_v4();
    a.create(id, 0.0, b"created").await.unwrap();
    let (slow, _) = held(a.acquire(id, Duration::from_millis(150)).await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (fresh, length) = held(b.acquire(id, Duration::from_secs(5)).await.unwrap());
    assert_eq!(
        b.append(&fresh, length, b"b's turn", &[]).await.unwrap(),
        Appended::At(2)
    );
    assert_eq!(
        a.append(&slow, 1, b"a's late turn", &[]).await.unwrap(),
        Appended::Fenced
    );
    assert_eq!(
        b.append(&fresh, 1, b"from a stale copy", &[])
            .await
            .unwrap(),
        Appended::Moved(2)
    );
    assert_eq!(
        a.entries(id, 0).await.unwrap().unwrap(),
        [b"created".to_vec(), b"b's turn".to_vec()]
    );
    // An image goes in with its turn, and only then.
    let image: &[(&str, &[u8])] = &[("ab12", b"png bytes")];
    assert_eq!(
        a.append(&slow, 2, b"late", image).await.unwrap(),
        Appended::Fenced
    );
    assert_eq!(
        b.append(&fresh, 1, b"stale", image).await.unwrap(),
        Appended::Moved(2)
    );
    assert_eq!(a.image(id, "ab12").await.unwrap(), None);
    assert_eq!(
        b.append(&fresh, 2, b"with an image", image).await.unwrap(),
        Appended::At(3)
    );
    assert_eq!(
        a.image(id, "ab12").await.unwrap(),
        Some(b"png bytes".to_vec())
    );
    assert!(a.delete(id).await.unwrap());
    assert_eq!(
        a.image(id, "ab12").await.unwrap(),
        None,
        "deleted with its session"
    );
}

#[tokio::test]
async fn a_session_is_deleted_once_fleet_wide() {
    let server = Server::start();
    let (a, b) = (server.store("a").await, server.store("b").await);
    let id = Uuid::new_v4();
    a.create(id, 0.0, b"created").await.unwrap();
    let (lease, _) = held(a.acquire(id, Duration::from_secs(5)).await.unwrap());
    let (first, second) = tokio::join!(a.delete(id), b.delete(id));
    assert_eq!(
        [first.unwrap(), second.unwrap()]
            .iter()
            .filter(|d| **d)
            .count(),
        1,
        "exactly one deletion"
    );
    assert_eq!(a.entries(id, 0).await.unwrap(), None);
    assert_eq!(
        a.append(&lease, 1, b"after", &[]).await.unwrap(),
        Appended::Fenced
    );
    assert_eq!(
        b.acquire(id, Duration::from_secs(5)).await.unwrap(),
        Acquired::Missing
    );
    assert!(a.sessions().await.unwrap().is_empty());
}

#[tokio::test]
async fn an_unreachable_store_is_an_error_not_a_hang() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let started = std::time::Instant::now();
    let connected = Store::connect(&format!("redis://127.0.0.1:{port}/0"), "a", None).await;
    assert!(connected.is_err());
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// A renewed lease outlives its first time to live; a replica taking its own lease again
/// (its next turn, while the last one's release is on its way) gets a new token, and the old
/// lease can neither write nor be renewed.
#[tokio::test]
async fn a_lease_is_renewed_and_taken_over_only_by_its_own_replica() {
    let server = Server::start();
    let (a, b) = (server.store("a").await, server.store("b").await);
    let id = Uuid::new_v4();
    a.create(id, 0.0, b"created").await.unwrap();
    let (first, _) = held(a.acquire(id, Duration::from_millis(200)).await.unwrap());
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(a.renew(&first, Duration::from_millis(200)).await.unwrap());
    }
    assert!(matches!(
        b.acquire(id, Duration::from_secs(5)).await.unwrap(),
        Acquired::Busy(_)
    ));
    let (second, length) = held(a.acquire(id, Duration::from_secs(5)).await.unwrap());
    assert!(second.token > first.token);
    assert_eq!(
        a.append(&first, length, b"old", &[]).await.unwrap(),
        Appended::Fenced
    );
    assert!(!a.renew(&first, Duration::from_secs(5)).await.unwrap());
    assert!(!a.release(&first).await.unwrap());
    assert_eq!(
        a.append(&second, length, b"new", &[]).await.unwrap(),
        Appended::At(2)
    );
}

/// With `--session-ttl`, a session no replica changes is dropped by the store itself.
#[tokio::test]
async fn an_idle_session_expires_in_the_store() {
    let server = Server::start();
    let url = format!("redis://127.0.0.1:{}/0", server.port);
    let a = Store::connect(&url, "a", Some(Duration::from_millis(300)))
        .await
        .unwrap();
    let id = Uuid::new_v4();
    a.create(id, 0.0, b"created").await.unwrap();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let (lease, length) = held(a.acquire(id, Duration::from_secs(1)).await.unwrap());
        a.append(&lease, length, b"turn", &[]).await.unwrap();
        a.release(&lease).await.unwrap();
    }
    assert_eq!(a.entries(id, 0).await.unwrap().map(|e| e.len()), Some(4));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(a.entries(id, 0).await.unwrap(), None);
    assert_eq!(
        a.acquire(id, Duration::from_secs(1)).await.unwrap(),
        Acquired::Missing
    );
}
