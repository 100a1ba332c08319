use keyed_batch::timed;
use std::time::Duration;

#[tokio::test]
async fn smoke() {
    let dir = tempfile::tempdir().unwrap();
    let b = || timed::Builder::new(Duration::from_millis(10)).durable(dir.path());
    let (tx, mut rx) = b().open::<String, u32>().await.unwrap();
    for i in 0..10 {
        tx.send(format!("k{}", i % 3), i).await.unwrap();
    }
    let batch = rx.recv().await.unwrap();
    println!(
        "{:?}",
        batch
            .iter()
            .map(|d| (d.key().clone(), d.values().to_vec()))
            .collect::<Vec<_>>()
    );
    let mut it = batch.into_iter();
    it.next().unwrap().ack().await.unwrap();
    it.next().unwrap().retry().await.unwrap();
    drop(it);
    drop((tx, rx));
    let (tx, mut rx) = b().open::<String, u32>().await.unwrap();
    println!("stats {:?}", rx.stats());
    drop(tx);
    while let Some(batch) = rx.recv().await {
        println!(
            "{:?}",
            batch
                .iter()
                .map(|d| (d.key().clone(), d.values().to_vec(), d.attempt()))
                .collect::<Vec<_>>()
        );
        keyed_batch::ack::ack_all(batch).await.unwrap();
    }
}
