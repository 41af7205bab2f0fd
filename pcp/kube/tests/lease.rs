//! Leader election on a Lease of the **fake** Kubernetes API server (`pasa_kube::fake_apiserver`), with the
//! real `kube` client: one candidate leads, another stands by; a resigning leader hands over at
//! once; a leader that stops renewing (a crashed replica) is replaced once its lease expires;
//! candidates starting together end with exactly one leader.

use std::time::Duration;

use pasa_kube::fake_apiserver::FakeApiServer;
use pasa_kube::lease::{Candidate, Elector, LeaseState, LeaseTiming};
use tokio::sync::watch;

fn timing() -> LeaseTiming {
    LeaseTiming {
        lease_duration: Duration::from_secs(1),
        renew_deadline: Duration::from_millis(700),
        renew_every: Duration::from_millis(100),
        retry_every: Duration::from_millis(100),
    }
}

fn candidate(fake: &FakeApiServer, identity: &str) -> Candidate {
    fake.put_namespace("istio-system", &[]);
    Elector::new(
        fake.client(),
        "istio-system",
        "pasa-pcp-syncer",
        identity,
        timing(),
    )
    .start()
}

/// Waits (at most 10 s) until the candidate's leadership is `want`.
async fn until_leading(leading: &mut watch::Receiver<bool>, want: bool, who: &str) {
    let waited = tokio::time::timeout(Duration::from_secs(10), leading.wait_for(|l| *l == want));
    assert!(
        matches!(waited.await, Ok(Ok(_))),
        "{who} did not become leading={want}"
    );
}

fn holder(fake: &FakeApiServer) -> Option<String> {
    let lease = fake.get(
        "coordination.k8s.io/v1",
        "Lease",
        "istio-system",
        "pasa-pcp-syncer",
    )?;
    lease["spec"]["holderIdentity"].as_str().map(str::to_string)
}

#[tokio::test]
async fn a_standby_takes_over_when_the_leader_resigns() {
    let fake = FakeApiServer::start().await;
    let a = candidate(&fake, "pcp-a");
    until_leading(&mut a.leading(), true, "pcp-a").await;
    let b = candidate(&fake, "pcp-b");
    // b tries several times while a renews: it stays a standby.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!*b.leading().borrow(), "pcp-b leads beside pcp-a");
    assert_eq!(holder(&fake).as_deref(), Some("pcp-a"));

    let resigned = std::time::Instant::now();
    a.resign().await;
    until_leading(&mut b.leading(), true, "pcp-b").await;
    assert!(
        resigned.elapsed() < Duration::from_secs(1),
        "took over before the lease would have expired"
    );
    assert_eq!(holder(&fake).as_deref(), Some("pcp-b"));
    let lease = fake
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            "istio-system",
            "pasa-pcp-syncer",
        )
        .unwrap();
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
}

#[tokio::test]
async fn a_leader_that_stops_renewing_is_replaced_after_its_lease() {
    let fake = FakeApiServer::start().await;
    let a = candidate(&fake, "pcp-a");
    until_leading(&mut a.leading(), true, "pcp-a").await;
    let b = candidate(&fake, "pcp-b");
    // a crashes: no resignation. b waits for the lease to expire as it observed it.
    drop(a);
    let crashed = std::time::Instant::now();
    until_leading(&mut b.leading(), true, "pcp-b").await;
    assert!(
        crashed.elapsed() >= Duration::from_millis(900),
        "pcp-b took a lease that had not expired ({:?})",
        crashed.elapsed()
    );
    assert_eq!(holder(&fake).as_deref(), Some("pcp-b"));
}

#[tokio::test]
async fn candidates_starting_together_elect_one() {
    let fake = FakeApiServer::start().await;
    let candidates: Vec<Candidate> = ["pcp-a", "pcp-b", "pcp-c"]
        .iter()
        .map(|id| candidate(&fake, id))
        .collect();
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if candidates.iter().any(|c| *c.leading().borrow()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "nobody leads");
    // Several renewals later, still exactly one, and the one the lease names.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let leaders: Vec<usize> = (0..3)
        .filter(|i| *candidates[*i].leading().borrow())
        .collect();
    assert_eq!(leaders.len(), 1, "leaders: {leaders:?}");
    let expected = ["pcp-a", "pcp-b", "pcp-c"][leaders[0]];
    assert_eq!(holder(&fake).as_deref(), Some(expected));
}

/// Waits (at most 10 s) until the candidate's state satisfies `done`.
async fn until_state(c: &Candidate, done: impl Fn(&LeaseState) -> bool) -> LeaseState {
    let mut state = c.state();
    let waited = tokio::time::timeout(Duration::from_secs(10), state.wait_for(|s| done(s)));
    match waited.await {
        Ok(Ok(s)) => s.clone(),
        _ => panic!("timed out; state {:?}", c.state().borrow()),
    }
}

/// A Lease namespace that does not exist: the candidate says so, and what to do, in words
/// (not a client's debug dump); once the namespace exists it leads.
#[tokio::test]
async fn a_missing_lease_namespace_is_named_with_what_to_do() {
    let fake = FakeApiServer::start().await;
    let c = Elector::new(
        fake.client(),
        "pasa-system",
        "pasa-pcp-syncer",
        "pcp-a",
        timing(),
    )
    .start();
    let state = until_state(&c, |s| s.problem.is_some()).await;
    let problem = state.problem.unwrap();
    assert!(
        problem.contains("the namespace pasa-system does not exist")
            && problem.contains("--lease-namespace"),
        "{problem}"
    );
    assert!(!problem.contains("Status {"), "{problem}");
    fake.put_namespace("pasa-system", &[]);
    let state = until_state(&c, |s| s.leading).await;
    assert_eq!(state.problem, None);
    assert_eq!(state.holder.as_deref(), Some("pcp-a"));
}

/// With deploy/'s Role, PCP's service account leads; with none, it is told what to grant.
#[tokio::test]
async fn the_shipped_lease_role_is_enough_and_its_absence_is_named() {
    let fake = FakeApiServer::start().await;
    fake.put_namespace("pasa-system", &[]);
    let role: Vec<serde_json::Value> = pasa_kube::fake_apiserver::shipped_rbac()
        .into_iter()
        .filter(|m| m["kind"] == "Role" || m["kind"] == "RoleBinding")
        .collect();
    fake.enforce_rbac(&[]);
    let elector = |name: &str| {
        let client = fake.client_as("pasa-system", "pasa-pcp");
        Elector::new(client, "pasa-system", "pasa-pcp-syncer", name, timing()).start()
    };
    let refused = elector("pcp-a");
    let state = until_state(&refused, |s| s.problem.is_some()).await;
    let problem = state.problem.unwrap();
    assert!(
        problem.contains("may not read or write leases in pasa-system")
            && problem.contains("deploy/base/role.yaml"),
        "{problem}"
    );
    drop(refused);
    fake.enforce_rbac(&role);
    let allowed = elector("pcp-a");
    until_state(&allowed, |s| s.leading).await;
}
