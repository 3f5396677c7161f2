//! Process-independent identifiers (UUIDs).

use serde::{Deserialize, Serialize};
use std::fmt;
use uuid::Uuid;

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            /// A fresh random (v4) id.
            pub fn random() -> Self {
                Self(Uuid::new_v4())
            }

            /// The id built from its two 64-bit halves (the original system's `pair<u64,u64>` form).
            pub fn from_u64_pair(high: u64, low: u64) -> Self {
                Self(Uuid::from_u64_pair(high, low))
            }

            /// The id as its two 64-bit halves.
            pub fn as_u64_pair(&self) -> (u64, u64) {
                self.0.as_u64_pair()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }

        /// A UUID's text, or the original system's `HIGH-LOW` form (two decimal 64-bit halves), as its admin
        /// HTTP API prints ids.
        impl std::str::FromStr for $name {
            type Err = uuid::Error;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let decimal = |t: &str| {
                    t.bytes().all(|b| b.is_ascii_digit()).then(|| t.parse::<u64>().ok()).flatten()
                };
                let halves = s.split_once('-').and_then(|(h, l)| Some((decimal(h)?, decimal(l)?)));
                match halves {
                    Some((high, low)) => Ok(Self::from_u64_pair(high, low)),
                    None => Uuid::parse_str(s).map(Self),
                }
            }
        }
    };
}

uuid_id!(
    /// Identifies one client process (a library instance or a storage node) for liveness and ownership.
    ClientId
);
uuid_id!(
    /// Identifies one mounted segment; replica addresses are `(SegmentId, offset)` pairs.
    SegmentId
);
uuid_id!(
    /// Identifies one copy or move task, or one drain job (the original's task UUID).
    TaskId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_text_and_pairs() {
        let id = SegmentId::random();
        let parsed: SegmentId = id.to_string().parse().unwrap();
        assert_eq!(parsed, id);
        let (h, l) = id.as_u64_pair();
        assert_eq!(SegmentId::from_u64_pair(h, l), id);
        let original: SegmentId = format!("{h}-{l}").parse().unwrap();
        assert_eq!(original, id, "the original's HIGH-LOW form");
        for bad in ["1-", "-1", "1-2-3", "x-1", "+1-2", "1-+2", "18446744073709551616-1", ""] {
            assert!(bad.parse::<SegmentId>().is_err(), "{bad}");
        }
        assert_ne!(ClientId::random(), ClientId::random());
    }
}
