//! The `WorkloadEntry` model (`networking.istio.io`).
