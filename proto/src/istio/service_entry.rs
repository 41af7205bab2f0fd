//! The `ServiceEntry` model (`networking.istio.io`).
