//! The behaviour every backend must have. A backend's test calls [`run`] with a function that
//! opens the same database again each time it is called (after the previous handle is dropped).
//! Test support: a failure is a panic naming what failed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use super::{Backend, BackendError, WriteBatch};

fn put(b: &impl Backend, pairs: &[(&str, &str)]) {
    let mut batch = WriteBatch::default();
    for (k, v) in pairs {
        batch.put(k.as_bytes(), v.as_bytes());
    }
    b.write(batch).expect("write");
}

fn keys(pairs: Vec<super::KeyValue>) -> Vec<String> {
    pairs
        .into_iter()
        .map(|(k, _)| String::from_utf8(k).expect("utf-8 key"))
        .collect()
}

/// Runs every check. `open` must return a handle on the same data each time.
pub fn run<B: Backend>(open: impl Fn() -> B) {
    {
        let b = open();
        atomic_batches(&b);
        conditional_writes(&b);
        scan_order_and_bounds(&b);
        deletes(&b);
        concurrent_conditional_writers(Arc::new(open_after_drop(b, &open)));
        let b = open();
        put(&b, &[("durable/a", "1"), ("durable/b", "2")]);
        b.sync().expect("sync");
    }
    // Reopen: synced data survives.
    let b = open();
    assert_eq!(b.get(b"durable/a").expect("get"), Some(b"1".to_vec()));
    assert_eq!(b.get(b"durable/b").expect("get"), Some(b"2".to_vec()));
    assert_eq!(
        keys(b.scan(b"durable/", b"durable0", 10).expect("scan")),
        ["durable/a", "durable/b"]
    );
}

fn open_after_drop<B: Backend>(b: B, open: &impl Fn() -> B) -> B {
    drop(b);
    open()
}

fn atomic_batches(b: &impl Backend) {
    put(b, &[("atomic/a", "1")]);
    let mut batch = WriteBatch::default();
    batch.put(b"atomic/a".to_vec(), b"2".to_vec());
    batch.put(b"atomic/b".to_vec(), b"2".to_vec());
    batch.delete(b"atomic/a".to_vec());
    batch.put(b"atomic/c".to_vec(), b"3".to_vec());
    b.write(batch).expect("write");
    // Ops apply in order: the delete after the put wins.
    assert_eq!(b.get(b"atomic/a").expect("get"), None);
    assert_eq!(b.get(b"atomic/b").expect("get"), Some(b"2".to_vec()));
    assert_eq!(b.get(b"atomic/c").expect("get"), Some(b"3".to_vec()));
}

fn conditional_writes(b: &impl Backend) {
    put(b, &[("cond/rev", "1")]);
    // A failed expectation writes nothing, not even the ops before the failing key.
    let mut batch = WriteBatch::default();
    batch.expect(b"cond/rev".to_vec(), Some(b"0".to_vec()));
    batch.put(b"cond/x".to_vec(), b"x".to_vec());
    batch.put(b"cond/rev".to_vec(), b"2".to_vec());
    match b.write(batch) {
        Err(BackendError::Conflict { key }) => assert_eq!(key, "cond/rev"),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(b.get(b"cond/x").expect("get"), None);
    assert_eq!(b.get(b"cond/rev").expect("get"), Some(b"1".to_vec()));
    // Absent-key expectations.
    let mut batch = WriteBatch::default();
    batch.expect(b"cond/new".to_vec(), None);
    batch.expect(b"cond/rev".to_vec(), Some(b"1".to_vec()));
    batch.put(b"cond/new".to_vec(), b"n".to_vec());
    b.write(batch).expect("conditions hold");
    let mut batch = WriteBatch::default();
    batch.expect(b"cond/new".to_vec(), None);
    batch.put(b"cond/new".to_vec(), b"again".to_vec());
    assert!(matches!(b.write(batch), Err(BackendError::Conflict { .. })));
    assert_eq!(b.get(b"cond/new").expect("get"), Some(b"n".to_vec()));
}

fn scan_order_and_bounds(b: &impl Backend) {
    // Inserted out of order, with binary-significant bytes.
    let mut batch = WriteBatch::default();
    for k in [
        b"scan/b".to_vec(),
        b"scan/a".to_vec(),
        b"scan/\x00".to_vec(),
        b"scan/\xff".to_vec(),
        b"scan/aa".to_vec(),
        b"scan0".to_vec(),
        b"scan.".to_vec(),
    ] {
        batch.put(k, b"v".to_vec());
    }
    b.write(batch).expect("write");
    let all = b.scan(b"scan/", b"scan0", 100).expect("scan");
    let got: Vec<Vec<u8>> = all.into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        got,
        [
            b"scan/\x00".to_vec(),
            b"scan/a".to_vec(),
            b"scan/aa".to_vec(),
            b"scan/b".to_vec(),
            b"scan/\xff".to_vec()
        ]
    );
    // Start inclusive, end exclusive, limit honoured.
    assert_eq!(
        keys(b.scan(b"scan/a", b"scan/b", 100).expect("scan")),
        ["scan/a", "scan/aa"]
    );
    assert_eq!(
        keys(b.scan(b"scan/a", b"scan0", 2).expect("scan")),
        ["scan/a", "scan/aa"]
    );
    assert!(b.scan(b"scan/b", b"scan/a", 10).expect("scan").is_empty());
    assert!(b.scan(b"scan/b", b"scan/b", 10).expect("scan").is_empty());
}

fn deletes(b: &impl Backend) {
    put(b, &[("del/a", "1"), ("del/b", "2")]);
    let mut batch = WriteBatch::default();
    batch.delete(b"del/a".to_vec());
    batch.delete(b"del/missing".to_vec());
    b.write(batch)
        .expect("deleting a missing key is not an error");
    assert_eq!(keys(b.scan(b"del/", b"del0", 10).expect("scan")), ["del/b"]);
}

/// Many threads increment one counter with compare-and-set; no increment may be lost.
fn concurrent_conditional_writers<B: Backend>(b: Arc<B>) {
    put(b.as_ref(), &[("counter", "0")]);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let b = Arc::clone(&b);
            std::thread::spawn(move || {
                let mut done = 0;
                while done < 50 {
                    let cur = b.get(b"counter").expect("get").expect("counter exists");
                    let n: u64 = String::from_utf8_lossy(&cur).parse().expect("number");
                    let mut batch = WriteBatch::default();
                    batch.expect(b"counter".to_vec(), Some(cur));
                    batch.put(b"counter".to_vec(), (n + 1).to_string().into_bytes());
                    batch.put(format!("inc/{t}/{done}").into_bytes(), b"".to_vec());
                    match b.write(batch) {
                        Ok(()) => done += 1,
                        Err(BackendError::Conflict { .. }) => continue,
                        Err(e) => panic!("write failed: {e}"),
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("writer thread");
    }
    assert_eq!(b.get(b"counter").expect("get"), Some(b"200".to_vec()));
    assert_eq!(b.scan(b"inc/", b"inc0", 1000).expect("scan").len(), 200);
}
