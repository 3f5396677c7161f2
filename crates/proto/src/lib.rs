//! Crescent's wire vocabulary.
//!
//! Every type that crosses a process boundary lives here, so the master, storage nodes and clients agree on one
//! definition. The crate holds no behaviour beyond validation: a value of one of these types is always valid
//! (constructors check, deserialisation re-checks), so code that receives one never re-validates it.

pub mod batch;
pub mod config;
pub mod error;
pub mod ids;
pub mod key;
pub mod replica;
pub mod rpc;
pub mod segment;
pub mod tenant;
pub mod transfer;
pub mod wire;

pub use config::{ObjectDataType, ReplicateConfig, SoftPinAction};
pub use error::{ErrorCode, ErrorCodeUnknown};
pub use ids::{ClientId, SegmentId};
pub use key::{KeyError, MAX_KEY_LEN, ObjectKey};
pub use replica::{ReplicaDescriptor, ReplicaLocation, ReplicaStatus};
pub use rpc::{ClientStatus, GetReplicaListResponse, MasterOp, MasterReply, MasterRequest, MasterResponse};
pub use segment::{SegmentKind, SegmentSpec, SegmentStatus};
pub use tenant::{TenantId, TenantIdError};
