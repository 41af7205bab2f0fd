//! Any bytes as what an xDS client sends on the agent's Unix socket, through the front that
//! rewrites HTTP/2 header blocks: it may refuse them, never panic or loop.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut sink = tokio::io::sink();
        let _ = pasa_agent::ads::front_pump(data, &mut sink).await;
    });
});
