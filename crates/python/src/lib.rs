//! Crescent's Python package, native part: the module `crescent._crescent`, re-exported as `crescent.store`
//! and as `mooncake.store` (the original's module name, so engine code runs unmodified).
//!
//! Module map: [`store`] (`MooncakeDistributedStore`), [`host_mem`] (`MooncakeHostMemAllocator`), [`config`] (`ReplicateConfig`, the enums, `setup(dict)`
//! sizes), [`raw`] (registered caller buffers: the only place raw addresses become slices), [`replica`] (the
//! replica descriptors `get_replica_desc` returns).

pub mod config;
pub mod host_mem;
pub mod raw;
pub mod replica;
pub mod store;

use pyo3::prelude::*;

/// Logs go to stderr, filtered by `CRESCENT_LOG` (e.g. `info`, `crescent_client=debug`; default `warn`).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CRESCENT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// `setup(dict)`'s size parser, for tests: bytes, or `None` if `text` is not a size.
#[pyfunction]
fn _parse_size(text: &str) -> Option<u64> {
    config::parse_size(text)
}

/// The native module.
#[pymodule]
fn _crescent(m: &Bound<'_, PyModule>) -> PyResult<()> {
    init_logging();
    m.add_class::<store::Store>()?;
    m.add_class::<host_mem::HostMemAllocator>()?;
    m.add_class::<config::ReplicateConfig>()?;
    m.add_class::<config::SoftPinAction>()?;
    m.add_class::<config::ObjectDataType>()?;
    m.add_class::<config::ReplicaStatus>()?;
    m.add_class::<config::TaskType>()?;
    m.add_class::<config::TaskStatus>()?;
    m.add_class::<config::QueryTaskResponse>()?;
    replica::register(m)?;
    for (name, value) in config::ObjectDataType::ALL {
        m.add(name, value)?;
    }
    m.add_function(wrap_pyfunction!(_parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(store::_bytes_address, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
