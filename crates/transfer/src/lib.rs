//! The data plane.
//!
//! This crate will own: segment memory (anonymous or memfd-backed mmap regions a storage node mounts), the
//! transfer server that validates every `(segment, offset, length)` against what it hosts and serves one-sided
//! READ/WRITE, and pooled persistent peer connections (lanes, TCP_NODELAY, striping, same-process memcpy).
//! Nothing is implemented yet (issue: network cluster).
