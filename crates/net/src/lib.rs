//! Connection plumbing shared by every Crescent server and client: what happens on a socket before and around
//! the requests, so the master's RPC server, the storage nodes' transfer server and both clients do it one way.
//!
//! * [`accept`]: the accept loop (a task per connection kept in a `JoinSet`, a connection cap that closes the
//!   longest-idle connection to make room or refuses a newcomer, exponential back-off on accept errors with
//!   rate-limited warnings, connections told to stop and drained on shutdown) and the [`ServerHandle`] that
//!   stops it.
//! * [`hello`]: the hello handshake, client side ([`hello::open`]) and server side ([`hello::answer`]), with the
//!   challenge-response of [`auth`] when the server holds a keyring.
//! * [`auth`]: the cluster secret ([`auth::Keyring`], two during a rotation), the per-principal credentials
//!   derived from it, the handshake's MACs, and the rate-limited count of failed authentications.
//! * [`host`]: what a host of segments holds instead of the secret: grant and ticket keys derived from its own
//!   credential ([`host::NodeKeys`]), and the data-plane tickets the master issues clients for it.
//! * [`frame`]: reading frames in steps (prefix checked against the limit first, header, payload wherever it
//!   belongs), vectored writes, and [`frame::refuse`], the last frame of a connection that broke the protocol.
//! * [`inbound`]: whole frames a server reads without letting a peer pin its memory (a small allowance per
//!   connection, larger frames within a budget shared by all, buffers released after a large frame).
//! * [`poll`]: bounded busy-polling before a waiting end parks, the per-process poll gate, and the idle set a
//!   runtime polls before it sleeps.
//! * [`conn`]: [`conn::Conn`], a connection's byte stream, plain TCP or TLS over it.
//! * [`tls`]: TLS (rustls) for servers and clients, and the files it is loaded from.
//! * [`advertise`]: the address a server advertises when it listens on an unspecified one.
//! * [`reader`]: [`reader::FrameReader`], frames read straight from a socket a poll found readable.
//!
//! The frame layout and the messages are `crescent-proto`'s; this crate owns none of them.

pub mod accept;
pub mod advertise;
pub mod auth;
pub mod conn;
pub mod frame;
pub mod grant;
pub mod hello;
pub mod host;
pub mod inbound;
pub mod poll;
pub mod reader;
pub mod tls;

pub use accept::{AcceptCounters, AcceptStats, ServerHandle, Shutdown, Stopping};
