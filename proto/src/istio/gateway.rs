//! The `Gateway` model (`networking.istio.io`).
