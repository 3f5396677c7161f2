//! The long poll of a node's workers (disk tasks, copy tasks): each on a master connection of its own, backing
//! off after a failed poll, and ending when the node stops.

use crescent_client::ClientError;
use crescent_client::master::MasterConnection;
use crescent_proto::{MasterRequest, MasterResponse};
use std::time::Duration;
use tokio::sync::watch;

/// Longest pause between polls after a failed one.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// One worker's polls: the pause after failures, and the node's stop signal.
pub(crate) struct Poller {
    what: &'static str,
    pause: Duration,
    stopped: watch::Receiver<bool>,
}

impl Poller {
    /// Polls for `what` (named in logs) until `stopped` says the node stops.
    pub(crate) fn new(what: &'static str, stopped: watch::Receiver<bool>) -> Self {
        Self { what, pause: Duration::ZERO, stopped }
    }

    /// Waits out the pause a failure set, then sends `req`; `None` once the node stops.
    pub(crate) async fn call(
        &mut self,
        master: &MasterConnection,
        req: &MasterRequest,
    ) -> Option<Result<MasterResponse, ClientError>> {
        if *self.stopped.borrow() {
            return None;
        }
        if !self.pause.is_zero() {
            tokio::select! {
                _ = self.stopped.changed() => return None,
                () = tokio::time::sleep(self.pause) => {}
            }
        }
        tokio::select! {
            _ = self.stopped.changed() => None,
            r = master.call(req) => Some(r),
        }
    }

    /// The poll was answered as expected: the next goes at once.
    pub(crate) fn answered(&mut self) {
        self.pause = Duration::ZERO;
    }

    /// The poll failed (or was answered with something else): the next waits, longer each time.
    pub(crate) fn failed(&mut self, reply: Result<MasterResponse, ClientError>) {
        match reply {
            Ok(other) => {
                tracing::warn!(?other, "unexpected answer to a {} poll", self.what);
                self.pause = RETRY_MAX;
            }
            Err(e) => {
                tracing::debug!(error = %e, "{} poll failed", self.what);
                self.pause = (self.pause * 2).clamp(Duration::from_millis(100), RETRY_MAX);
            }
        }
    }
}
