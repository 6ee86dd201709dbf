//! The restart policy (docs/faults.md, "Process exits"): what the
//! supervisor does when the hub, a QEMU or an adapter process exits on its
//! own, and how many automatic restarts it tries. A pure function, so the
//! whole table is tested.

/// Automatic restarts of one node (after its adapter died) or of the hub
/// before the supervisor gives up on it: a process that dies again and
/// again is not fixed by restarting it.
pub const MAX_AUTO_RESTARTS: u32 = 3;

/// A process of the cluster that exited on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exited {
    /// The hub.
    Hub,
    /// Node `n`'s QEMU.
    Qemu(usize),
    /// Node `n`'s adapter process (per-guest mode).
    Adapter(usize),
}

/// What the supervisor does about an [`Exited`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reaction {
    /// Nothing more to stop: in-hub, the hub announced the node failed when
    /// its QEMU's socket closed. The node stays down until `restart`.
    NodeDown,
    /// Stop the node's adapter process, so the hub announces it failed and
    /// the others repair it out. The node stays down until `restart`.
    TakeOut(usize),
    /// Restart the node: adapter and QEMU (its guest reboots and late-joins).
    RestartNode(usize),
    /// Stop the node's QEMU and leave the node down (too many restarts).
    FailNode(usize),
    /// Restart the hub with the same arguments; the adapters rejoin.
    RestartHub,
    /// Restart the hub and every guest (in-hub: the guests' vfio-user
    /// clients never reconnect to a new hub).
    RebootCluster,
    /// Leave the hub down (too many restarts).
    GiveUpHub,
}

/// The policy: what follows `what` exiting, in-hub or per-guest, after
/// `restarts` earlier automatic restarts of the same thing.
pub fn reaction(in_hub: bool, what: Exited, restarts: u32) -> Reaction {
    match what {
        Exited::Qemu(_) if in_hub => Reaction::NodeDown,
        Exited::Qemu(n) => Reaction::TakeOut(n),
        Exited::Adapter(n) if restarts >= MAX_AUTO_RESTARTS => Reaction::FailNode(n),
        Exited::Adapter(n) => Reaction::RestartNode(n),
        Exited::Hub if restarts >= MAX_AUTO_RESTARTS => Reaction::GiveUpHub,
        Exited::Hub if in_hub => Reaction::RebootCluster,
        Exited::Hub => Reaction::RestartHub,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_policy() {
        use Reaction::*;
        // A dead QEMU takes its node out: per-guest by stopping its adapter,
        // in-hub the hub already announced it.
        assert_eq!(reaction(false, Exited::Qemu(1), 0), TakeOut(1));
        assert_eq!(reaction(true, Exited::Qemu(1), 0), NodeDown);
        // A dead adapter restarts its node, up to the limit.
        assert_eq!(reaction(false, Exited::Adapter(0), 0), RestartNode(0));
        assert_eq!(reaction(false, Exited::Adapter(0), MAX_AUTO_RESTARTS - 1), RestartNode(0));
        assert_eq!(reaction(false, Exited::Adapter(0), MAX_AUTO_RESTARTS), FailNode(0));
        // A dead hub is restarted; in-hub that is a cluster reboot.
        assert_eq!(reaction(false, Exited::Hub, 0), RestartHub);
        assert_eq!(reaction(true, Exited::Hub, 0), RebootCluster);
        assert_eq!(reaction(true, Exited::Hub, MAX_AUTO_RESTARTS), GiveUpHub);
    }
}
