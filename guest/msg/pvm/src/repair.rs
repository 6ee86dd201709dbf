//! Hosts that fail: which hosts of the task table imcd no longer lists,
//! for how long, and their repair out of the virtual machine's tables.
//!
//! imcd repairs a node out once it has been away for its flap grace plus
//! a margin (docs/faults.md, "Link flaps"); `imc_gethosts` stops listing
//! it at once, and a short flap, which imcd rides out, hides it for at
//! most the grace. So a host counts as failed once imcd has not listed
//! its node for [`HOST_AWAY`], longer than the grace and the repair
//! together, as UMP counts a peer dead (`ump::probe`): a short flap never
//! takes a host out. A daemon whose own node is not listed (its link is
//! down, and MEMBERS reads 0) decides nothing.
//!
//! The repair frees every entry of the host from the task table, its
//! daemon's included ([`crate::table::Table::remove_host`]); its group
//! members and mailbox entries then go as any gone task's do, and the
//! `PvmTaskExit` and `PvmHostDelete` requests about them fall due
//! (`crate::notify`). Every daemon watches and repairs (all are equal):
//! each step is one critical section of a table and removing what is
//! gone changes nothing, so two daemons doing it at once are harmless.
//!
//! Touched by the daemon's thread only.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use thiserror::Error;

/// How long imcd may not list a host's node before the host counts as
/// failed: imcd's flap grace (2 s) and repair margin (1 s), and a second
/// more (UMP's `NODE_AWAY`).
pub const HOST_AWAY: Duration = Duration::from_secs(4);

/// How long one question to imcd may take (it may be busy with the repair
/// itself); one that gives up decides nothing.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// What went wrong asking imcd.
#[derive(Debug, Error)]
pub enum RepairError {
    #[error("asking imcd which nodes are up: {0}")]
    Imc(#[from] imc_client::ImcError),
}

/// Since when each host has been missing.
#[derive(Default)]
pub struct Watch {
    away: HashMap<u32, Instant>,
    imc: Option<imc_client::Imc>,
    /// The nodes listed at the last look.
    before: Option<HashSet<u32>>,
    /// When the tables are to be stored again in full for nodes that came
    /// back ([`Watch::came_back`]).
    refresh_at: Vec<Instant>,
    /// The last request word answered ([`Watch::asked`]).
    answered: u64,
}

/// After a node comes back, when the tables are stored again for it: at
/// once, and twice more in case its receive mappings were not ready yet.
pub const REFRESH_AFTER: [Duration; 3] = [Duration::ZERO, Duration::from_secs(2), Duration::from_secs(5)];

impl Watch {
    /// The nodes imcd lists now (a new connection after one that failed).
    pub fn listed(&mut self) -> Result<HashSet<u32>, RepairError> {
        if self.imc.is_none() {
            let c = imc_client::Imc::connect()?;
            c.set_call_timeout(ASK_TIMEOUT)?;
            self.imc = Some(c);
        }
        let Some(c) = self.imc.as_ref() else { return Ok(HashSet::new()) };
        match c.gethosts() {
            Ok(h) => Ok(h.into_iter().map(|(n, _)| n).collect()),
            Err(e) => {
                self.imc = None;
                Err(e.into())
            }
        }
    }

    /// Whether the tables are due to be stored again in full at `now`:
    /// a node not listed at the last look is listed now (its imcd
    /// restarted, or it rebooted into the cluster: imcd sends a newcomer
    /// the directory but not what the regions hold), seen from a node that
    /// was listed both times (`me`, a node number).
    pub fn came_back(&mut self, listed: &HashSet<u32>, me: u32, now: Instant) -> bool {
        let before = self.before.replace(listed.clone());
        if let Some(b) = before.filter(|b| b.contains(&me) && listed.contains(&me)) {
            if listed.iter().any(|n| !b.contains(n)) {
                self.refresh_at = REFRESH_AFTER.iter().map(|d| now + *d).collect();
            }
        }
        let due = self.refresh_at.iter().any(|t| *t <= now);
        self.refresh_at.retain(|t| *t > now);
        due
    }

    /// Whether a node with an empty copy asked for the tables in full
    /// (`word`, the task table's request word: not zero and not answered
    /// yet).
    pub fn asked(&mut self, word: u64) -> bool {
        if word == 0 || word == self.answered {
            return false;
        }
        self.answered = word;
        true
    }

    /// Given the hosts with entries in the task table (`hosts`, host
    /// numbers), the nodes imcd lists (`listed`) and this host (`me`):
    /// the hosts that have been missing for [`HOST_AWAY`] at `now`, to be
    /// repaired out. A host listed again is forgotten; nothing is decided
    /// while this host's own node is not listed.
    pub fn failed(&mut self, hosts: &HashSet<u32>, listed: &HashSet<u32>, me: u32, now: Instant) -> Vec<u32> {
        let node = crate::vm::node_of_host;
        if !listed.contains(&node(me)) {
            self.away.clear();
            return Vec::new();
        }
        self.away.retain(|h, _| hosts.contains(h));
        let mut out = Vec::new();
        for &h in hosts {
            if h == me || listed.contains(&node(h)) {
                self.away.remove(&h);
                continue;
            }
            let since = *self.away.entry(h).or_insert(now);
            if now.duration_since(since) >= HOST_AWAY {
                out.push(h);
            }
        }
        out.sort_unstable();
        for h in &out {
            self.away.remove(h);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[u32]) -> HashSet<u32> {
        v.iter().copied().collect()
    }

    #[test]
    fn a_request_for_the_tables_is_answered_once() {
        let mut w = Watch::default();
        assert!(!w.asked(0));
        assert!(w.asked(7) && !w.asked(7), "once per request");
        assert!(w.asked(9), "a new request");
    }

    #[test]
    fn a_node_that_comes_back_gets_the_tables_three_times() {
        let mut w = Watch::default();
        let t = Instant::now();
        assert!(!w.came_back(&set(&[0, 1, 2]), 0, t), "the first look decides nothing");
        assert!(!w.came_back(&set(&[0, 1]), 0, t + Duration::from_secs(1)), "node 2 away");
        let back = t + Duration::from_secs(2);
        assert!(w.came_back(&set(&[0, 1, 2]), 0, back), "node 2 back: at once");
        assert!(!w.came_back(&set(&[0, 1, 2]), 0, back + Duration::from_secs(1)));
        assert!(w.came_back(&set(&[0, 1, 2]), 0, back + Duration::from_secs(2)));
        assert!(w.came_back(&set(&[0, 1, 2]), 0, back + Duration::from_secs(6)));
        assert!(!w.came_back(&set(&[0, 1, 2]), 0, back + Duration::from_secs(9)), "done");
        // This node's own return (its imcd restarted) is not a reason: its
        // copy is the one that may lack what was written.
        let mut w = Watch::default();
        assert!(!w.came_back(&set(&[1, 2]), 0, t));
        assert!(!w.came_back(&set(&[0, 1, 2]), 0, t + Duration::from_secs(1)));
    }

    #[test]
    fn a_host_missing_past_the_grace_fails_and_a_short_flap_does_not() {
        let mut w = Watch::default();
        let t0 = Instant::now();
        let s = |secs: f64| t0 + Duration::from_secs_f64(secs);
        // Hosts 1..=3 are nodes 0..=2; this daemon is host 1.
        let hosts = set(&[1, 2, 3]);
        assert_eq!(w.failed(&hosts, &set(&[0, 1, 2]), 1, s(0.0)), Vec::<u32>::new());
        // Node 1 flaps for 2 s, node 2 goes for good.
        assert_eq!(w.failed(&hosts, &set(&[0]), 1, s(1.0)), Vec::<u32>::new());
        assert_eq!(w.failed(&hosts, &set(&[0, 1]), 1, s(3.0)), Vec::<u32>::new());
        assert_eq!(w.failed(&hosts, &set(&[0]), 1, s(4.5)), Vec::<u32>::new(), "node 1 away again: counted afresh");
        assert_eq!(w.failed(&hosts, &set(&[0, 1]), 1, s(5.0)), vec![3], "node 2 away for 4 s");
        assert_eq!(w.failed(&set(&[1, 2]), &set(&[0, 1]), 1, s(6.0)), Vec::<u32>::new(), "repaired once");
        // Our own node not listed (our link is down): nothing is decided,
        // and what was counted starts afresh.
        assert_eq!(w.failed(&hosts, &set(&[]), 1, s(7.0)), Vec::<u32>::new());
        assert_eq!(w.failed(&hosts, &set(&[]), 1, s(20.0)), Vec::<u32>::new());
        assert_eq!(w.failed(&hosts, &set(&[0]), 1, s(21.0)), Vec::<u32>::new());
        assert_eq!(w.failed(&hosts, &set(&[0]), 1, s(25.0)), vec![2, 3]);
    }
}
