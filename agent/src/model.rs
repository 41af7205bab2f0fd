//! The model: what istiod works out from the raw config before it builds any xDS, and what both
//! the store subscription ([`crate::subscription`]) and translation ([`crate::translate`]) stand
//! on. It depends on neither.
//!
//! - [`proxy`]: the proxy config is generated for, and the generator its clients ask for;
//! - [`registry`]: the cached resources parsed, typed, and the service registry built from them;
//! - [`scope`]: SidecarScope, the services, VirtualServices and DestinationRules a proxy sees;
//! - [`gateway`]: which Gateways apply to a router and how their servers merge;
//! - [`authn`]: the PeerAuthentication a workload's inbound ports take;
//! - [`secrets`]: the names of SDS secrets.

pub mod authn;
pub mod gateway;
pub mod network;
pub mod proxy;
pub mod registry;
pub mod scope;
pub mod secrets;
