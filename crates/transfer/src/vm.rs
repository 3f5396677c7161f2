//! Local copies: a client moving a transfer's bytes between its own memory and a storage node's segment on the
//! same host in one kernel copy (`process_vm_writev`/`process_vm_readv`, Linux's cross-memory attach, as MPI
//! libraries use it between processes of one host).
//!
//! Over a socket, even a Unix one, every byte is copied twice (into the kernel, out of it) and the receiver is
//! woken per piece; here the node only checks the request and answers where the range is
//! (`TransferRequest::Locate`), holding it until the client's `Release`, and the client's own syscall copies the
//! bytes (measured on the 2-vCPU VM, 4 MiB: ~13 GB/s one way, against ~2–4 GB/s through loopback sockets).
//!
//! The client copies, not the node: a copy into the client's buffer happens inside the client's own call, so
//! nothing can land in a buffer after the call gave it back (a node writing into the client would, were the
//! client's wait cut short by a timeout). And the node trusts no address from a client: it only hands out
//! addresses of ranges it holds for a grant, and a client may act on them only if the kernel lets it write the
//! node's memory — the same right that would let it read and write all of that memory anyway (same user and
//! ptrace policy, or `CAP_SYS_PTRACE`). A node run as another user, or a sandbox that forbids these syscalls,
//! refuses the copy (`EPERM`): the lane then carries the bytes itself, grants checked as ever.
//!
//! The node is named by a pidfd opened from the socket's peer credentials (the kernel's word, not the node's),
//! and checked before each copy: a node that exited since is never mistaken for a process that got its pid.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::OwnedFd;

/// Bytes copied per call when the copy is summed as it goes: small enough that a piece is still in the CPU's
/// cache when it is summed right after the copy.
const SUM_PIECE: usize = 256 << 10;

#[cfg(test)]
thread_local! {
    /// Makes this thread's copies fail as the kernel fails a copy it does not permit (root may copy anywhere, so
    /// the tests cannot provoke the real `EPERM`).
    pub(crate) static DENY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Writes at least this long that are summed are summed on a thread of their own while the copy goes on (the
/// sum costs about as much as the copy; a thread, ~20 µs). Reads are summed piece by piece as they land: handing
/// landed pieces to another thread measured slower (1 MiB gets p50 197 vs 120 µs, 4 MiB no faster).
const PARALLEL_SUM_MIN: usize = 1 << 20;

/// Copies `pieces` one by one with `copy`, which returns each piece's bytes once they are in place; returns their
/// crc32c if `checksum` (else 0), summed right after each piece is copied (while it is still in cache).
fn summed<'a, P>(
    pieces: impl Iterator<Item = P>,
    checksum: bool,
    mut copy: impl FnMut(P) -> Result<&'a [u8], CopyError>,
) -> Result<u32, CopyError> {
    let mut crc = 0;
    for piece in pieces {
        let bytes = copy(piece)?;
        if checksum {
            crc = crc32c::crc32c_append(crc, bytes);
        }
    }
    Ok(crc)
}

/// Why a local copy did not happen.
#[derive(Debug)]
pub(crate) enum CopyError {
    /// The kernel does not let this process reach the node's memory (another user, a sandbox): use the socket.
    Denied,
    /// The node exited, or the range was not mapped (a node breaking the protocol).
    Failed(io::Error),
}

/// The storage node at the other end of a local lane, whose memory the client copies to and from.
#[derive(Debug)]
pub(crate) struct RemoteProcess {
    pid: libc::pid_t,
    /// Readable once the process exits; checked before every copy.
    pidfd: OwnedFd,
}

impl RemoteProcess {
    /// The process at the other end of `sock` (a connected Unix socket), by the kernel's peer credentials.
    pub(crate) fn peer_of(sock: &tokio::net::UnixStream) -> io::Result<RemoteProcess> {
        let pid = sock.peer_cred()?.pid().ok_or_else(|| io::Error::other("the peer's pid is unknown"))?;
        let raw = rustix::process::Pid::from_raw(pid).ok_or_else(|| io::Error::other("the peer's pid is invalid"))?;
        let pidfd = rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty())?;
        Ok(RemoteProcess { pid, pidfd })
    }

    /// A duplicate of the node's descriptor `fd` (`pidfd_getfd(2)`: the kernel allows it under the same
    /// ptrace check as the copies), if it is the file with inode `inode`. `Denied` where the kernel refuses.
    pub(crate) fn take_fd(&self, fd: i32, inode: u64) -> Result<OwnedFd, CopyError> {
        let taken =
            rustix::process::pidfd_getfd(&self.pidfd, fd, rustix::process::PidfdGetfdFlags::empty()).map_err(|e| {
                match e {
                    rustix::io::Errno::PERM | rustix::io::Errno::ACCESS | rustix::io::Errno::NOSYS => CopyError::Denied,
                    e => CopyError::Failed(e.into()),
                }
            })?;
        let stat = rustix::fs::fstat(&taken).map_err(|e| CopyError::Failed(e.into()))?;
        if stat.st_ino != inode {
            return Err(CopyError::Failed(io::Error::other("the node's descriptor names another file")));
        }
        Ok(taken)
    }

    /// Another handle on the same process (a duplicate of its pidfd).
    pub(crate) fn try_clone(&self) -> io::Result<RemoteProcess> {
        Ok(RemoteProcess { pid: self.pid, pidfd: self.pidfd.try_clone()? })
    }

    /// Whether the process still runs (its pid still names it).
    pub(crate) fn alive(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(&self.pidfd, rustix::event::PollFlags::IN)];
        matches!(rustix::event::poll(&mut fds, Some(&rustix::event::Timespec::default())), Ok(0))
    }

    /// Copies `data` to `addr` in the node's memory; returns its crc32c if `checksum` (else 0): a long write's
    /// summed on a helper thread meanwhile ([`PARALLEL_SUM_MIN`], `copy::join`), a short one's piece by piece ([`summed`]).
    pub(crate) fn write(&self, addr: u64, data: &[u8], checksum: bool) -> Result<u32, CopyError> {
        let copy = |sum| summed(data.chunks(SUM_PIECE).enumerate(), sum, |(i, piece)| self.write_piece(addr, i, piece));
        if checksum && data.len() >= PARALLEL_SUM_MIN {
            let (crc, copied) = crate::copy::join(|| crc32c::crc32c(data), || copy(false));
            return copied.map(|_| crc);
        }
        copy(checksum)
    }

    /// Copies the `i`-th piece of a write to its place after `addr`.
    fn write_piece<'a>(&self, addr: u64, i: usize, piece: &'a [u8]) -> Result<&'a [u8], CopyError> {
        self.copy(addr + (i * SUM_PIECE) as u64, piece.len(), |remote| {
            let local = libc::iovec { iov_base: piece.as_ptr() as *mut libc::c_void, iov_len: piece.len() };
            // SAFETY: `local` describes `piece`, a live shared borrow the kernel only reads; `remote` is memory of
            // another process, outside this one's memory model.
            unsafe { libc::process_vm_writev(self.pid, &local, 1, remote, 1, 0) }
        })?;
        Ok(piece)
    }

    /// Copies from `addr` in the node's memory into `buf`; returns its crc32c if `checksum` (else 0), summed as
    /// each piece lands ([`summed`]).
    pub(crate) fn read(&self, addr: u64, buf: &mut [u8], checksum: bool) -> Result<u32, CopyError> {
        summed(buf.chunks_mut(SUM_PIECE).enumerate(), checksum, |(i, piece)| {
            let (base, len) = (piece.as_mut_ptr(), piece.len());
            self.copy(addr + (i * SUM_PIECE) as u64, len, |remote| {
                let local = libc::iovec { iov_base: base.cast(), iov_len: len };
                // SAFETY: `local` describes `piece`, a live exclusive borrow the kernel writes (any bytes are
                // valid `u8`s); `remote` is memory of another process, outside this one's memory model.
                unsafe { libc::process_vm_readv(self.pid, &local, 1, remote, 1, 0) }
            })?;
            Ok(&*piece)
        })
    }

    /// One whole copy of `len` bytes at `addr` by `call` (given the remote iovec); the kernel may copy less
    /// than asked only when it hits a fault, which ends the copy.
    fn copy(&self, addr: u64, len: usize, call: impl Fn(&libc::iovec) -> isize) -> Result<(), CopyError> {
        #[cfg(test)]
        if DENY.with(std::cell::Cell::get) {
            return Err(CopyError::Denied);
        }
        if !self.alive() {
            return Err(CopyError::Failed(io::Error::other("the storage node exited")));
        }
        let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len };
        let copied = call(&remote);
        if copied < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EPERM | libc::EACCES | libc::ENOSYS) => CopyError::Denied,
                _ => CopyError::Failed(e),
            });
        }
        if copied as usize != len {
            return Err(CopyError::Failed(io::Error::other(format!("copied {copied} of {len} bytes"))));
        }
        Ok(())
    }
}
