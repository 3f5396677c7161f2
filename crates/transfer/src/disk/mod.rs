//! The SSD tier's node side: a storage node's local disk, holding the objects evicted from its memory segment.
//!
//! The master owns the disk's address space (a `Disk`-kind segment as large as the disk given to the node) and
//! allocates ranges in it in whole 4 KiB blocks; this module stores and serves those ranges.
//!
//! * [`AlignedBuf`] (`buf`): block-aligned heap buffers, as `O_DIRECT` requires (the module's only `unsafe`).
//! * [`BlockDevice`] (`device`): the seam. [`FileDevice`] (`DIR/crescent-ssd.data`, wiped at start, locked
//!   against a second node, `O_DIRECT` where the filesystem allows), [`MemoryDevice`], [`FaultyDevice`].
//! * [`DiskSegment`] (`segment`): async reads and writes of byte ranges, made on the segment's own I/O threads
//!   with a bounded queue; `copy_in`/`copy_out` between it and a memory segment (offload and promotion).

mod buf;
mod device;
mod segment;

pub use buf::{AlignedBuf, BLOCK};
pub use device::{BlockDevice, DATA_FILE, DeviceError, FaultyDevice, FileDevice, MemoryDevice};
pub use segment::{DiskBytes, DiskConfig, DiskError, DiskSegment, DiskStats};
