//! The TOML config file (`crescent --config FILE`): `FileConfig::parse`, which `FileConfig::load` runs on the
//! file's text, then what the commands derive from it.
//!
//! Properties: no panic on any text; a config that parses resolves into client settings without panicking.
#![no_main]

use crescent_cli::config::{FileConfig, Global};
use crescent_fuzz::write_seeds;
use libfuzzer_sys::fuzz_target;

fn seeds() -> Vec<Vec<u8>> {
    [
        "",
        "master = \"10.0.0.1:1\"\ntenant = \"t\"\n",
        r#"
master = "10.0.0.1:1"
[server]
listen = "127.0.0.1:0"
advertise = "10.0.0.2"
lease_ttl_ms = 5000
enable_multi_tenants = true
placement_policy = "local-first"
poll_us = 0
[node]
segment_size = "64MiB"
advertise = "node-1.example"
segments = 2
prefault = false
poll_us = 20
threads = 3
[client]
replicas = 2
stripe_size = "1MiB"
write_stripe_size = "8MiB"
poll_us = 7
"#,
        "[server]\nlistn = \"127.0.0.1:1\"\n",
        "[client]\nstripe_size = \"99999999999TiB\"\n",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}

fuzz_target!(init: write_seeds(seeds), |data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(file) = FileConfig::parse(text) {
        let global = Global::resolve(&None, &None, &file);
        let _ = global.client_config();
    }
});
