//! The `DestinationRule` model (`networking.istio.io`).
