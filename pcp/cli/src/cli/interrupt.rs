//! Ctrl-C during a command of several batches (`apply -f`, `delete -f`): the first stops the
//! command after the batch in flight, so it can say exactly what was written; a second stops it
//! at once.

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// Counts the Ctrl-Cs (SIGINT) since it was made.
pub struct Interrupt {
    presses: watch::Receiver<u32>,
}

impl Interrupt {
    /// Listens from now on: the handler is installed before this returns, so a Ctrl-C a moment
    /// later is heard (not the default action, which ends the process untold). Without a
    /// handler (the signal cannot be listened to), Ctrl-C keeps its default action.
    pub fn listen() -> Interrupt {
        let (tx, presses) = watch::channel(0);
        match signal(SignalKind::interrupt()) {
            Ok(mut sigint) => {
                tokio::spawn(async move {
                    while sigint.recv().await.is_some() {
                        tx.send_modify(|n| *n += 1);
                    }
                });
            }
            Err(e) => {
                eprintln!("warning: cannot listen for Ctrl-C ({e}): it stops pasactl at once")
            }
        }
        Interrupt { presses }
    }

    /// Whether Ctrl-C was pressed.
    pub fn requested(&self) -> bool {
        *self.presses.borrow() > 0
    }

    /// Runs `batch` to its end, telling the user at the first Ctrl-C that it will be waited for;
    /// `None` when Ctrl-C is pressed again before it ends (it is then dropped: whether the
    /// server applied it is unknown).
    pub async fn finish<F: Future>(&self, batch: F) -> Option<F::Output> {
        let mut batch = std::pin::pin!(batch);
        let mut told = self.requested();
        loop {
            tokio::select! {
                output = &mut batch => return Some(output),
                () = self.pressed(1), if !told => {
                    told = true;
                    eprintln!(
                        "Ctrl-C: stopping after the batch in flight (Ctrl-C again to stop at once)"
                    );
                }
                () = self.pressed(2) => return None,
            }
        }
    }

    /// Resolves once Ctrl-C has been pressed `times` times in all; never without a handler.
    pub async fn pressed(&self, times: u32) {
        let mut presses = self.presses.clone();
        if presses.wait_for(|n| *n >= times).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
