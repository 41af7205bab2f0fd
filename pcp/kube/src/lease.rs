//! Leader election on a `coordination.k8s.io/v1` Lease, as Kubernetes controllers do it: one
//! PCP replica holds the lease and syncs, the others stand by and take over when it stops
//! renewing (or gives the lease up on shutdown).
//!
//! - A candidate takes a lease that does not exist, that has no holder, or whose holder has not
//!   renewed it for `lease_duration` *as this candidate observed it* (the time a candidate saw
//!   the record last change, on its own clock: clocks of different machines are not compared).
//! - The holder renews every `renew_every`; one that cannot renew within `renew_deadline` stops
//!   leading before anyone else may take the lease over.
//! - Every write replaces the Lease at the resource version read, so two candidates racing for
//!   it cannot both win (the API server refuses the second with 409 Conflict).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::problem::{Problem, Reason};

/// Where a candidate stands, for readiness.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseState {
    /// This candidate holds the lease.
    pub leading: bool,
    /// Who holds it, as last read (`None` before the first read, or when nobody does).
    pub holder: Option<String>,
    /// Why the last round could not read or write the lease, and what to do about it.
    pub problem: Option<String>,
    /// A round has completed (the lease was read, or the attempt failed).
    pub tried: bool,
}

/// How long a lease lasts and how often it is renewed or tried.
#[derive(Debug, Clone, Copy)]
pub struct LeaseTiming {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub renew_every: Duration,
    pub retry_every: Duration,
}

impl Default for LeaseTiming {
    /// Kubernetes controllers' defaults: 15 s, 10 s, 2 s.
    fn default() -> Self {
        LeaseTiming {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            renew_every: Duration::from_secs(2),
            retry_every: Duration::from_secs(2),
        }
    }
}

/// The lease one candidate competes for.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: LeaseTiming,
    /// The record last seen (holder, renew time) and when this candidate saw it change.
    observed: Option<(Option<String>, Option<MicroTime>, Instant)>,
    /// The lease's namespace, for messages.
    namespace: String,
    /// The API server's address, for messages.
    server: Option<String>,
}

/// A running candidate: `leading()` says whether it holds the lease. Dropping it stops the
/// candidate without giving the lease up (another takes over once it expires); [`Candidate::
/// resign`] gives it up at once.
pub struct Candidate {
    leading: watch::Receiver<bool>,
    state: watch::Receiver<LeaseState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Candidate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Candidate {
    /// True while this candidate holds the lease.
    pub fn leading(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    /// Where this candidate stands (leading, the holder, why it cannot take part).
    pub fn state(&self) -> watch::Receiver<LeaseState> {
        self.state.clone()
    }

    /// Stops competing and, when holding the lease, gives it up so that a standby takes over
    /// without waiting for it to expire.
    pub async fn resign(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Elector {
    /// A candidate named `identity` for the Lease `namespace/name`.
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        timing: LeaseTiming,
    ) -> Elector {
        Elector {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
            timing,
            observed: None,
            namespace: namespace.to_string(),
            server: None,
        }
    }

    /// Names the API server (its URL) in what the candidate says when it cannot reach it.
    pub fn with_server(mut self, server: &str) -> Elector {
        self.server = Some(server.to_string());
        self
    }

    /// Starts competing.
    pub fn start(self) -> Candidate {
        let (leading_tx, leading) = watch::channel(false);
        let (state_tx, state) = watch::channel(LeaseState::default());
        let (stop, stop_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(self.run(leading_tx, state_tx, stop_rx));
        Candidate {
            leading,
            state,
            stop: Some(stop),
            task,
        }
    }

    async fn run(
        mut self,
        leading: watch::Sender<bool>,
        state: watch::Sender<LeaseState>,
        mut stop: tokio::sync::oneshot::Receiver<()>,
    ) {
        let mut last_renewed: Option<Instant> = None;
        loop {
            let (held, problem) = match self.try_acquire_or_renew().await {
                Ok(held) => (held, None),
                Err(e) => (false, Some(self.problem(&e))),
            };
            if problem.is_some() && state.borrow().problem != problem {
                tracing::warn!(lease = %self.name, namespace = %self.namespace,
                    "{}", problem.as_deref().unwrap_or_default());
            }
            let now = Instant::now();
            if held {
                last_renewed = Some(now);
            }
            // A holder that could not renew in time stops leading before its lease can expire
            // for the others.
            let is_leader = match last_renewed {
                Some(at) => now.duration_since(at) < self.timing.renew_deadline,
                None => false,
            };
            if !is_leader {
                last_renewed = None;
            }
            if *leading.borrow() != is_leader {
                tracing::info!(lease = %self.name, identity = %self.identity, leading = is_leader,
                    "leadership changed");
                let _ = leading.send(is_leader);
            }
            let holder = if is_leader {
                Some(self.identity.clone())
            } else {
                self.observed.as_ref().and_then(|(h, _, _)| h.clone())
            };
            state.send_if_modified(|s| {
                let now = LeaseState {
                    leading: is_leader,
                    holder,
                    problem,
                    tried: true,
                };
                let changed = *s != now;
                *s = now;
                changed
            });
            let wait = if is_leader {
                self.timing.renew_every
            } else {
                self.timing.retry_every
            };
            tokio::select! {
                _ = &mut stop => {
                    let _ = leading.send(false);
                    if is_leader {
                        self.release().await;
                    }
                    return;
                }
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Why a round failed, and what to do about it.
    fn problem(&self, e: &kube::Error) -> String {
        let (ns, name) = (&self.namespace, &self.name);
        let problem = Problem::of(e);
        let what = match problem.reason {
            Reason::NotFound if problem.message.contains("namespaces") => format!(
                "the namespace {ns} does not exist: create it (kubectl create namespace {ns}), \
                 or name the Lease's namespace with --lease-namespace"
            ),
            Reason::Forbidden => format!(
                "PCP's service account may not read or write leases in {ns}: bind it a Role \
                 with create, and get and update on {name} (deploy/base/role.yaml and \
                 rolebinding.yaml, in the namespace --lease-namespace names)"
            ),
            Reason::Unreachable => {
                let server = self.server.as_deref().unwrap_or("the API server");
                problem.hint(server).unwrap_or_default()
            }
            _ => "retrying".to_string(),
        };
        format!("cannot take part in the election on Lease {ns}/{name}: {problem}; {what}")
    }

    /// One round: takes or renews the lease when this candidate may; true when it holds it.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let Some(current) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(now.clone(), now, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let record = (holder.clone(), spec.renew_time.clone());
        let seen_at = match &self.observed {
            Some((h, r, at)) if (h, r) == (&record.0, &record.1) => *at,
            _ => Instant::now(),
        };
        self.observed = Some((record.0, record.1, seen_at));
        let mine = holder.as_deref() == Some(self.identity.as_str());
        let duration = spec
            .lease_duration_seconds
            .map_or(self.timing.lease_duration, |s| {
                Duration::from_secs(u64::try_from(s).unwrap_or(0))
            });
        if holder.is_some() && !mine && seen_at.elapsed() < duration {
            return Ok(false);
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!mine);
        let acquired = match (mine, spec.acquire_time) {
            (true, Some(at)) => at,
            _ => now.clone(),
        };
        let mut lease = current;
        lease.spec = Some(self.spec(acquired, now, transitions));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn spec(&self, acquired: MicroTime, renewed: MicroTime, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.timing.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX),
            ),
            acquire_time: Some(acquired),
            renew_time: Some(renewed),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// Gives the lease up: no holder, so a standby takes it at its next try.
    async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        if let Err(e) = self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            tracing::warn!(lease = %self.name, error = %e, "could not give the lease up; it expires");
        }
    }
}
