//! Giving the system back the memory the allocator holds free.
//!
//! glibc's allocator keeps what a program frees for its next allocations, and returns to the
//! system only the free space at the top of its heap. A process whose work comes in bursts (an
//! agent translating its scope and pushing it: megabytes of transient messages) then stays
//! resident at its peak while it idles, although a fifth of that is free: in the seed's widest
//! agent, 6.5 of 24 MB (bench/README.md). [`release_free`] asks for every free page back, and
//! [`release_after_bursts`] does so once a burst is over.

use std::time::Duration;

use tokio::sync::watch;

/// Returns the allocator's free pages to the system (glibc's `malloc_trim`): whether any were.
/// Elsewhere (musl, other systems) nothing: their allocators return memory themselves.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn release_free() -> bool {
    // SAFETY: `malloc_trim` takes no pointer and changes only the allocator's own free lists,
    // under the allocator's locks; it is safe to call from any thread at any time.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Returns the allocator's free pages to the system: not on this platform.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_free() -> bool {
    false
}

/// Calls [`release_free`] once after each burst of `activity`: when it has not changed for
/// `quiet`. Returns when `activity`'s sender is gone.
pub async fn release_after_bursts<T>(activity: watch::Receiver<T>, quiet: Duration) {
    after_bursts(activity, quiet, || async {
        let released = tokio::task::spawn_blocking(release_free)
            .await
            .unwrap_or(false);
        tracing::debug!(
            released,
            "the allocator's free memory returned after a burst"
        );
    })
    .await
}

async fn after_bursts<T, F: Future<Output = ()>>(
    mut activity: watch::Receiver<T>,
    quiet: Duration,
    mut release: impl FnMut() -> F,
) {
    while activity.changed().await.is_ok() {
        loop {
            match tokio::time::timeout(quiet, activity.changed()).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) => return,
                Err(_) => break,
            }
        }
        release().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rss_anon_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("RssAnon:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Memory freed between live allocations (which glibc keeps) goes back to the system.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn free_memory_between_live_allocations_goes_back() {
        // 64 MiB in blocks small enough for the heap, every other one freed: 32 MiB free in
        // holes no trimming of the heap's top reaches.
        let mut blocks: Vec<Vec<u8>> = (0..2048).map(|_| vec![1u8; 32 * 1024]).collect();
        let mut kept = Vec::with_capacity(blocks.len() / 2);
        for (i, block) in blocks.drain(..).enumerate() {
            if i % 2 == 0 {
                kept.push(block);
            }
        }
        let before = rss_anon_kib();
        assert!(release_free(), "nothing was released");
        let after = rss_anon_kib();
        assert!(
            before.saturating_sub(after) >= 16 * 1024,
            "RssAnon {before} KiB before, {after} KiB after"
        );
        assert_eq!(kept.iter().map(|b| b[0] as usize).sum::<usize>(), 1024);
    }

    /// One release after each burst of changes, none while they come.
    #[tokio::test(start_paused = true)]
    async fn releases_once_after_each_burst() {
        let (tx, rx) = watch::channel(0);
        let released = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = std::sync::Arc::clone(&released);
        let task = tokio::spawn(after_bursts(rx, Duration::from_secs(1), move || {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async {}
        }));
        let released = move || released.load(std::sync::atomic::Ordering::SeqCst);
        for burst in 1..=2 {
            for n in 0..5 {
                tx.send_replace(n);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            assert_eq!(released(), burst - 1, "during burst {burst}");
            tokio::time::sleep(Duration::from_secs(2)).await;
            assert_eq!(released(), burst, "after burst {burst}");
        }
        drop(tx);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("it returns once the sender is gone")
            .unwrap();
        assert_eq!(released(), 2);
    }
}
