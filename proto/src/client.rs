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
}
