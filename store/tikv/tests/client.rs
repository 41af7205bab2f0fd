//! The blocking client against the fake PD/TiKV (named a fake: see `pasa_tikv::fake`), through
//! tikv-client's real transaction path.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use pasa_tikv::fake::FakeTikv;
use pasa_tikv::{Mutation, Tikv, TikvError};

fn loopback() -> SocketAddr {
    (Ipv4Addr::LOCALHOST, 0).into()
}

fn put(k: &str, v: &str) -> Mutation {
    Mutation::Put(k.into(), v.into())
}

#[test]
fn writes_are_read_back_under_the_prefix_only() {
    let fake = FakeTikv::start(loopback()).unwrap();
    let a = Tikv::connect(&[fake.pd_address()], b"a/", Duration::from_secs(5)).unwrap();
    let b = Tikv::connect(&[fake.pd_address()], b"b/", Duration::from_secs(5)).unwrap();
    a.write(vec![], vec![put("k1", "1"), put("k2", "2"), put("k3", "3")])
        .unwrap();
    b.write(vec![], vec![put("k1", "other")]).unwrap();
    assert_eq!(a.get(b"k1").unwrap(), Some(b"1".to_vec()));
    assert_eq!(b.get(b"k1").unwrap(), Some(b"other".to_vec()));
    let keys: Vec<_> = a
        .scan(b"k", b"l", 10)
        .unwrap()
        .into_iter()
        .map(|(k, _)| String::from_utf8(k).unwrap())
        .collect();
    assert_eq!(keys, ["k1", "k2", "k3"]);
    a.write(vec![], vec![Mutation::Delete(b"k2".to_vec())])
        .unwrap();
    assert_eq!(a.get(b"k2").unwrap(), None);
    assert_eq!(a.scan(b"k", b"l", 10).unwrap().len(), 2);
    assert_eq!(fake.locked_keys(), 0, "every transaction finished");
}

#[test]
fn a_failed_expectation_is_a_conflict_that_writes_nothing() {
    let fake = FakeTikv::start(loopback()).unwrap();
    let kv = Tikv::connect(&[fake.pd_address()], b"", Duration::from_secs(5)).unwrap();
    kv.write(vec![], vec![put("rev", "1")]).unwrap();
    let err = kv
        .write(
            vec![(b"rev".to_vec(), Some(b"0".to_vec()))],
            vec![put("x", "x")],
        )
        .unwrap_err();
    assert!(
        matches!(&err, TikvError::Conflict { key } if key == "rev"),
        "{err}"
    );
    assert_eq!(kv.get(b"x").unwrap(), None);
}

#[test]
fn an_unreachable_pd_is_an_error_within_seconds_naming_it() {
    // A port nothing listens on: bind one, note it, drop it.
    let free = std::net::TcpListener::bind(loopback())
        .unwrap()
        .local_addr()
        .unwrap();
    let started = Instant::now();
    let err = Tikv::connect(&[free.to_string()], b"", Duration::from_secs(3)).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    let text = err.to_string();
    assert!(
        text.contains(&free.to_string()) && text.contains("PD"),
        "{text}"
    );
}

#[test]
fn a_locked_key_holds_off_a_second_locker_until_the_first_commits() {
    let fake = FakeTikv::start(loopback()).unwrap();
    let kv = std::sync::Arc::new(
        Tikv::connect(&[fake.pd_address()], b"", Duration::from_secs(10)).unwrap(),
    );
    kv.write(vec![], vec![put("rev", "1")]).unwrap();
    let first = kv.lock(b"rev").unwrap();
    assert_eq!(first.value(), Some(&b"1"[..]));
    let second = {
        let kv = std::sync::Arc::clone(&kv);
        std::thread::spawn(move || {
            let locked = kv
                .lock(b"rev")
                .expect("the second lock, once the first is gone");
            let seen = locked.value().map(<[u8]>::to_vec);
            kv.commit_locked(locked, vec![put("rev", "3")]).unwrap();
            seen
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    kv.commit_locked(first, vec![put("rev", "2"), put("other", "x")])
        .unwrap();
    assert_eq!(
        second.join().unwrap(),
        Some(b"2".to_vec()),
        "the second writer read what the first committed"
    );
    assert_eq!(kv.get(b"rev").unwrap(), Some(b"3".to_vec()));
    // Dropping a lock releases it.
    drop(kv.lock(b"rev").unwrap());
    let again = kv.lock(b"rev").unwrap();
    kv.commit_locked(again, vec![]).unwrap();
}

#[tokio::test]
async fn connecting_and_dropping_inside_an_async_task_does_not_panic() {
    let free = std::net::TcpListener::bind(loopback())
        .unwrap()
        .local_addr()
        .unwrap();
    assert!(Tikv::connect(&[free.to_string()], b"", Duration::from_secs(1)).is_err());
    let fake = FakeTikv::start(loopback()).unwrap();
    let kv = Tikv::connect(&[fake.pd_address()], b"", Duration::from_secs(5)).unwrap();
    kv.write(vec![], vec![put("k", "v")]).unwrap();
    drop(kv);
}

#[test]
fn a_pd_that_accepts_but_never_answers_is_an_error_within_the_timeout() {
    // The kernel accepts connections on a listener nobody serves: like a PD that hangs.
    let silent = std::net::TcpListener::bind(loopback()).unwrap();
    let address = silent.local_addr().unwrap().to_string();
    let started = Instant::now();
    let err =
        Tikv::connect(std::slice::from_ref(&address), b"", Duration::from_secs(1)).unwrap_err();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let text = err.to_string();
    assert!(text.contains(&address), "{text}");
    drop(silent);
}
