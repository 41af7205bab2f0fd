//! Property tests: the roaring indexes give exactly what brute-force evaluation gives, for random
//! objects, subscriptions, wildcards, updates and deletes, and fan-out sends each watcher the
//! event type its subscription implies.

use std::collections::HashMap;

use pasa_proto::Kind;
use pasa_proto::store::v1::{EventType, IndexKeys, Resource};
use pasa_store::hub::{Hub, HubMsg, WatcherHandle};
use pasa_store::index::ObjectKeys;
use pasa_store::metrics::Metrics;
use pasa_store::record::LogRecord;
use pasa_store::selector::{Rule, Selector};
use proptest::prelude::*;

const NAMESPACES: &[&str] = &["default", "bookinfo", "istio-system", "web"];
const HOSTS: &[&str] = &[
    "reviews.default.svc.cluster.local",
    "ratings.default.svc.cluster.local",
    "reviews.bookinfo.svc.cluster.local",
    "a.b.example.com",
    "b.example.com",
    "example.com",
    "en.wikipedia.org",
    "*.example.com",
    "*.b.example.com",
    "*.wikipedia.org",
    "*.svc.cluster.local",
    "*.default.svc.cluster.local",
    "*.com",
    "*",
];
const GATEWAYS: &[&str] = &["mesh", "istio-system/ingress", "bookinfo/gw", "web/egress"];

fn pick(pool: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop::sample::select(pool).prop_map(str::to_string)
}

fn kind() -> impl Strategy<Value = Kind> {
    prop::sample::select(Kind::ALL.to_vec())
}

fn object() -> impl Strategy<Value = (Kind, String, String, Vec<String>, Vec<String>)> {
    (
        kind(),
        pick(NAMESPACES),
        prop::sample::select(vec!["a", "b", "c", "d", "e"]).prop_map(str::to_string),
        prop::collection::vec(pick(HOSTS), 0..4),
        prop::collection::vec(pick(GATEWAYS), 0..3),
    )
}

fn rule() -> impl Strategy<Value = Rule> {
    (
        prop::collection::vec(kind(), 0..3),
        prop::collection::vec(pick(NAMESPACES), 0..3),
        prop::collection::vec(pick(HOSTS), 0..4),
        prop::collection::vec(pick(GATEWAYS), 0..2),
    )
        .prop_map(|(kinds, namespaces, hosts, gateways)| Rule {
            kinds,
            namespaces,
            hosts,
            gateways,
        })
}

fn selector() -> impl Strategy<Value = Selector> {
    prop::collection::vec(rule(), 0..4).prop_map(|rules| Selector { rules })
}

#[derive(Debug, Clone)]
enum Op {
    Put((Kind, String, String, Vec<String>, Vec<String>)),
    Delete(usize),
    Watch(Selector),
    Change(usize, Selector),
    Unwatch(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => object().prop_map(Op::Put),
        1 => any::<usize>().prop_map(Op::Delete),
        2 => selector().prop_map(Op::Watch),
        1 => (any::<usize>(), selector()).prop_map(|(i, s)| Op::Change(i, s)),
        1 => any::<usize>().prop_map(Op::Unwatch),
    ]
}

fn resource(o: &(Kind, String, String, Vec<String>, Vec<String>), revision: u64) -> Resource {
    let (kind, ns, name, hosts, gateways) = o.clone();
    Resource {
        api_version: "networking.istio.io/v1".into(),
        kind: kind.as_str().into(),
        namespace: ns,
        name,
        spec_json: "{}".into(),
        mod_revision: revision,
        index: Some(IndexKeys { hosts, gateways }),
        ..Default::default()
    }
}

struct Model {
    hub: Hub,
    revision: u64,
    objects: HashMap<(String, String, String), Resource>,
    watchers: Vec<(WatcherHandle, Selector)>,
}

impl Model {
    fn check(&mut self) -> Result<(), TestCaseError> {
        let all: Vec<Resource> = self.objects.values().cloned().collect();
        for r in &all {
            let keys = ObjectKeys::of(r).unwrap();
            prop_assert_eq!(
                self.hub.subscribers_of(&keys),
                self.hub.subscribers_of_brute_force(&keys),
                "subscribers of {:?}",
                keys
            );
        }
        for (_, sel) in &self.watchers {
            prop_assert_eq!(
                self.hub.select_ids(sel),
                self.hub.select_brute_force(sel),
                "objects of {:?}",
                sel
            );
        }
        Ok(())
    }

    /// Drains every watcher's queue; returns per watcher the (type, name) events it got.
    fn drain(&mut self) -> Vec<Vec<(EventType, String)>> {
        self.watchers
            .iter_mut()
            .map(|(h, _)| {
                let mut got = Vec::new();
                while let Ok(msg) = h.rx.try_recv() {
                    if let HubMsg::Events(events) = msg {
                        for e in events {
                            got.push((
                                e.r#type,
                                format!(
                                    "{}/{}/{}",
                                    e.resource.kind, e.resource.namespace, e.resource.name
                                ),
                            ));
                        }
                    }
                }
                got
            })
            .collect()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn indexed_matching_equals_brute_force(ops in prop::collection::vec(op(), 1..60)) {
        let mut m = Model {
            hub: Hub::new(Metrics::new()),
            revision: 0,
            objects: HashMap::new(),
            watchers: Vec::new(),
        };
        for op in ops {
            match op {
                Op::Put(o) => {
                    m.revision += 1;
                    let res = resource(&o, m.revision);
                    let key = (res.kind.clone(), res.namespace.clone(), res.name.clone());
                    let prev = m.objects.insert(key.clone(), res.clone());
                    let new_keys = ObjectKeys::of(&res).unwrap();
                    let old_keys = prev.as_ref().map(|p| ObjectKeys::of(p).unwrap());
                    let rec = LogRecord {
                        r#type: if prev.is_some() { EventType::Modified } else { EventType::Added } as i32,
                        revision: m.revision,
                        resource: Some(res),
                        prev,
                        commit_time_unix_nanos: 0,
                    };
                    m.drain();
                    m.hub.commit(vec![rec]);
                    let got = m.drain();
                    let name = format!("{}/{}/{}", key.0, key.1, key.2);
                    for ((_, sel), got) in m.watchers.iter().zip(got) {
                        let now = sel.matches(&new_keys);
                        let before = old_keys.as_ref().is_some_and(|k| sel.matches(k));
                        let want = match (now, before) {
                            (true, true) => vec![(EventType::Modified, name.clone())],
                            (true, false) => vec![(EventType::Added, name.clone())],
                            (false, true) => vec![(EventType::Deleted, name.clone())],
                            (false, false) => vec![],
                        };
                        prop_assert_eq!(got, want);
                    }
                }
                Op::Delete(i) => {
                    if m.objects.is_empty() { continue; }
                    let mut keys: Vec<_> = m.objects.keys().cloned().collect();
                    keys.sort();
                    let key = keys[i % keys.len()].clone();
                    let res = m.objects.remove(&key).unwrap();
                    m.revision += 1;
                    m.hub.commit(vec![LogRecord {
                        r#type: EventType::Deleted as i32,
                        revision: m.revision,
                        resource: Some(res),
                        prev: None,
                        commit_time_unix_nanos: 0,
                    }]);
                }
                Op::Watch(sel) => {
                    let h = m.hub.register(sel.clone(), 1 << 16);
                    m.watchers.push((h, sel));
                }
                Op::Change(i, sel) => {
                    if m.watchers.is_empty() { continue; }
                    let i = i % m.watchers.len();
                    m.drain();
                    let before = m.hub.select_ids(&m.watchers[i].1);
                    let now = m.hub.select_ids(&sel);
                    prop_assert!(m.hub.update_subscription(m.watchers[i].0.key, sel.clone()));
                    m.watchers[i].1 = sel;
                    let got = m.drain().swap_remove(i);
                    let added = got.iter().filter(|(t, _)| *t == EventType::Added).count() as u64;
                    let deleted = got.iter().filter(|(t, _)| *t == EventType::Deleted).count() as u64;
                    prop_assert_eq!(added, (&now - &before).len());
                    prop_assert_eq!(deleted, (&before - &now).len());
                    prop_assert_eq!(got.len() as u64, added + deleted);
                }
                Op::Unwatch(i) => {
                    if m.watchers.is_empty() { continue; }
                    let i = i % m.watchers.len();
                    let (h, _) = m.watchers.remove(i);
                    m.hub.end(h.key, None);
                }
            }
            m.check()?;
        }
    }
}
