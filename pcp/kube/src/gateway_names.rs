//! Network gateway addresses that are DNS names (a cloud load balancer's host name, as AWS gives
//! them), resolved by PCP as istiod resolves them (`RESOLVE_HOSTNAME_GATEWAYS`, its default):
//! the store gets the addresses, so that no agent resolves anything and the mesh's gateways are
//! looked up once, not once per pod. A name is resolved when a gateway first names it, then
//! again every period; a name that does not resolve is no gateway (as in istiod), and one whose
//! lookup fails for a moment keeps the addresses it had. Each time the addresses of a name
//! change, the syncer is told and writes its gateways again.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use tokio::sync::{Notify, mpsc};

/// How long one lookup may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The gateway names a syncer has met, and their addresses as last resolved.
#[derive(Clone, Default)]
pub struct GatewayNames {
    state: Arc<Mutex<State>>,
    wake: Arc<Notify>,
}

#[derive(Default)]
struct State {
    wanted: BTreeSet<String>,
    resolved: BTreeMap<String, Vec<IpAddr>>,
}

impl GatewayNames {
    /// The addresses of `name` as last resolved (none yet: no gateway yet); a name met for the
    /// first time is resolved at once.
    pub fn addresses(&self, name: &str) -> Option<Vec<IpAddr>> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.wanted.insert(name.to_string()) {
            self.wake.notify_one();
        }
        state.resolved.get(name).cloned()
    }

    /// Resolves the names met, at once when a new one is, and every `period`; yields each time
    /// the addresses of some name changed. Resolution stops when the stream is dropped.
    pub fn changes(&self, period: Duration) -> impl Stream<Item = ()> + Send + 'static {
        let (tx, rx) = mpsc::channel(1);
        let names = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(period) => {}
                    () = names.wake.notified() => {}
                    () = tx.closed() => return,
                }
                if names.resolve_all().await && tx.send(()).await.is_err() {
                    return;
                }
            }
        });
        futures::stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|()| ((), rx)) },
        )
    }

    /// Resolves every name met; whether the addresses of any changed.
    async fn resolve_all(&self) -> bool {
        let wanted: Vec<String> = {
            let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state.wanted.iter().cloned().collect()
        };
        let mut changed = false;
        for name in wanted {
            let lookup = tokio::net::lookup_host((name.clone(), 0));
            let found = tokio::time::timeout(LOOKUP_TIMEOUT, lookup).await;
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let addresses = match found {
                Ok(Ok(found)) => {
                    let mut ips: Vec<IpAddr> = found.map(|a| a.ip()).collect();
                    ips.sort();
                    ips.dedup();
                    ips
                }
                // Not there, or the resolver did not answer: what it had stays (none for a
                // name never resolved).
                Ok(Err(e)) => {
                    tracing::debug!(name = %name, error = %e, "a network gateway's name did not resolve");
                    state.resolved.get(&name).cloned().unwrap_or_default()
                }
                Err(_) => state.resolved.get(&name).cloned().unwrap_or_default(),
            };
            if state.resolved.get(&name) != Some(&addresses) {
                tracing::info!(name = %name, addresses = ?addresses, "a network gateway's name resolved");
                state.resolved.insert(name, addresses);
                changed = true;
            }
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    /// A name is resolved as soon as it is met, and the change is told.
    #[tokio::test]
    async fn names_are_resolved_when_met_and_their_change_is_told() {
        let names = GatewayNames::default();
        let mut changes = Box::pin(names.changes(Duration::from_secs(3600)));
        assert_eq!(names.addresses("localhost"), None);
        tokio::time::timeout(Duration::from_secs(10), changes.next())
            .await
            .expect("told within the lookup's time")
            .expect("the stream goes on");
        let addresses = names.addresses("localhost").expect("resolved");
        assert!(addresses.iter().all(IpAddr::is_loopback), "{addresses:?}");
        assert!(!addresses.is_empty());
        // A name that does not exist is no gateway.
        assert_eq!(names.addresses("no-such-gateway.invalid"), None);
        let _ = tokio::time::timeout(Duration::from_secs(10), changes.next()).await;
        assert_eq!(
            names
                .addresses("no-such-gateway.invalid")
                .unwrap_or_default(),
            Vec::<IpAddr>::new()
        );
    }
}
