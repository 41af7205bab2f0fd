//! The `VirtualService` model (`networking.istio.io`).
