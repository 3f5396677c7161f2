//! The SSD tier's node side: a storage node's local disk, holding the objects evicted from its memory segment.
//!
//! The master owns the disk's address space (a `Disk`-kind segment as large as the disk given to the node) and
//! allocates ranges in it in whole 4 KiB blocks; this module stores and serves those ranges.
//!
//! * [`AlignedBuf`] (`buf`): block-aligned heap buffers, as `O_DIRECT` requires (the module's only `unsafe`).
//! * [`BlockDevice`] (`device`): the seam. [`FileDevice`] (`DIR/crescent-ssd.data`, wiped at start, locked
//!   against a second node, `O_DIRECT` where the filesystem allows), [`MemoryDevice`], [`FaultyDevice`].

mod buf;
mod device;

pub use buf::{AlignedBuf, BLOCK};
pub use device::{BlockDevice, DATA_FILE, DeviceError, FaultyDevice, FileDevice, MemoryDevice};
