//! Reaching the store API: one place for how an address is read, the message limits both ends
//! use, and the client built from them.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tonic::codegen::{Body, Bytes, StdError};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::store::v1::store_client::StoreClient;
use crate::store::v1::{ListProxyStatusRequest, ListProxyStatusResponse};

/// Largest gRPC message either end accepts: big apply batches and list answers fit.
pub const MAX_MESSAGE_SIZE: usize = 64 << 20;

/// How long establishing a connection may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a connection with nothing to read is checked with an HTTP/2 PING, idle or not.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// How long a PING may go unanswered before the connection is closed as dead (its calls fail,
/// and callers reconnect): a hung peer or a silently dropped path is noticed in
/// [`KEEPALIVE_INTERVAL`] + this, not waited on forever.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// An endpoint for `host:port` or a full `http://` / `https://` URL, with the connect timeout
/// and HTTP/2 keepalive every client uses; the error says which address is wrong and why.
pub fn endpoint(address: &str) -> Result<Endpoint, String> {
    endpoint_with(address, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT)
}

fn endpoint_with(address: &str, interval: Duration, timeout: Duration) -> Result<Endpoint, String> {
    let url = if address.contains("://") {
        address.to_string()
    } else {
        format!("http://{address}")
    };
    Endpoint::from_shared(url)
        .map(|e| {
            e.connect_timeout(CONNECT_TIMEOUT)
                .http2_keep_alive_interval(interval)
                .keep_alive_timeout(timeout)
                .keep_alive_while_idle(true)
        })
        .map_err(|e| format!("{address:?} is not a valid address: {e}"))
}

/// A store client over `transport` (a `Channel`, or an in-process server) with the project's
/// message limits.
pub fn store_client<T>(transport: T) -> StoreClient<T>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<StdError>,
    T::ResponseBody: Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as Body>::Error: Into<StdError> + Send,
{
    StoreClient::new(transport)
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE)
}

/// Connects to the store at `address` (`host:port` or a URL) in plaintext. The error names the
/// address and why, for the caller to prefix with the flag it came from.
pub async fn connect(address: &str) -> Result<StoreClient<Channel>, ConnectError> {
    connect_with(address, None).await
}

/// Connects to the store at `address`, over mutual TLS when `tls` is given (a `host:port`
/// address is then reached as `https://host:port`, and the store's certificate must name the
/// host).
pub async fn connect_with(
    address: &str,
    tls: Option<&ClientTls>,
) -> Result<StoreClient<Channel>, ConnectError> {
    channel(address, tls).await.map(store_client)
}

/// The connection [`connect_with`] makes, for callers that wrap it.
pub async fn channel(address: &str, tls: Option<&ClientTls>) -> Result<Channel, ConnectError> {
    let endpoint = match tls {
        None => endpoint(address).map_err(ConnectError::Address)?,
        Some(tls) => {
            let url = if address.contains("://") {
                address.replacen("http://", "https://", 1)
            } else {
                format!("https://{address}")
            };
            endpoint(&url)
                .map_err(ConnectError::Address)?
                .tls_config(tls.config()?)
                .map_err(|e| ConnectError::Tls(format!("{address}: {e}")))?
        }
    };
    endpoint
        .connect()
        .await
        .map_err(|cause| ConnectError::Unreachable {
            address: address.to_string(),
            cause: pasa_runtime::error::causes(&cause),
        })
}

/// Where a client's own certificate and key come from, read afresh at each connection so that
/// a rotated certificate is used from the next one on.
pub type IdentitySource =
    Arc<dyn Fn() -> Result<(Vec<u8>, Vec<u8>), String> + Send + Sync + 'static>;

/// Mutual TLS towards the store API: the CA the store's certificate must chain to, and the
/// client's own certificate (PEM chain and key), whose URI SAN (a SPIFFE ID) is who the store
/// thinks the client is.
#[derive(Clone)]
pub struct ClientTls {
    ca: Vec<u8>,
    identity: IdentitySource,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls").finish_non_exhaustive()
    }
}

impl ClientTls {
    /// With the CA read from `ca` now, and the certificate and key read from `cert` and `key` at
    /// each connection. Errors name the file.
    pub fn from_files(ca: &Path, cert: &Path, key: &Path) -> Result<ClientTls, String> {
        let ca = read_pem(ca)?;
        let (cert, key) = (cert.to_path_buf(), key.to_path_buf());
        read_pem(&cert)?;
        read_pem(&key)?;
        Ok(ClientTls::new(
            ca,
            Arc::new(move || Ok((read_pem(&cert)?, read_pem(&key)?))),
        ))
    }

    /// With the CA `ca` (PEM) and the certificate and key `identity` gives at each connection.
    pub fn new(ca: Vec<u8>, identity: IdentitySource) -> ClientTls {
        ClientTls { ca, identity }
    }

    fn config(&self) -> Result<ClientTlsConfig, ConnectError> {
        let (cert, key) = (self.identity)().map_err(ConnectError::Tls)?;
        Ok(ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .identity(Identity::from_pem(cert, key)))
    }
}

/// Reads a PEM file that must hold something; the error names the file.
pub fn read_pem(path: &Path) -> Result<Vec<u8>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !pem.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(format!("{} holds no PEM block", path.display()));
    }
    Ok(pem)
}

/// The store servers a client may use, as `--server A[,B…]` lists them: replicas of one store
/// (or PCPs in front of it). A client uses one at a time and moves to the next when it cannot
/// reach it; clones share the position, so the calls of one process move together.
#[derive(Debug, Clone)]
pub struct Servers {
    addresses: std::sync::Arc<[String]>,
    current: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    tls: Option<ClientTls>,
}

impl Servers {
    /// Reads a comma-separated list; each must be an address ([`endpoint`]).
    pub fn parse(list: &str) -> Result<Servers, String> {
        let addresses: Vec<String> = list
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_string)
            .collect();
        if addresses.is_empty() {
            return Err(format!("{list:?} names no server"));
        }
        for a in &addresses {
            endpoint(a)?;
        }
        Ok(Servers {
            addresses: addresses.into(),
            current: Default::default(),
            tls: None,
        })
    }

    /// Reaches the servers over mutual TLS.
    pub fn with_tls(mut self, tls: Option<ClientTls>) -> Servers {
        self.tls = tls;
        self
    }

    /// Connects to `address` (one of these servers), over TLS when configured.
    pub async fn connect(&self, address: &str) -> Result<StoreClient<Channel>, ConnectError> {
        connect_with(address, self.tls.as_ref()).await
    }

    /// The address in use.
    pub fn current(&self) -> &str {
        let i = self.current.load(std::sync::atomic::Ordering::Relaxed);
        &self.addresses[i % self.addresses.len()]
    }

    /// `address` could not be reached: the next one is used from now on (unless another caller
    /// moved on already). Returns whether there is another to move to.
    pub fn failed(&self, address: &str) -> bool {
        let n = self.addresses.len();
        let i = self.current.load(std::sync::atomic::Ordering::Relaxed);
        if n > 1 && self.addresses[i % n] == address {
            let _ = self.current.compare_exchange(
                i,
                (i + 1) % n,
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        n > 1
    }
}

impl std::fmt::Display for Servers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.addresses.join(","))
    }
}

/// Why [`connect`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The address is not one (the message names it).
    #[error("{0}")]
    Address(String),
    /// The client's TLS settings cannot be used (no certificate yet, an unreadable file).
    #[error("TLS towards the store: {0}")]
    Tls(String),
    /// Nothing answered at the address. The message carries every cause (tonic's transport
    /// error says only "transport error"; the DNS failure or refused connection is beneath it),
    /// so it reads whole wherever it is printed, and no cause is repeated by a chain printer.
    #[error("cannot reach the store at {address}: {cause}")]
    Unreachable { address: String, cause: String },
}

/// `ListProxyStatus`, its pages gathered into one answer.
pub async fn list_proxy_status(
    client: &mut StoreClient<Channel>,
    request: ListProxyStatusRequest,
) -> Result<ListProxyStatusResponse, tonic::Status> {
    let mut pages = client.list_proxy_status(request).await?.into_inner();
    let mut answer = ListProxyStatusResponse::default();
    while let Some(page) = pages.message().await? {
        answer.revision = answer.revision.max(page.revision);
        answer.expiry_ms = page.expiry_ms;
        answer.proxies.extend(page.proxies);
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_with_and_without_scheme() {
        assert_eq!(
            endpoint("127.0.0.1:7400").unwrap().uri(),
            "http://127.0.0.1:7400/"
        );
        assert_eq!(
            endpoint("https://store:7400").unwrap().uri(),
            "https://store:7400/"
        );
        assert!(
            endpoint("not an address")
                .unwrap_err()
                .contains("not an address")
        );
    }

    /// tonic's own message is "transport error": what is wrong lies beneath it, and is kept.
    #[tokio::test]
    async fn an_unreachable_store_says_why() {
        let Err(e) = connect("127.0.0.1:1").await else {
            panic!("something answered on port 1");
        };
        let text = e.to_string();
        assert!(
            text.starts_with("cannot reach the store at 127.0.0.1:1: transport error: ")
                && text.to_lowercase().contains("connection refused"),
            "{text}"
        );
        assert_eq!(
            text.matches("os error 111").count(),
            1,
            "each cause once: {text}"
        );
    }

    /// A peer that takes the connection and then answers nothing (a stopped process: its
    /// kernel still accepts) is found dead by the keepalive, and the call fails instead of
    /// waiting forever.
    #[tokio::test]
    async fn a_peer_that_answers_nothing_is_found_dead_by_the_keepalive() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        // Takes connections, reads what comes (so nothing blocks on a full buffer), says nothing.
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(tokio::spawn(async move {
                    let mut conn = conn;
                    let mut sink = tokio::io::sink();
                    let _ = tokio::io::copy(&mut conn, &mut sink).await;
                }));
            }
        });
        let short = Duration::from_millis(200);
        let channel = endpoint_with(&address, short, short)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = store_client(channel);
        let call = client.status(crate::store::v1::StatusRequest {});
        // Far longer than interval + timeout; the call would otherwise never end.
        let answer = tokio::time::timeout(Duration::from_secs(10), call).await;
        silent.abort();
        let status = answer
            .expect("the keepalive ends a call to a silent peer")
            .expect_err("a silent peer gives no answer");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
    }

    #[test]
    fn servers_move_on_from_one_that_failed_and_come_round_again() {
        let servers = Servers::parse("127.0.0.1:7400, 127.0.0.1:7410").unwrap();
        let shared = servers.clone();
        assert_eq!(servers.current(), "127.0.0.1:7400");
        assert!(servers.failed("127.0.0.1:7400"));
        assert_eq!(shared.current(), "127.0.0.1:7410", "clones move together");
        // A stale report about the one no longer in use changes nothing.
        servers.failed("127.0.0.1:7400");
        assert_eq!(servers.current(), "127.0.0.1:7410");
        servers.failed("127.0.0.1:7410");
        assert_eq!(servers.current(), "127.0.0.1:7400");
        let one = Servers::parse("127.0.0.1:7400").unwrap();
        assert!(!one.failed("127.0.0.1:7400"));
        assert!(Servers::parse(" , ").is_err());
        assert!(Servers::parse("127.0.0.1:7400,not an address").is_err());
    }
}
