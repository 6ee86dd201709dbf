//! Which node this is, and which node a host name given to `mpiexec
//! -hosts` means. Reads `$MCMPI_NODE`, imcd (through `imc-client`) and
//! `/run/mc-node`; called on the caller's thread only.
//!
//! A host is named by node number (`1`), by the name guests get
//! (`node1`), by a name in imcd's host table (`mctool imc-hosts`), or as
//! `localhost` / this guest's host name. Without imcd (a machine outside
//! the cluster, tests) this machine is node 0 and numbers are taken as
//! they are.

use thiserror::Error;

/// Environment variable that sets this machine's node (tests).
pub const NODE_VAR: &str = "MCMPI_NODE";

/// A host that cannot be resolved.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum HostError {
    /// Not a node number, `nodeN`, or a known name.
    #[error("unknown host '{name}' ({known})")]
    Unknown {
        /// The name given.
        name: String,
        /// What is known (for the message).
        known: String,
    },
    /// `$MCMPI_NODE` is not a node number.
    #[error("{NODE_VAR}={0:?} is not a node number (0 to 65535)")]
    BadNodeVar(String),
    /// An empty host list or name.
    #[error("empty host name in '{0}'")]
    Empty(String),
}

/// The cluster as far as this machine knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// This machine's node.
    pub me: u32,
    /// (node, name) of every node running imcd; None without imcd.
    pub hosts: Option<Vec<(u32, String)>>,
    /// This machine's host name.
    pub hostname: String,
}

/// This machine's node: `$MCMPI_NODE`, else the adapter's node id as imcd
/// reports it, else `/run/mc-node` (written at boot), else 0.
pub fn local_node() -> Result<u32, HostError> {
    if let Ok(v) = std::env::var(NODE_VAR) {
        return v.trim().parse::<u16>().map(u32::from).map_err(|_| HostError::BadNodeVar(v));
    }
    if let Some(n) = imc_client::Imc::connect().ok().and_then(|i| i.regs().ok()?.node()) {
        return Ok(u32::from(n));
    }
    Ok(std::fs::read_to_string("/run/mc-node").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0))
}

impl Cluster {
    /// Looks the cluster up (imcd's host table when imcd answers).
    pub fn discover() -> Result<Cluster, HostError> {
        let me = local_node()?;
        let hosts = if std::env::var_os(NODE_VAR).is_some() {
            None
        } else {
            imc_client::Imc::connect().ok().and_then(|i| i.gethosts().ok())
        };
        let hostname =
            std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default();
        Ok(Cluster { me, hosts, hostname })
    }

    /// The node a host name means.
    pub fn resolve(&self, name: &str) -> Result<u32, HostError> {
        let n = name.trim();
        if n.is_empty() {
            return Err(HostError::Empty(name.to_string()));
        }
        if n == "localhost" || (!self.hostname.is_empty() && n == self.hostname) {
            return Ok(self.me);
        }
        let number = n.strip_prefix("node").unwrap_or(n);
        if let Ok(node) = number.parse::<u16>() {
            if !number.starts_with('+') {
                let node = u32::from(node);
                return match &self.hosts {
                    Some(h) if node != self.me && !h.iter().any(|(x, _)| *x == node) => {
                        Err(HostError::Unknown { name: n.to_string(), known: self.known() })
                    }
                    _ => Ok(node),
                };
            }
        }
        if let Some(h) = &self.hosts {
            if let Some((node, _)) = h.iter().find(|(_, hn)| hn == n) {
                return Ok(*node);
            }
        }
        Err(HostError::Unknown { name: n.to_string(), known: self.known() })
    }

    /// Resolves a comma-separated host list.
    pub fn resolve_list(&self, list: &str) -> Result<Vec<u32>, HostError> {
        list.split(',').map(|h| self.resolve(h).map_err(|e| with_list(e, list))).collect()
    }

    fn known(&self) -> String {
        match &self.hosts {
            Some(h) => {
                let names: Vec<String> = h.iter().map(|(n, name)| format!("{name}={n}")).collect();
                format!("the cluster's hosts: {}", names.join(", "))
            }
            None => "no imcd here: name hosts by node number, nodeN or localhost".to_string(),
        }
    }
}

fn with_list(e: HostError, list: &str) -> HostError {
    match e {
        HostError::Empty(_) => HostError::Empty(list.to_string()),
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(hosts: Option<Vec<(u32, &str)>>) -> Cluster {
        Cluster {
            me: 0,
            hosts: hosts.map(|h| h.into_iter().map(|(n, s)| (n, s.to_string())).collect()),
            hostname: "node0".into(),
        }
    }

    #[test]
    fn names_numbers_and_unknown_hosts() {
        let c = cluster(Some(vec![(0, "node0"), (1, "node1"), (3, "gamma")]));
        assert_eq!(c.resolve_list("node0,1,gamma,localhost"), Ok(vec![0, 1, 3, 0]));
        assert!(matches!(c.resolve("node2"), Err(HostError::Unknown { .. })));
        let e = c.resolve("beta").unwrap_err().to_string();
        assert!(e.contains("unknown host 'beta'") && e.contains("node1=1"), "{e}");
        assert!(matches!(c.resolve_list("node0,,node1"), Err(HostError::Empty(_))));
        assert!(c.resolve("+1").is_err());
        assert!(c.resolve("node70000").is_err());

        let off = cluster(None);
        assert_eq!(off.resolve_list("0,node5"), Ok(vec![0, 5]));
        let e = off.resolve("frobnicate").unwrap_err().to_string();
        assert!(e.contains("no imcd here"), "{e}");
    }
}
