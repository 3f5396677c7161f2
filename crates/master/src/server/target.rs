//! [`Target`]: what the RPC and admin servers answer with. A lone master serves one [`MasterService`] for its
//! whole life; a candidate (issue 15 §2) serves one only while it leads, under a lease checked on every
//! request, and otherwise refuses with the not-leader error naming the leader it knows of.

use crate::ha::role::HaStatus;
use crate::service::MasterService;
use arc_swap::ArcSwapOption;
use crescent_ha::leader::LeaseGuard;
use crescent_ha::leader::watch::not_leader_message;
use crescent_proto::ErrorCode;
use crescent_proto::wire::ErrorFrame;
use std::ops::Deref;
use std::sync::Arc;
use tokio::sync::watch;

/// The code of the not-leader refusal (its message carries `crescent_ha::leader::watch::NOT_LEADER_MARKER`).
pub const NOT_LEADER: ErrorCode = ErrorCode::UnavailableInCurrentStatus;

/// What the servers answer with.
#[derive(Clone)]
pub enum Target {
    /// One service, always (a master that is not a candidate).
    Fixed(Arc<MasterService>),
    /// Whatever the candidate's role is now.
    Elected(Arc<Elected>),
}

/// A candidate's serving state: the service of its current term while it leads, and its HA status.
pub struct Elected {
    leading: ArcSwapOption<Leading>,
    status: watch::Sender<HaStatus>,
}

/// One term as leader: the service and the lease it serves under.
pub struct Leading {
    svc: Arc<MasterService>,
    guard: LeaseGuard,
}

/// The service a request runs against (borrowed from a fixed target, held for a term's).
pub enum Served<'a> {
    /// A fixed target's service.
    Fixed(&'a Arc<MasterService>),
    /// The current term's service.
    Term(Arc<Leading>),
}

impl Served<'_> {
    /// The lease of the term served (none for a fixed target's service).
    pub fn lease(&self) -> Option<&LeaseGuard> {
        match self {
            Served::Fixed(_) => None,
            Served::Term(l) => Some(&l.guard),
        }
    }
}

impl Deref for Served<'_> {
    type Target = Arc<MasterService>;

    fn deref(&self) -> &Arc<MasterService> {
        match self {
            Served::Fixed(s) => s,
            Served::Term(l) => &l.svc,
        }
    }
}

impl Target {
    /// The service to run a request against, or the refusal of a master that does not lead (its lease is
    /// checked now: a leader past its lease refuses before another can have been elected).
    pub fn route(&self) -> Result<Served<'_>, ErrorFrame> {
        match self {
            Target::Fixed(svc) => Ok(Served::Fixed(svc)),
            Target::Elected(e) => match e.leading.load_full() {
                Some(l) if l.guard.holds() => Ok(Served::Term(l)),
                _ => Err(e.refusal()),
            },
        }
    }

    /// The candidate's state, if this is one.
    pub fn elected(&self) -> Option<&Arc<Elected>> {
        match self {
            Target::Fixed(_) => None,
            Target::Elected(e) => Some(e),
        }
    }
}

impl Elected {
    /// A candidate that does not lead yet.
    pub fn new(status: HaStatus) -> Arc<Self> {
        Arc::new(Self { leading: ArcSwapOption::empty(), status: watch::channel(status).0 })
    }

    /// Serves `svc` while `guard` holds.
    pub fn lead(&self, svc: Arc<MasterService>, guard: LeaseGuard) {
        self.leading.store(Some(Arc::new(Leading { svc, guard })));
    }

    /// Stops serving at once (requests in hand finish against the term's service).
    pub fn step_down(&self) {
        self.leading.store(None);
    }

    /// The status now.
    pub fn status(&self) -> HaStatus {
        self.status.borrow().clone()
    }

    /// Changes of the status.
    pub fn subscribe(&self) -> watch::Receiver<HaStatus> {
        self.status.subscribe()
    }

    /// Updates the status.
    pub fn update(&self, f: impl FnOnce(&mut HaStatus)) {
        self.status.send_modify(f);
    }

    /// The not-leader refusal, naming the leader this candidate knows of.
    pub fn refusal(&self) -> ErrorFrame {
        let s = self.status.borrow();
        let leader = s.leader.as_deref().filter(|_| !s.is_leader());
        let message = match leader {
            Some(l) => format!("{} (view {})", not_leader_message(Some(l)), s.view_version),
            None => not_leader_message(None),
        };
        ErrorFrame { code: NOT_LEADER, message }
    }
}
