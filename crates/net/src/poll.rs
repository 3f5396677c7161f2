//! Bounded busy-polling of a socket before a task parks on it, shared by both planes.
//!
//! On small virtual machines a thread that parks halts its vCPU, and waking it when the next message arrives
//! costs tens of microseconds: on the 2-vCPU reference VM a blocking TCP ping-pong between two processes takes
//! about 60 µs per round trip, and about 10 µs when both ends poll. A peer that expects a message soon (a
//! client awaiting its reply, a server between the requests of a busy connection) therefore polls the socket
//! for a short window first. Each turn of the loop yields the CPU, so a poller never delays a runnable
//! thread: it only fills time the CPU would otherwise spend halted.

use rustix::event::{PollFd, PollFlags, Timespec};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The default polling window: longer than a loopback or LAN round trip, short enough that an idle poller
/// costs little.
pub const DEFAULT_POLL_WINDOW: Duration = Duration::from_micros(50);

/// Polls until `sock` has input (or end of stream, or an error to report) or `window` has passed; returns
/// whether it is readable. A zero window returns at once.
pub fn until_readable<S: AsFd>(sock: &S, window: Duration) -> bool {
    if window.is_zero() {
        return false;
    }
    let now = Timespec { tv_sec: 0, tv_nsec: 0 };
    let deadline = Instant::now() + window;
    loop {
        // poll(2) with a zero timeout reads the socket's state without taking its lock (a peeking recv would
        // take it, and a sender delivering to a locked socket is diverted to the slower backlog path).
        let mut fds = [PollFd::new(sock, PollFlags::IN | PollFlags::RDHUP)];
        match rustix::event::poll(&mut fds, Some(&now)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => {}
            _ => return true,
        }
        if Instant::now() >= deadline {
            return false;
        }
        // sched_yield: a runnable thread on this CPU (a peer process, another worker) runs first.
        std::thread::yield_now();
    }
}

/// Whether the peer of `sock` has closed it (end of stream, reset or error pending), checked without waiting or
/// reading: for a pooled connection about to be reused after a quiet spell, which a server may have closed
/// meanwhile (shed at its connection cap, restarted). Input waiting to be read is not a close.
pub fn peer_closed<S: AsFd>(sock: &S) -> bool {
    let now = Timespec { tv_sec: 0, tv_nsec: 0 };
    let mut fds = [PollFd::new(sock, PollFlags::RDHUP)];
    match rustix::event::poll(&mut fds, Some(&now)) {
        Ok(0) | Err(_) => false,
        Ok(_) => fds[0].revents().intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR),
    }
}

/// Admits one poller at a time. A poll holds its thread, so only one connection polls at once and the other
/// workers stay free for the rest.
#[derive(Debug, Default)]
pub struct PollGate {
    busy: AtomicBool,
}

impl PollGate {
    /// A new, open gate.
    pub const fn new() -> Self {
        Self { busy: AtomicBool::new(false) }
    }

    /// Polls `sock` for up to `window` if no one else is polling; returns whether it became readable.
    pub fn poll<S: AsFd>(&self, sock: &S, window: Duration) -> bool {
        self.try_poll(sock, window).unwrap_or(false)
    }

    /// Like [`PollGate::poll`], but `None` when it did not poll at all (zero window, or someone else polls).
    pub fn try_poll<S: AsFd>(&self, sock: &S, window: Duration) -> Option<bool> {
        if window.is_zero() || self.busy.swap(true, Ordering::Acquire) {
            return None;
        }
        let readable = until_readable(sock, window);
        self.busy.store(false, Ordering::Release);
        Some(readable)
    }
}

/// Request/reply exchanges a client has in flight, over both planes (its master connection and its transfer
/// lanes share one). A waiting end polls only while its exchange is the only one: a polling wait holds its
/// thread, and every other exchange that thread drives would stall behind it.
#[derive(Debug, Default)]
pub struct InFlight(AtomicUsize);

impl InFlight {
    /// Counts one exchange until the guard drops; the flag says whether it was the only one when it began.
    pub fn enter(self: &Arc<Self>) -> (InFlightGuard, bool) {
        let alone = self.0.fetch_add(1, Ordering::AcqRel) == 0;
        (InFlightGuard(self.clone()), alone)
    }

    /// Exchanges in flight now.
    pub fn count(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

/// One exchange counted in an [`InFlight`] while alive.
#[derive(Debug)]
pub struct InFlightGuard(Arc<InFlight>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Most waits skipped after a run of misses (see [`Adaptive`]).
const MAX_SKIP: u32 = 64;

/// Adapts one connection's polling to its traffic, as the kernel's halt-polling does: after a miss (nothing
/// arrived within the window) the next wait parks at once, after each further miss twice as many do (up to
/// 64), and a hit resets it. A connection whose next request rarely comes within a window (a client moving
/// megabytes between two metadata calls) stops spending CPU time that the data plane needs.
#[derive(Debug, Default)]
pub struct Adaptive {
    /// Waits left to park without polling.
    skip: u32,
    /// Consecutive misses.
    misses: u32,
}

impl Adaptive {
    /// Polls through `gate` unless this connection is backing off; returns whether `sock` became readable.
    pub fn poll<S: AsFd>(&mut self, gate: &PollGate, sock: &S, window: Duration) -> bool {
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        match gate.try_poll(sock, window) {
            Some(true) => {
                self.misses = 0;
                true
            }
            Some(false) => {
                self.misses = self.misses.saturating_add(1);
                self.skip = (1u32 << (self.misses - 1).min(6)).min(MAX_SKIP);
                false
            }
            None => false,
        }
    }
}

/// The gate every server of this process shares (a master and a storage node in one `crescent up` process
/// must not hold both workers polling, or neither can run the other's requests).
pub static PROCESS_GATE: PollGate = PollGate::new();

/// The server sockets of this process, watched as one so that a runtime about to sleep can poll them all
/// (see [`idle_park_hook`]). A storage node's requests arrive on many connections (several lanes per client),
/// so polling any single one of them misses most requests; polling the set catches the next request
/// whichever connection it comes on. Sockets are added when accepted; closing one removes it (epoll drops a
/// file's registrations when the file is released).
#[derive(Debug)]
pub struct IdleSet {
    /// An epoll instance with every watched socket registered level-triggered for input: the instance itself
    /// is readable exactly when one of them is, so it is polled like a socket.
    epoll: std::os::fd::OwnedFd,
}

impl IdleSet {
    /// An empty set.
    pub fn new() -> std::io::Result<Self> {
        Ok(Self { epoll: rustix::event::epoll::create(rustix::event::epoll::CreateFlags::CLOEXEC)? })
    }

    /// Adds `sock`.
    pub fn watch<S: AsFd>(&self, sock: &S) -> std::io::Result<()> {
        use rustix::event::epoll::{self, EventData, EventFlags};
        epoll::add(&self.epoll, sock, EventData::new_u64(0), EventFlags::IN | EventFlags::RDHUP)?;
        Ok(())
    }

    /// Polls through `gate` for up to `window` until any watched socket has input; returns whether one has.
    pub fn poll(&self, gate: &PollGate, window: Duration) -> bool {
        gate.poll(&self.epoll, window)
    }
}

/// The process's [`IdleSet`] (created on first use; `None` if the kernel refused an epoll instance, in which
/// case nothing polls).
pub fn idle_set() -> Option<&'static IdleSet> {
    static SET: std::sync::OnceLock<Option<IdleSet>> = std::sync::OnceLock::new();
    SET.get_or_init(|| IdleSet::new().map_err(|e| tracing::warn!(error = %e, "no idle polling")).ok()).as_ref()
}

/// Adds an accepted server connection to the process's [`IdleSet`] (best effort: a socket left out only
/// costs a wake-up).
pub fn watch_when_idle<S: AsFd>(sock: &S) {
    if let Some(set) = idle_set()
        && let Err(e) = set.watch(sock)
    {
        tracing::debug!(error = %e, "socket not added to the idle set");
    }
}

/// A hook for `tokio::runtime::Builder::on_thread_park`: before a worker sleeps, it polls every server
/// connection of the process for up to `window` (one worker at a time, through [`PROCESS_GATE`]), so a
/// request arriving meanwhile finds it awake, whichever connection it comes on. On the 2-vCPU VM this made a
/// one-thread `crescent up` serve 4 KiB gets at 34k/s instead of 19k/s and 1 MiB puts at 3182 instead of 2244
/// MiB/s. Useful on a runtime that runs the connections itself (current-thread); on a multi-threaded one the
/// sleeping worker holding the I/O driver is woken by the kernel anyway.
pub fn idle_park_hook(window: Duration) -> impl Fn() + Send + Sync + 'static {
    move || {
        if let Some(set) = idle_set() {
            set.poll(&PROCESS_GATE, window);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn in_flight_counts_exchanges_and_says_which_began_alone() {
        let f = Arc::new(InFlight::default());
        let (a, a_alone) = f.enter();
        let (b, b_alone) = f.enter();
        assert!(a_alone && !b_alone, "only the first exchange began alone");
        assert_eq!(f.count(), 2);
        drop(a);
        assert_eq!(f.count(), 1);
        drop(b);
        assert_eq!(f.count(), 0);
        assert!(f.enter().1, "alone again once the others ended");
    }

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        b.set_nonblocking(true).unwrap();
        (a, b)
    }

    #[test]
    fn reports_input_and_gives_up_after_the_window() {
        let (mut a, b) = pair();
        assert!(!until_readable(&b, Duration::from_micros(200)), "nothing was sent");
        assert!(!until_readable(&b, Duration::ZERO));
        a.write_all(b"x").unwrap();
        assert!(until_readable(&b, Duration::from_secs(10)), "a byte was sent");
        drop(a);
    }

    #[test]
    fn an_idle_set_reports_input_on_any_watched_socket_and_forgets_closed_ones() {
        let set = IdleSet::new().unwrap();
        let gate = PollGate::new();
        let window = Duration::from_micros(200);
        let (mut a1, b1) = pair();
        let (mut a2, b2) = pair();
        set.watch(&b1).unwrap();
        set.watch(&b2).unwrap();
        assert!(!set.poll(&gate, window), "no input yet");
        a2.write_all(b"x").unwrap();
        assert!(set.poll(&gate, Duration::from_secs(10)), "input on the second socket");
        drop(b2); // closed with its byte unread: no longer watched
        assert!(!set.poll(&gate, window), "a closed socket is not polled");
        a1.write_all(b"y").unwrap();
        assert!(set.poll(&gate, Duration::from_secs(10)), "input on the first socket");
        drop((a1, a2));
    }

    #[test]
    fn end_of_stream_counts_as_readable() {
        let (a, b) = pair();
        drop(a);
        assert!(until_readable(&b, Duration::from_secs(10)));
    }

    #[test]
    fn polling_backs_off_after_misses_and_resumes_on_a_hit() {
        let (mut a, b) = pair();
        let gate = PollGate::new();
        let window = Duration::from_micros(100);
        let mut adaptive = Adaptive::default();
        // Count the waits that actually polled over a stretch of misses: 1 poll, skip 1, poll, skip 2, ...
        let mut polled = 0;
        for _ in 0..(1 + 1 + 1 + 2 + 1 + 4 + 1) {
            let before = adaptive.skip;
            assert!(!adaptive.poll(&gate, &b, window));
            if before == 0 {
                polled += 1;
            }
        }
        assert_eq!(polled, 4, "misses back off exponentially");
        assert_eq!(adaptive.skip, 8);
        for _ in 0..1000 {
            adaptive.poll(&gate, &b, window);
        }
        assert!(adaptive.skip <= MAX_SKIP);
        // Wait out the backoff, then a hit resets it.
        a.write_all(b"x").unwrap();
        while adaptive.skip > 0 {
            assert!(!adaptive.poll(&gate, &b, window), "skipped waits do not poll");
        }
        assert!(adaptive.poll(&gate, &b, Duration::from_secs(10)));
        assert_eq!((adaptive.skip, adaptive.misses), (0, 0));
    }

    #[test]
    fn the_gate_admits_one_poller() {
        let (mut a, b) = pair();
        let gate = PollGate::new();
        a.write_all(b"x").unwrap();
        assert!(gate.poll(&b, Duration::from_secs(10)));
        gate.busy.store(true, Ordering::Relaxed);
        assert!(!gate.poll(&b, Duration::from_secs(10)), "a second poller is turned away");
        gate.busy.store(false, Ordering::Relaxed);
        assert!(gate.poll(&b, Duration::from_secs(10)), "the gate reopens");
    }
}
