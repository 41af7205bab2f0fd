//! Reaching the store API: one place for how an address is read, the message limits both ends
//! use, and the client built from them.

use std::time::Duration;

use tonic::codegen::{Body, Bytes, StdError};
use tonic::transport::{Channel, Endpoint};

use crate::store::v1::store_client::StoreClient;
use crate::store::v1::{ListProxyStatusRequest, ListProxyStatusResponse};

/// Largest gRPC message either end accepts: big apply batches and list answers fit.
pub const MAX_MESSAGE_SIZE: usize = 64 << 20;

/// How long establishing a connection may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// An endpoint for `host:port` or a full `http://` / `https://` URL; the error says which
/// address is wrong and why.
pub fn endpoint(address: &str) -> Result<Endpoint, String> {
    let url = if address.contains("://") {
        address.to_string()
    } else {
        format!("http://{address}")
    };
    Endpoint::from_shared(url)
        .map(|e| e.connect_timeout(CONNECT_TIMEOUT))
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

/// Connects to the store at `address` (`host:port` or a URL). The error names the address and
/// why, for the caller to prefix with the flag it came from.
pub async fn connect(address: &str) -> Result<StoreClient<Channel>, ConnectError> {
    let endpoint = endpoint(address).map_err(ConnectError::Address)?;
    let channel = endpoint
        .connect()
        .await
        .map_err(|source| ConnectError::Unreachable {
            address: address.to_string(),
            source,
        })?;
    Ok(store_client(channel))
}

/// The store servers a client may use, as `--server A[,B…]` lists them: replicas of one store
/// (or PCPs in front of it). A client uses one at a time and moves to the next when it cannot
/// reach it; clones share the position, so the calls of one process move together.
#[derive(Debug, Clone)]
pub struct Servers {
    addresses: std::sync::Arc<[String]>,
    current: std::sync::Arc<std::sync::atomic::AtomicUsize>,
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
        })
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
    #[error("cannot reach the store at {address}: {source}")]
    Unreachable {
        address: String,
        #[source]
        source: tonic::transport::Error,
    },
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
