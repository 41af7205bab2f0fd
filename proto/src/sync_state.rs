//! How sync states rank when several are summed up in one (a proxy's connections, or its four xDS
//! types): STALE says most, then SYNCED, then NOT SENT.

use crate::store::v1::SyncState;

impl SyncState {
    /// The state an `i32` on the wire names; an unknown value counts as NOT SENT.
    pub fn from_wire(state: i32) -> SyncState {
        SyncState::try_from(state).unwrap_or(SyncState::NotSent)
    }

    /// How much the state says something is wrong: the worst of several is the one reported.
    pub fn severity(self) -> u8 {
        match self {
            SyncState::Stale => 2,
            SyncState::Synced => 1,
            _ => 0,
        }
    }

    /// The worst of `states`; NOT SENT when there are none.
    pub fn worst(states: impl IntoIterator<Item = SyncState>) -> SyncState {
        states.into_iter().fold(SyncState::NotSent, |worst, s| {
            if s.severity() > worst.severity() {
                s
            } else {
                worst
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_outranks_synced_outranks_not_sent() {
        use SyncState::{NotSent, Stale, Synced};
        assert_eq!(SyncState::worst([Synced, Stale, NotSent]), Stale);
        assert_eq!(SyncState::worst([NotSent, Synced]), Synced);
        assert_eq!(SyncState::worst([]), NotSent);
        assert_eq!(SyncState::from_wire(99), NotSent);
    }
}
