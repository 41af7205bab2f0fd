//! The `Sidecar` model (`networking.istio.io`).
