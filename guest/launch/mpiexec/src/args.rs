//! `mpiexec`'s command line, in the single-dash style of MPICH's Hydra.
//! Pure parsing; no I/O.

use std::time::Duration;

use thiserror::Error;

use crate::proto::MAX_RANKS;

/// The usage text (`-h`).
pub const USAGE: &str = "\
usage: mpiexec [options] PROG [ARGS...]   (also installed as mpirun)
  -n N, -np N          ranks to start (default 1)
  -hosts H1,H2,...     hosts: node numbers, nodeN names, names from imcd's
                       host table, or localhost (default: this guest)
  -ppn K               K ranks per host, block-wise, round robin over the list
                       (default: ranks spread evenly, in blocks)
  -genv NAME VALUE     set NAME=VALUE for every rank (repeatable)
  -env NAME VALUE      the same (no MPMD sections here)
  -genvnone, -envnone  do not pass mpiexec's own environment on
  -wdir DIR            the ranks' working folder (default: this one, or /
                       on a guest that does not have it)
  -l, -prepend-rank    start each output line with [RANK]
  -timeout SECS        end the job after SECS seconds (also $MPIEXEC_TIMEOUT)
  -end-on-stdin-eof    end the job when standard input reaches its end
                       (mc-cluster mpirun uses it)
  -h, -help, --help    this text
  -V, -version, --version  mpiexec's name and version
Examples:
  mpiexec -n 4 -hosts node0,node1,node2,node3 /share/prog
  mpiexec -n 8 -ppn 2 -hosts node0,node1 -genv MPIEXEC_TRACE 1 /share/prog arg
Exit: 0 when every rank exits 0; else the first failing rank's code (128 +
signal when killed); 255 when mpiexec itself fails; 124 after -timeout.";

/// A command line that cannot be used.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ArgsError {
    /// An option without its value.
    #[error("{0} needs {1}")]
    Missing(String, &'static str),
    /// A value that is not what the option takes.
    #[error("{opt} {value}: {why}")]
    Bad {
        /// The option.
        opt: String,
        /// Its value.
        value: String,
        /// What is wrong.
        why: &'static str,
    },
    /// An option we do not know.
    #[error("unknown option {0} (mpiexec -h lists them)")]
    Unknown(String),
    /// No program.
    #[error("no program given (mpiexec -n N PROG [ARGS...])")]
    NoProgram,
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// Ranks.
    pub n: u32,
    /// Host list as given (None: this guest).
    pub hosts: Option<String>,
    /// Ranks per host.
    pub ppn: Option<u32>,
    /// Variables to set, in order.
    pub env: Vec<(String, String)>,
    /// Pass mpiexec's own environment on.
    pub env_all: bool,
    /// Working folder given with -wdir.
    pub wdir: Option<String>,
    /// Prefix output lines with the rank.
    pub prepend_rank: bool,
    /// Job time limit.
    pub timeout: Option<Duration>,
    /// End the job at the end of standard input.
    pub end_on_stdin_eof: bool,
    /// Program and its arguments.
    pub argv: Vec<String>,
    /// -h was given.
    pub help: bool,
    /// -V was given.
    pub version: bool,
}

fn number(opt: &str, v: &str) -> Result<u32, ArgsError> {
    v.parse::<u32>().map_err(|_| ArgsError::Bad { opt: opt.into(), value: v.into(), why: "not a number" })
}

fn env_name(opt: &str, name: &str) -> Result<(), ArgsError> {
    if name.is_empty() || name.contains('=') || name.contains('\0') {
        return Err(ArgsError::Bad { opt: opt.into(), value: name.into(), why: "not a variable name" });
    }
    Ok(())
}

/// Parses the arguments after the program name; `timeout_var` is
/// `$MPIEXEC_TIMEOUT`.
pub fn parse(args: &[String], timeout_var: Option<&str>) -> Result<Args, ArgsError> {
    let mut a = Args {
        n: 1,
        hosts: None,
        ppn: None,
        env: Vec::new(),
        env_all: true,
        wdir: None,
        prepend_rank: false,
        timeout: None,
        end_on_stdin_eof: false,
        argv: Vec::new(),
        help: false,
        version: false,
    };
    let mut timeout = timeout_var.map(|v| ("MPIEXEC_TIMEOUT".to_string(), v.to_string()));
    let mut it = args.iter();
    while let Some(opt) = it.next() {
        let mut value = |what: &'static str| it.next().cloned().ok_or_else(|| ArgsError::Missing(opt.clone(), what));
        match opt.as_str() {
            "-n" | "-np" => {
                let v = value("a number of ranks")?;
                a.n = number(opt, &v)?;
                if a.n == 0 || a.n > MAX_RANKS {
                    return Err(ArgsError::Bad { opt: opt.clone(), value: v, why: "must be 1 to 65536" });
                }
            }
            "-hosts" | "-host" => {
                let v = value("a host list")?;
                a.hosts = Some(v);
            }
            "-ppn" => {
                let v = value("a number of ranks per host")?;
                let k = number(opt, &v)?;
                if k == 0 {
                    return Err(ArgsError::Bad { opt: opt.clone(), value: v, why: "must be at least 1" });
                }
                a.ppn = Some(k);
            }
            "-genv" | "-env" => {
                let name = value("NAME VALUE")?;
                let v = value("NAME VALUE")?;
                env_name(opt, &name)?;
                if v.contains('\0') {
                    return Err(ArgsError::Bad { opt: opt.clone(), value: v, why: "holds a NUL byte" });
                }
                a.env.push((name, v));
            }
            "-genvnone" | "-envnone" => a.env_all = false,
            "-genvall" | "-envall" => a.env_all = true,
            "-wdir" | "-dir" => a.wdir = Some(value("a folder")?),
            "-l" | "-prepend-rank" => a.prepend_rank = true,
            "-timeout" => timeout = Some((opt.clone(), value("a number of seconds")?)),
            "-end-on-stdin-eof" => a.end_on_stdin_eof = true,
            "-h" | "-help" | "--help" => {
                a.help = true;
                return Ok(a);
            }
            "-V" | "-version" | "--version" => {
                a.version = true;
                return Ok(a);
            }
            "--" => {
                a.argv = it.cloned().collect();
                break;
            }
            s if s.starts_with('-') && s.len() > 1 => return Err(ArgsError::Unknown(s.to_string())),
            _ => {
                a.argv = std::iter::once(opt.clone()).chain(it.cloned()).collect();
                break;
            }
        }
    }
    if let Some((opt, v)) = timeout {
        let s = number(&opt, &v)?;
        if s > 0 {
            a.timeout = Some(Duration::from_secs(u64::from(s)));
        }
    }
    if a.argv.is_empty() {
        return Err(ArgsError::NoProgram);
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Args, ArgsError> {
        parse(&s.split_whitespace().map(String::from).collect::<Vec<_>>(), None)
    }

    #[test]
    fn options_and_program() {
        let a = p("-n 4 -hosts node0,node1 -ppn 2 -genv A 1 -env B x -wdir /tmp -l ./prog -n 3 arg").unwrap();
        assert_eq!(a.n, 4);
        assert_eq!(a.hosts.as_deref(), Some("node0,node1"));
        assert_eq!(a.ppn, Some(2));
        assert_eq!(a.env, [("A".to_string(), "1".to_string()), ("B".to_string(), "x".to_string())]);
        assert_eq!(a.wdir.as_deref(), Some("/tmp"));
        assert!(a.prepend_rank && a.env_all);
        assert_eq!(a.argv, ["./prog", "-n", "3", "arg"]);
        assert_eq!(p("-- -weird").unwrap().argv, ["-weird"]);
        assert_eq!(p("prog").unwrap().n, 1);
        assert_eq!(p("-timeout 5 prog").unwrap().timeout, Some(Duration::from_secs(5)));
        let env_timeout = parse(&["prog".to_string()], Some("7")).unwrap();
        assert_eq!(env_timeout.timeout, Some(Duration::from_secs(7)));
        assert!(p("-h").unwrap().help);
        assert!(p("-V").unwrap().version && p("--version").unwrap().version);
    }

    #[test]
    fn bad_command_lines() {
        for (line, says) in [
            ("-n 0 prog", "-n 0: must be 1 to 65536"),
            ("-n x prog", "-n x: not a number"),
            ("-n", "-n needs a number of ranks"),
            ("-n 2", "no program given"),
            ("-ppn 0 prog", "-ppn 0: must be at least 1"),
            ("-genv A", "-genv needs NAME VALUE"),
            ("-genv A=B 1 prog", "not a variable name"),
            ("-frob prog", "unknown option -frob"),
            ("-timeout soon prog", "not a number"),
        ] {
            let e = p(line).unwrap_err().to_string();
            assert!(e.contains(says), "{line}: {e}");
        }
    }
}
