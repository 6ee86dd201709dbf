//! Where ranks go: rank → host entry, block-wise. Pure; no I/O.
//!
//! - With `-ppn K`: ranks 0..K-1 on the first host, the next K on the
//!   second, and so on, starting again at the first host when the list
//!   runs out (round robin by blocks of K).
//! - Without: spread evenly, in blocks: with N ranks on H hosts, the
//!   first N mod H hosts get ⌈N/H⌉ ranks and the others ⌊N/H⌋ (4 ranks on
//!   2 hosts: 0,1 on the first, 2,3 on the second).

use thiserror::Error;

/// A placement that cannot be made.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PlaceError {
    /// No hosts.
    #[error("no hosts to place ranks on")]
    NoHosts,
    /// `-ppn 0`.
    #[error("-ppn must be at least 1")]
    ZeroPpn,
}

/// For each rank, the index of its host in the host list.
pub fn place(ranks: u32, hosts: usize, ppn: Option<u32>) -> Result<Vec<usize>, PlaceError> {
    if hosts == 0 {
        return Err(PlaceError::NoHosts);
    }
    match ppn {
        Some(0) => Err(PlaceError::ZeroPpn),
        Some(k) => Ok((0..ranks).map(|r| (r / k) as usize % hosts).collect()),
        None => {
            let (base, extra) = (ranks as usize / hosts, ranks as usize % hosts);
            let mut out = Vec::with_capacity(ranks as usize);
            for h in 0..hosts {
                let n = base + usize::from(h < extra);
                out.resize(out.len() + n, h);
            }
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks() {
        assert_eq!(place(4, 2, None).unwrap(), [0, 0, 1, 1]);
        assert_eq!(place(5, 2, None).unwrap(), [0, 0, 0, 1, 1]);
        assert_eq!(place(2, 4, None).unwrap(), [0, 1]);
        assert_eq!(place(4, 1, None).unwrap(), [0, 0, 0, 0]);
        assert_eq!(place(4, 2, Some(1)).unwrap(), [0, 1, 0, 1]);
        assert_eq!(place(6, 2, Some(2)).unwrap(), [0, 0, 1, 1, 0, 0]);
        assert_eq!(place(3, 3, Some(4)).unwrap(), [0, 0, 0]);
        assert_eq!(place(1, 0, None), Err(PlaceError::NoHosts));
        assert_eq!(place(1, 1, Some(0)), Err(PlaceError::ZeroPpn));
    }
}
