//! UUIDv7 identifier newtypes. `UserId` is special: outside this module only the auth layer and
//! durable records written under an authenticated user may construct one.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

macro_rules! uuid_id {
    ($(#[$meta:meta])* $name:ident, $what:literal) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(Uuid);

        impl $name {
            /// A fresh, time-ordered identifier.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            pub fn from_uuid(id: Uuid) -> Self {
                Self(id)
            }

            pub fn as_uuid(&self) -> Uuid {
                self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = String;

            fn from_str(text: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(text)
                    .map(Self)
                    .map_err(|_| format!("invalid {} id: expected a UUID", $what))
            }
        }
    };
}

uuid_id!(ThreadId, "thread");
uuid_id!(MessageId, "message");
uuid_id!(RunId, "run");
uuid_id!(MemoryId, "memory");
uuid_id!(JobId, "job");
uuid_id!(DocumentId, "document");
uuid_id!(
    /// One running server process (a replica): made fresh at every start, it names the owner
    /// of the runs the process executes.
    ReplicaId,
    "replica"
);

/// The identity of an authenticated user. There is deliberately no public constructor from a
/// UUID: handlers get one only from the `AuthUser` extractor, and the store builds them from
/// rows it owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct UserId(Uuid);

impl UserId {
    /// For the store only: ids of rows it reads back.
    pub(in crate::store) fn from_trusted(id: Uuid) -> Self {
        Self(id)
    }

    /// A fresh id for unit tests of the indexes, which never see a store.
    #[cfg(test)]
    pub(crate) fn for_tests() -> Self {
        Self(Uuid::now_v7())
    }

    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
