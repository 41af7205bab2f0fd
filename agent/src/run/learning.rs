//! Learning an on-demand proxy's scope (see [`crate::on_demand`]) from the names its Envoy asks
//! VHDS for. Each name's hosts (as [`Lookup::of`] reads its spelling) are learned: translation
//! then builds for the scope they narrow to, and the store subscription widens to them. A name
//! is settled once a snapshot built with what it taught has been served (the store answered the
//! widened subscription, and the translation of its answer was published), or once the store
//! has not answered within [`ANSWER_WAIT`]. The ADS streams answer a name no virtual host
//! matches only once it is settled: until then, Envoy holds the request, so that the first
//! request to a service the proxy never saw is routed, not refused.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{mpsc, watch};

use crate::bootstrap::AdminAddress;
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
    /// How long a host may go unused before it is forgotten (`--on-demand-idle`).
    pub idle: Duration,
    /// Envoy's admin endpoint, where its use of each learned host is read.
    pub envoy_admin: AdminAddress,
    /// Hosts whose clusters Envoy asked for by name (on-demand CDS): never forgotten, as Envoy
    /// never asks again for a cluster name it subscribed to, and would wait for it in vain.
    pub pinned: BTreeSet<String>,
}

/// What Envoy has sent to each host: its clusters' request counts, summed.
type Use = BTreeMap<String, u64>;

/// Envoy's use as last read.
#[derive(Default)]
struct Usage {
    /// The last reading; `None` until one succeeds, or after one failed.
    last: Option<Use>,
    /// Whether the failure to read it was logged (once per outage).
    said: bool,
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
        let mut usage = Usage::default();
        let every = check_every(self.idle);
        let mut checks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
                _ = checks.tick() => self.forget_unused(&mut usage).await,
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
        self.pinned.extend(
            names
                .iter()
                .filter_map(|name| name.strip_prefix("cds/"))
                .map(String::from),
        );
        // A cluster asked for by name names its host exactly; a host as sent may stand for
        // any name a resolver would try.
        let hosts: Vec<String> = names
            .iter()
            .filter_map(|name| match name.strip_prefix("cds/") {
                Some(host) => Some(vec![host.to_string()]),
                None => Lookup::of(asked_host(name)?, &self.dns_domain).map(|l| l.hosts),
            })
            .flatten()
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

    /// Reads Envoy's use of each host, and forgets the hosts unused for the idle time: the
    /// translation then drops them (Envoy is told they are gone), the store subscription
    /// narrows, and the names that asked for them are no longer settled, so that Envoy's next
    /// request for one is held until it is learned again. While Envoy's use cannot be read,
    /// nothing is forgotten.
    async fn forget_unused(&mut self, usage: &mut Usage) {
        let now = match crate::envoy::admin_request(&self.envoy_admin, "GET", "/clusters").await {
            Ok((200, body)) => requests_by_host(&body),
            answer => {
                if !usage.said {
                    tracing::warn!(
                        admin = %self.envoy_admin,
                        answer = ?answer.map(|(code, _)| code),
                        "on-demand: Envoy's use of the learned hosts cannot be read \
                         (--envoy-admin); none is forgotten meanwhile"
                    );
                    usage.said = true;
                }
                usage.last = None;
                return;
            }
        };
        usage.said = false;
        let at = SystemTime::now();
        let before = usage.last.take().unwrap_or_default();
        self.learned.touch(
            now.iter()
                .filter(|(host, count)| before.get(*host) != Some(*count))
                .map(|(host, _)| host.as_str()),
            at,
        );
        usage.last = Some(now);
        self.learned
            .touch(self.pinned.iter().map(String::as_str), at);
        let gone = self.learned.forget_idle(at, self.idle);
        if gone.is_empty() {
            return;
        }
        let number = self.generation.borrow().number + 1;
        self.generation.send_replace(Generation {
            number,
            hosts: Arc::new(self.learned.hosts()),
        });
        self.metrics.on_demand_forgotten.inc_by(gone.len() as u64);
        self.metrics
            .on_demand_hosts
            .set(i64::try_from(self.learned.len()).unwrap_or(i64::MAX));
        let gone: BTreeSet<String> = gone.into_iter().collect();
        let dns_domain = self.dns_domain.clone();
        self.settled.send_modify(|settled| {
            Arc::make_mut(settled).retain(|name| {
                let hosts = asked_host(name).and_then(|host| Lookup::of(host, &dns_domain));
                !hosts.is_some_and(|lookup| lookup.hosts.iter().any(|h| gone.contains(h)))
            });
        });
        tracing::info!(forgotten = ?gone, hosts = self.learned.len(), idle_s = self.idle.as_secs(), "forgot hosts the proxy has not used");
        if let Some(dir) = &self.cache_dir
            && let Err(e) = self.learned.save(dir)
        {
            tracing::warn!(error = %e, "the learned hosts were not saved");
        }
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

/// How often Envoy's use is read: a quarter of the idle time, within 1 s and 1 min.
fn check_every(idle: Duration) -> Duration {
    (idle / 4).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// The requests Envoy has sent to each host, from its admin `/clusters` (per upstream host:
/// `<cluster>::<address>::rq_total::<count>`), summed over the host's clusters
/// (`outbound|<port>|<subset>|<host>`).
fn requests_by_host(clusters: &str) -> Use {
    let mut out = Use::new();
    for line in clusters.lines() {
        let mut parts = line.split("::");
        let (Some(cluster), Some(_), Some("rq_total"), Some(count)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let Some(host) = cluster
            .strip_prefix("outbound|")
            .and_then(|c| c.rsplit('|').next())
        else {
            continue;
        };
        *out.entry(host.to_string()).or_default() += count.trim().parse::<u64>().unwrap_or(0);
    }
    out
}

/// Resolves at `deadline` (never without one).
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoy_requests_are_summed_per_host() {
        let clusters = "\
outbound|80|v1|web.shop.svc.cluster.local::observability_name::outbound|80|v1|web.shop.svc.cluster.local
outbound|80|v1|web.shop.svc.cluster.local::10.10.1.11:9001::rq_total::3
outbound|80|v2|web.shop.svc.cluster.local::10.10.1.12:9001::rq_total::4
outbound|80|v2|web.shop.svc.cluster.local::10.10.1.12:9001::cx_total::9
outbound|80||cart.shop.svc.cluster.local::10.10.1.15:9001::rq_total::0
PassthroughCluster::10.10.1.13:9001::rq_total::2
";
        let used = requests_by_host(clusters);
        assert_eq!(
            used,
            Use::from([
                ("cart.shop.svc.cluster.local".to_string(), 0),
                ("web.shop.svc.cluster.local".to_string(), 7),
            ])
        );
        assert_eq!(
            check_every(Duration::from_secs(3600)),
            Duration::from_secs(60)
        );
        assert_eq!(check_every(Duration::from_secs(2)), Duration::from_secs(1));
    }
}
