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
        crescent_cli::config::EXAMPLE,
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
