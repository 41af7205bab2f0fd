//! A blocking key-value client on TiKV's transactional API. Every call runs on a small runtime
//! of the client's own, so callers may be plain threads or async tasks (they block, as they
//! would on a local disk). Keys cross this boundary as bytes, without the prefix.

use std::sync::Arc;
use std::time::Duration;

use tikv_client::transaction::HeartbeatOption;
use tikv_client::{BoundRange, CheckLevel, Config, Key, TransactionClient, TransactionOptions};

/// How long connecting to PD, and any one call, may take before it is reported as a failure.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum TikvError {
    #[error("cannot reach PD at {pd}: {message}")]
    Unavailable { pd: String, message: String },
    /// A key's value was not what the write expected, or another transaction wrote one of its
    /// keys first. Nothing was written.
    #[error("write conflict on key {key}")]
    Conflict { key: String },
    #[error("TiKV (PD at {pd}) failed to {action}: {message}")]
    Failed {
        pd: String,
        action: &'static str,
        message: String,
    },
}

/// A key locked by [`Tikv::lock`]: other writers that lock it wait until this one commits or is
/// dropped (rolled back). A holder that dies keeps it until TiKV's pessimistic-lock TTL (20 s in
/// tikv-client) runs out.
pub struct Locked {
    txn: Option<tikv_client::Transaction>,
    key: Vec<u8>,
    value: Option<Vec<u8>>,
    runtime: tokio::runtime::Handle,
}

impl Locked {
    /// The key's newest committed value when the lock was taken.
    pub fn value(&self) -> Option<&[u8]> {
        self.value.as_deref()
    }

    /// The locked key, without the prefix.
    pub fn key(&self) -> &[u8] {
        &self.key
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        if let Some(mut txn) = self.txn.take() {
            self.runtime.spawn(async move {
                if let Err(e) = txn.rollback().await {
                    tracing::debug!(error = %e, "releasing a TiKV lock failed; it expires");
                }
            });
        }
    }
}

/// A key and its value.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// One change of a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mutation {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
}

pub struct Tikv {
    client: Arc<TransactionClient>,
    /// Always `Some` until dropped; shut down without waiting, since the last handle may be
    /// dropped inside another runtime (where a blocking shutdown panics).
    runtime: Option<tokio::runtime::Runtime>,
    prefix: Arc<[u8]>,
    pd: String,
    timeout: Duration,
}

impl Drop for Tikv {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl std::fmt::Debug for Tikv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tikv")
            .field("pd", &self.pd)
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .finish()
    }
}

fn with_prefix(prefix: &[u8], key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + key.len());
    k.extend_from_slice(prefix);
    k.extend_from_slice(key);
    k
}

/// tikv-client's message for an error, without the source location some of its errors start
/// with (`[path/to/file.rs:209]: `), which means nothing to an operator.
fn message(e: &dyn std::fmt::Display) -> String {
    let text = e.to_string();
    match text
        .strip_prefix('[')
        .and_then(|rest| rest.split_once("]: "))
    {
        Some((location, rest)) if location.contains(".rs:") => rest.to_string(),
        _ => text,
    }
}

fn printable(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

/// How many times [`Tikv::lock`] asks again after writers it waited for committed.
const LOCK_ATTEMPTS: u32 = 20;

/// Whether the error is a write conflict (a commit after the request's timestamp).
fn is_write_conflict(e: &tikv_client::Error) -> bool {
    use tikv_client::Error as E;
    match e {
        E::KeyError(k) => k.conflict.is_some(),
        E::ExtractedErrors(all) | E::MultipleKeyErrors(all) => all.iter().any(is_write_conflict),
        E::PessimisticLockError { inner, .. } => is_write_conflict(inner),
        _ => false,
    }
}

/// Whether tikv-client's error says another transaction got to a key first, or held it for
/// longer than the client waits.
fn is_conflict(e: &tikv_client::Error) -> bool {
    use tikv_client::Error as E;
    match e {
        E::KeyError(k) => k.conflict.is_some() || k.already_exist.is_some(),
        E::ResolveLockError(_) => true,
        E::ExtractedErrors(all) | E::MultipleKeyErrors(all) => all.iter().any(is_conflict),
        E::PessimisticLockError { inner, .. } => is_conflict(inner),
        _ => false,
    }
}

impl Tikv {
    /// Connects to the PD endpoints (`host:port` each). An unreachable PD is an error within
    /// `timeout`, naming the addresses.
    pub fn connect(pd: &[String], prefix: &[u8], timeout: Duration) -> Result<Tikv, TikvError> {
        let pd_text = pd.join(",");
        let unavailable = |message: String| TikvError::Unavailable {
            pd: pd_text.clone(),
            message,
        };
        if pd.is_empty() {
            return Err(unavailable("no PD address given".into()));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("pasa-tikv")
            .enable_all()
            .build()
            .map_err(|e| unavailable(format!("cannot start the client's runtime: {e}")))?;
        let endpoints = pd.to_vec();
        let config = Config::default().with_timeout(timeout);
        let connecting = runtime.spawn(async move {
            tokio::time::timeout(
                timeout,
                TransactionClient::new_with_config(endpoints, config),
            )
            .await
        });
        let connected = match futures::executor::block_on(connecting) {
            Ok(Ok(Ok(client))) => Ok(client),
            Ok(Ok(Err(e))) => Err(unavailable(message(&e))),
            Ok(Err(_)) => Err(unavailable(format!(
                "no answer within {} s",
                timeout.as_secs_f64()
            ))),
            Err(e) => Err(unavailable(message(&e))),
        };
        let client = match connected {
            Ok(client) => client,
            Err(e) => {
                // Callers may be async tasks: shut down without blocking.
                runtime.shutdown_background();
                return Err(e);
            }
        };
        Ok(Tikv {
            client: Arc::new(client),
            runtime: Some(runtime),
            prefix: prefix.into(),
            pd: pd_text,
            timeout,
        })
    }

    fn handle(&self) -> tokio::runtime::Handle {
        match &self.runtime {
            Some(runtime) => runtime.handle().clone(),
            None => unreachable!("the runtime is only taken when the client is dropped"),
        }
    }

    /// The PD addresses, as given.
    pub fn pd(&self) -> &str {
        &self.pd
    }

    /// Runs `work` on the client's runtime and waits for it, bounded by the timeout.
    fn run<T: Send + 'static>(
        &self,
        action: &'static str,
        work: impl Future<Output = Result<T, TikvError>> + Send + 'static,
    ) -> Result<T, TikvError> {
        let timeout = self.timeout;
        let handle = self
            .handle()
            .spawn(async move { tokio::time::timeout(timeout, work).await });
        match futures::executor::block_on(handle) {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(self.failed(
                action,
                format!("no answer within {} s", timeout.as_secs_f64()),
            )),
            Err(e) => Err(self.failed(action, message(&e))),
        }
    }

    fn failed(&self, action: &'static str, message: String) -> TikvError {
        TikvError::Failed {
            pd: self.pd.clone(),
            action,
            message,
        }
    }

    /// What the calls' errors are mapped with.
    fn failure(&self) -> Failure {
        Failure {
            pd: self.pd.clone(),
            prefix: Arc::clone(&self.prefix),
        }
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, TikvError> {
        let client = Arc::clone(&self.client);
        let key = with_prefix(&self.prefix, key);
        let fail = self.failure();
        self.run("read", async move {
            let ts = client.current_timestamp().await.map_err(fail.of("read"))?;
            let mut snapshot = client.snapshot(ts, TransactionOptions::new_optimistic());
            snapshot.get(key).await.map_err(fail.of("read"))
        })
    }

    /// Up to `limit` pairs with `start <= key < end`, in key order.
    pub fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KeyValue>, TikvError> {
        if start >= end || limit == 0 {
            return Ok(Vec::new());
        }
        let client = Arc::clone(&self.client);
        let prefix = Arc::clone(&self.prefix);
        let range: BoundRange = (with_prefix(&prefix, start)..with_prefix(&prefix, end)).into();
        let limit = u32::try_from(limit).unwrap_or(u32::MAX);
        let fail = self.failure();
        self.run("scan", async move {
            let ts = client.current_timestamp().await.map_err(fail.of("scan"))?;
            let mut snapshot = client.snapshot(ts, TransactionOptions::new_optimistic());
            let pairs = snapshot.scan(range, limit).await.map_err(fail.of("scan"))?;
            Ok(pairs
                .map(|pair| {
                    let key: Vec<u8> = pair.key().clone().into();
                    let value = pair.value().clone();
                    (key[prefix.len()..].to_vec(), value)
                })
                .collect())
        })
    }

    /// Locks `key` in a pessimistic transaction and reads its newest committed value. The lock
    /// is what orders writers that share a key every write changes (the store's revision): a
    /// second writer waits for it instead of planning work that would conflict.
    pub fn lock(&self, key: &[u8]) -> Result<Locked, TikvError> {
        let client = Arc::clone(&self.client);
        let prefixed = with_prefix(&self.prefix, key);
        let fail = self.failure();
        let (txn, value) = self.run("lock a key", async move {
            let mut txn = client
                .begin_with_options(transaction_options(TransactionOptions::new_pessimistic()))
                .await
                .map_err(fail.of("begin a transaction"))?;
            // A commit by the writer this one waited for lands after the lock's
            // `for_update_ts`: TiKV then refuses the lock as a conflict, and it is asked again
            // with a newer timestamp (as TiDB does), a bounded number of times.
            let mut attempt = 1;
            loop {
                match txn.get_for_update(prefixed.clone()).await {
                    Ok(value) => return Ok((txn, value)),
                    Err(e) if is_write_conflict(&e) && attempt < LOCK_ATTEMPTS => attempt += 1,
                    Err(e) => {
                        let _ = txn.rollback().await;
                        return Err(fail.of("lock a key")(e));
                    }
                }
            }
        })?;
        Ok(Locked {
            txn: Some(txn),
            key: key.to_vec(),
            value,
            runtime: self.handle(),
        })
    }

    /// Commits the mutations in the locked key's transaction, which releases the lock.
    pub fn commit_locked(
        &self,
        mut locked: Locked,
        mutations: Vec<Mutation>,
    ) -> Result<(), TikvError> {
        let Some(mut txn) = locked.txn.take() else {
            return Err(self.failed("commit", "the lock was already released".into()));
        };
        let prefix = Arc::clone(&self.prefix);
        let fail = self.failure();
        self.run("commit", async move {
            if let Err(e) = buffer(&mut txn, &prefix, mutations).await {
                let _ = txn.rollback().await;
                return Err(fail.of("buffer a write")(e));
            }
            txn.commit().await.map(drop).map_err(fail.of("commit"))
        })
    }

    /// One transaction: checks every expectation (the key has that value, or is absent for
    /// `None`) at the transaction's start, then applies the mutations in order. Another
    /// transaction committing any of those keys in between makes it a conflict; nothing is then
    /// written.
    pub fn write(
        &self,
        expect: Vec<(Vec<u8>, Option<Vec<u8>>)>,
        mutations: Vec<Mutation>,
    ) -> Result<(), TikvError> {
        let client = Arc::clone(&self.client);
        let prefix = Arc::clone(&self.prefix);
        let fail = self.failure();
        self.run("write", async move {
            let mut txn = client
                .begin_with_options(transaction_options(TransactionOptions::new_optimistic()))
                .await
                .map_err(fail.of("begin a transaction"))?;
            let mut unwritten: Vec<Key> = Vec::new();
            for (key, want) in expect {
                let have = txn
                    .get(with_prefix(&prefix, &key))
                    .await
                    .map_err(fail.of("read"))?;
                if have != want {
                    let _ = txn.rollback().await;
                    return Err(TikvError::Conflict {
                        key: printable(&key),
                    });
                }
                let written = mutations.iter().any(|m| match m {
                    Mutation::Put(k, _) | Mutation::Delete(k) => *k == key,
                });
                if !written {
                    unwritten.push(with_prefix(&prefix, &key).into());
                }
            }
            // Expected keys that are not written are locked, so a concurrent change of them is
            // a conflict too.
            if !unwritten.is_empty() {
                txn.lock_keys(unwritten)
                    .await
                    .map_err(fail.of("lock keys"))?;
            }
            buffer(&mut txn, &prefix, mutations)
                .await
                .map_err(fail.of("buffer a write"))?;
            txn.commit().await.map(drop).map_err(fail.of("commit"))
        })
    }
}

/// The options every transaction here shares: short-lived, so no heartbeat; one dropped on an
/// error path is rolled back by TiKV's lock expiry, so a warning rather than a panic.
fn transaction_options(options: TransactionOptions) -> TransactionOptions {
    options
        .drop_check(CheckLevel::Warn)
        .heartbeat_option(HeartbeatOption::NoHeartbeat)
}

/// Buffers the mutations in `txn`, in order.
async fn buffer(
    txn: &mut tikv_client::Transaction,
    prefix: &[u8],
    mutations: Vec<Mutation>,
) -> Result<(), tikv_client::Error> {
    for m in mutations {
        match m {
            Mutation::Put(k, v) => txn.put(with_prefix(prefix, &k), v).await?,
            Mutation::Delete(k) => txn.delete(with_prefix(prefix, &k)).await?,
        }
    }
    Ok(())
}

/// Maps tikv-client's errors: another transaction got there first → [`TikvError::Conflict`]
/// (naming the key without the prefix); anything else → [`TikvError::Failed`].
struct Failure {
    pd: String,
    prefix: Arc<[u8]>,
}

impl Failure {
    fn of(&self, action: &'static str) -> impl FnOnce(tikv_client::Error) -> TikvError + '_ {
        move |e| {
            if is_conflict(&e) {
                TikvError::Conflict {
                    key: conflict_key(&e, &self.prefix),
                }
            } else {
                TikvError::Failed {
                    pd: self.pd.clone(),
                    action,
                    message: message(&e),
                }
            }
        }
    }
}

/// The key a conflict names, without the prefix.
fn conflict_key(e: &tikv_client::Error, prefix: &[u8]) -> String {
    use tikv_client::Error as E;
    let raw = match e {
        E::KeyError(k) => k
            .conflict
            .as_ref()
            .map(|c| c.key.clone())
            .or_else(|| k.already_exist.as_ref().map(|a| a.key.clone())),
        E::ExtractedErrors(all) | E::MultipleKeyErrors(all) => {
            return all
                .iter()
                .find(|e| is_conflict(e))
                .map_or_else(String::new, |e| conflict_key(e, prefix));
        }
        E::PessimisticLockError { inner, .. } => return conflict_key(inner, prefix),
        E::ResolveLockError(locks) => locks.first().map(|l| l.key.clone()),
        _ => None,
    };
    raw.map_or_else(String::new, |k| {
        printable(k.strip_prefix(prefix).unwrap_or(&k))
    })
}
