//! Learning an on-demand proxy's scope (see [`crate::on_demand`]) from the names its Envoy asks
//! VHDS for. Each name's hosts (as [`Lookup::of`] reads its spelling) are learned: translation
//! then builds for the scope they narrow to, and the store subscription widens to them. A name
//! is settled once a snapshot built with what it taught has been served (the store answered the
//! widened subscription, and the translation of its answer was published), or once the store
//! has not answered within [`ANSWER_WAIT`]. The ADS streams answer a name no virtual host
//! matches only once it is settled: until then, Envoy holds the request, so that the first
//! request to a service the proxy never saw is routed, not refused.

use std::collections::BTreeSet;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{mpsc, watch};

use crate::metrics::Metrics;
use crate::on_demand::{Generation, Learned, Lookup, asked_host};

/// How long a name waits for the store's answer before it is answered as it stands (a host the
/// agent cannot see yet: Envoy answers its request 404; the virtual host is pushed under the
/// name once it comes).
const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// The learner's state and what it talks to.
pub(super) struct Learning {
    /// Names Envoy asked VHDS for, from the ADS streams.
    pub asks: mpsc::UnboundedReceiver<Vec<String>>,
    /// What is learned, to translation.
    pub generation: watch::Sender<Generation>,
    /// The newest generation a published snapshot was built with, from translation.
    pub published: watch::Receiver<u64>,
    /// The names settled, to the ADS streams.
    pub settled: watch::Sender<Arc<BTreeSet<String>>>,
    pub learned: Learned,
    /// The proxy's DNS domain, whose search path completes short names.
    pub dns_domain: String,
    /// Where what is learned is kept (`--cache-dir`).
    pub cache_dir: Option<PathBuf>,
    pub metrics: Arc<Metrics>,
}

/// A name asked for and not yet settled.
struct Waiting {
    name: String,
    /// The generation whose publication settles it.
    generation: u64,
    asked: Instant,
}

impl Learning {
    /// Learns from the names asked until `stop` resolves (or the ADS server is gone).
    pub(super) async fn run(mut self, stop: impl Future<Output = ()>) {
        tokio::pin!(stop);
        // In the order asked, so the first waited longest.
        let mut waiting: Vec<Waiting> = Vec::new();
        self.metrics
            .on_demand_hosts
            .set(i64::try_from(self.learned.len()).unwrap_or(i64::MAX));
        loop {
            let deadline = waiting
                .first()
                .map(|w| tokio::time::Instant::from_std(w.asked + ANSWER_WAIT));
            tokio::select! {
                () = &mut stop => return,
                asked = self.asks.recv() => match asked {
                    Some(names) => self.ask(names, &mut waiting),
                    None => return,
                },
                Ok(()) = self.published.changed() => {
                    let published = *self.published.borrow_and_update();
                    self.settle(&mut waiting, |w| w.generation <= published);
                }
                () = sleep_until(deadline), if deadline.is_some() => {
                    let now = Instant::now();
                    let before = waiting.len();
                    self.settle(&mut waiting, |w| now >= w.asked + ANSWER_WAIT);
                    let late = before - waiting.len();
                    self.metrics.on_demand_unanswered.inc_by(late as u64);
                    tracing::warn!(
                        names = late,
                        wait_s = ANSWER_WAIT.as_secs(),
                        "the store did not answer the hosts asked for in time; they are \
                         answered as unknown for now, and pushed when the store answers"
                    );
                }
            }
        }
    }

    /// Learns the hosts `names` ask for, and settles those already served.
    fn ask(&mut self, names: Vec<String>, waiting: &mut Vec<Waiting>) {
        let asked = Instant::now();
        let hosts: Vec<String> = names
            .iter()
            .filter_map(|name| Lookup::of(asked_host(name)?, &self.dns_domain))
            .flat_map(|lookup| lookup.hosts)
            .collect();
        let before = self.learned.len();
        if self.learned.learn(hosts, SystemTime::now()) {
            let number = self.generation.borrow().number + 1;
            self.generation.send_replace(Generation {
                number,
                hosts: Arc::new(self.learned.hosts()),
            });
            let now = self.learned.len();
            self.metrics
                .on_demand_learned
                .inc_by(now.saturating_sub(before) as u64);
            self.metrics
                .on_demand_hosts
                .set(i64::try_from(now).unwrap_or(i64::MAX));
            tracing::info!(learned = ?names, hosts = now, "learned hosts from the proxy's requests");
            if let Some(dir) = &self.cache_dir
                && let Err(e) = self.learned.save(dir)
            {
                tracing::warn!(error = %e, "the learned hosts were not saved; a restart will learn them again");
            }
        }
        let generation = self.generation.borrow().number;
        waiting.extend(names.into_iter().map(|name| Waiting {
            name,
            generation,
            asked,
        }));
        let published = *self.published.borrow();
        self.settle(waiting, |w| w.generation <= published);
    }

    /// Settles the names of `waiting` that are `done`.
    fn settle(&self, waiting: &mut Vec<Waiting>, done: impl Fn(&Waiting) -> bool) {
        let mut names = Vec::new();
        waiting.retain(|w| {
            if !done(w) {
                return true;
            }
            self.metrics
                .on_demand_resolution
                .observe(w.asked.elapsed().as_secs_f64());
            names.push(w.name.clone());
            false
        });
        if !names.is_empty() {
            self.settled
                .send_modify(|settled| Arc::make_mut(settled).extend(names));
        }
    }
}

/// Resolves at `deadline` (never without one).
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
