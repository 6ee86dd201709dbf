//! Starting tasks (`pvm_spawn`): where PVM looks for a program, and the
//! start of each copy with its TID taken first in the task table. The
//! child learns its TID, its siblings and the context it starts in (its
//! parent's, as in PVM) from its environment (`PVM_MC_TID`,
//! `PVM_MC_SIBLINGS`, `PVM_MC_CTX`) and enrolls under that TID.
//!
//! Called on the thread calling PVM (under the C layer's lock).

use std::path::{Path, PathBuf};

use crate::consts::{err, ARCH};

/// Environment variable that hands a spawned task its TID.
pub const ENV_TID: &str = "PVM_MC_TID";
/// Environment variable that lists the TIDs spawned together.
pub const ENV_SIBLINGS: &str = "PVM_MC_SIBLINGS";
/// Environment variable that hands a spawned task its parent's context.
pub const ENV_CTX: &str = "PVM_MC_CTX";

/// The folders PVM looks in for a program given without a '/', in order:
/// `$PVM_EP` (PVM's `ep=` host option, ':'-separated), then
/// `$HOME/pvm3/bin/$PVM_ARCH`, then `$PVM_ROOT/bin/$PVM_ARCH`
/// (`PVM_ROOT` defaults to `/usr/lib/pvm3`, `PVM_ARCH` to `LINUX64`).
pub fn search_path(env: &dyn Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    let arch = env("PVM_ARCH").unwrap_or_else(|| ARCH.into());
    let mut dirs: Vec<PathBuf> = env("PVM_EP")
        .map(|ep| ep.split(':').filter(|d| !d.is_empty()).map(PathBuf::from).collect())
        .unwrap_or_default();
    if let Some(home) = env("HOME") {
        dirs.push(Path::new(&home).join("pvm3/bin").join(&arch));
    }
    let root = env("PVM_ROOT").unwrap_or_else(|| "/usr/lib/pvm3".into());
    dirs.push(Path::new(&root).join("bin").join(&arch));
    dirs
}

/// The program `task` names: itself when it has a '/', else the first
/// executable file of that name in [`search_path`]; `PvmNoFile` if none.
pub fn find(task: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<PathBuf, i32> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &Path| p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if task.is_empty() {
        return Err(err::BAD_PARAM);
    }
    if task.contains('/') {
        let p = PathBuf::from(task);
        return if runnable(&p) { Ok(p) } else { Err(err::NO_FILE) };
    }
    search_path(env).into_iter().map(|d| d.join(task)).find(|p| runnable(p)).ok_or(err::NO_FILE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_where_pvm_looks_in_its_order() {
        let dir = tempfile::tempdir().unwrap();
        let (ep, home, root) = (dir.path().join("ep"), dir.path().join("home"), dir.path().join("root"));
        let homebin = home.join("pvm3/bin/LINUX64");
        let rootbin = root.join("bin/LINUX64");
        for d in [&ep, &homebin, &rootbin] {
            std::fs::create_dir_all(d).unwrap();
        }
        let make = |p: PathBuf| {
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        };
        make(rootbin.join("a"));
        make(homebin.join("a"));
        make(rootbin.join("b"));
        std::fs::write(ep.join("b"), "not executable").unwrap();
        let vars = [
            ("PVM_EP", ep.display().to_string()),
            ("HOME", home.display().to_string()),
            ("PVM_ROOT", root.display().to_string()),
        ];
        let env = |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
        assert_eq!(find("a", &env), Ok(homebin.join("a")));
        assert_eq!(find("b", &env), Ok(rootbin.join("b")));
        assert_eq!(find("c", &env), Err(err::NO_FILE));
        assert_eq!(find("", &env), Err(err::BAD_PARAM));
        assert_eq!(find(&rootbin.join("b").display().to_string(), &env), Ok(rootbin.join("b")));
    }
}
