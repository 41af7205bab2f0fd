//! How a process hears that it must stop.

/// Resolves on Ctrl-C or SIGTERM. The handlers are installed when this is called, not when it
/// is first polled, so a signal that comes right after the ready line is not lost (it would
/// otherwise end the process with the default action).
pub fn shutdown() -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let listen = |kind: SignalKind, name: &'static str| {
        let stream = signal(kind);
        async move {
            match stream {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for {name}");
                    std::future::pending::<()>().await;
                }
            }
        }
    };
    let ctrl_c = listen(SignalKind::interrupt(), "Ctrl-C");
    let term = listen(SignalKind::terminate(), "SIGTERM");
    async move {
        tokio::select! {
            () = ctrl_c => tracing::info!("Ctrl-C: shutting down"),
            () = term => tracing::info!("SIGTERM: shutting down"),
        }
    }
}
