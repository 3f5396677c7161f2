//! Where key listings run (`ListKeys`, `ListKeysPage`, `/keys`): on one thread per process, at a lowered CPU
//! priority (nice +10 on Linux), one listing at a time in arrival order. A listing visits the whole index;
//! on a request worker it would hold up every request queued behind it, and several at once would take
//! every CPU. Here they wait asleep (no thread each), and the scan gets only the CPU the data path leaves.
//!
//! The scan itself rests half the time (`service::listing::LISTING_PACE`): nice orders threads within the
//! master's own cgroup, not the master's share against other processes. The scan holds a route lock only to
//! copy a chunk of handles, so the low priority cannot hold up a writer for long.

use crescent_proto::ErrorCode;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::time::{Duration, Instant};

/// How long a listing may wait for its turn: one that waited longer is refused as busy
/// (`UNAVAILABLE_IN_CURRENT_STATUS`, 503 on HTTP) when its turn comes.
pub const LISTING_WAIT: Duration = Duration::from_secs(10);

/// Listings that may wait at once; more are refused as busy at once.
pub const MAX_WAITING: usize = 64;

/// The listing thread's nice value (0 is the default; 19 the lowest priority).
const NICE: i32 = 10;

/// A listing: called with whether it waited past [`LISTING_WAIT`] (it then answers busy without running).
type Job = Box<dyn FnOnce(bool) + Send>;

static THREAD: OnceLock<Option<Sender<(Instant, Job)>>> = OnceLock::new();
static WAITING: AtomicUsize = AtomicUsize::new(0);
static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Listings running now (0 or 1) and waiting their turn, in this process.
pub fn load() -> (usize, usize) {
    (RUNNING.load(Ordering::Relaxed), WAITING.load(Ordering::Relaxed))
}

/// The message of a listing refused as busy.
pub fn busy_message() -> String {
    format!(
        "other key listings kept the master busy for {} s (they run one at a time); try again",
        LISTING_WAIT.as_secs()
    )
}

/// Runs `job` on the listing thread and waits (asleep) for its answer. `UNAVAILABLE_IN_CURRENT_STATUS` when
/// [`MAX_WAITING`] listings already wait or this one waited past [`LISTING_WAIT`]; `INTERNAL_ERROR` if the
/// job panicked.
pub async fn run<T: Send + 'static>(job: impl FnOnce() -> T + Send + 'static) -> Result<T, ErrorCode> {
    let Some(thread) = THREAD.get_or_init(start) else {
        // No thread could be started (logged once): a blocking thread still keeps the workers free.
        return tokio::task::spawn_blocking(job).await.map_err(|_| ErrorCode::InternalError);
    };
    if WAITING.fetch_add(1, Ordering::AcqRel) >= MAX_WAITING {
        WAITING.fetch_sub(1, Ordering::AcqRel);
        return Err(ErrorCode::UnavailableInCurrentStatus);
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move |late| {
        let answer = if late { Err(ErrorCode::UnavailableInCurrentStatus) } else { Ok(job()) };
        // Done before the caller hears of it, so `load` never counts an answered listing.
        RUNNING.store(0, Ordering::Relaxed);
        let _ = tx.send(answer);
    });
    if thread.send((Instant::now(), job)).is_err() {
        WAITING.fetch_sub(1, Ordering::AcqRel);
        return Err(ErrorCode::InternalError);
    }
    // A dropped sender: the job panicked.
    rx.await.unwrap_or(Err(ErrorCode::InternalError))
}

fn start() -> Option<Sender<(Instant, Job)>> {
    let (tx, rx) = mpsc::channel::<(Instant, Job)>();
    let spawned = std::thread::Builder::new().name("crescent-lister".into()).spawn(move || {
        lower_priority();
        while let Ok((queued, job)) = rx.recv() {
            WAITING.fetch_sub(1, Ordering::AcqRel);
            RUNNING.store(1, Ordering::Relaxed);
            let late = queued.elapsed() > LISTING_WAIT;
            // A panicking listing drops its answer (the caller sees INTERNAL_ERROR); the thread serves on.
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(late))).is_err() {
                tracing::error!("a key listing panicked");
            }
            RUNNING.store(0, Ordering::Relaxed);
        }
    });
    match spawned {
        Ok(_) => Some(tx),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the listing thread; listings run on blocking threads");
            None
        }
    }
}

/// Lowers the calling thread's CPU priority (on Linux a nice value is per thread).
fn lower_priority() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        #[allow(unsafe_code)]
        // SAFETY: `setpriority` takes plain integers (who = 0: the calling thread) and touches no memory.
        let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, NICE) };
        if rc != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "the listing thread keeps its priority");
        }
    }
}

/// The listing thread is the process's: tests that watch it take turns here.
#[cfg(test)]
pub(crate) static TEST_TURNS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn listings_run_one_at_a_time_in_arrival_order_and_a_panic_is_an_error() {
        let _turn = TEST_TURNS.lock().await;
        let (release, held) = std::sync::mpsc::channel::<()>();
        let blocker = tokio::spawn(run(move || held.recv().is_ok()));
        assert!(crescent_testkit::eventually(Duration::from_secs(10), || async { load().0 == 1 }).await);
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut queued = Vec::new();
        for i in 0..3 {
            let order = order.clone();
            queued.push(tokio::spawn(run(move || order.lock().map(|mut o| o.push(i)).is_ok())));
            assert!(crescent_testkit::eventually(Duration::from_secs(10), || async { load().1 == i + 1 }).await);
        }
        assert!(order.lock().unwrap().is_empty(), "nothing ran beside the first listing");
        release.send(()).unwrap();
        assert_eq!(blocker.await.unwrap(), Ok(true));
        for q in queued {
            assert_eq!(q.await.unwrap(), Ok(true));
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
        assert_eq!(run(|| -> u8 { panic!("a bug") }).await, Err(ErrorCode::InternalError));
        assert_eq!(run(|| 7).await, Ok(7), "the thread serves on");
        assert_eq!(load(), (0, 0));
    }
}
