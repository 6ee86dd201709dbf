//! `imcd`: the guest daemon that plays the Tru64 kernel subsystem of
//! TruCluster MEMORY CHANNEL Software (seed 000). One per guest, started by
//! the guest's init; it owns the adapter and answers `libimc`
//! (`imc_client`, and the C library) over `/run/imcd.sock`.
//!
//! This binary is the command line and the client socket (a poll loop on
//! the main thread); the node logic is the `imcd` library (`src/lib.rs`),
//! imcd's page layout is `imc_proto::layout`.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use imc_client::send_with_fd;
use imc_proto::{decode_request, encode_line, Reply, Status, IMCD_SOCKET, MAX_LINE};
use imcd::adapter::AdapterHw;
use imcd::daemon::{Daemon, Settings, FLAP_GRACE, REPAIR_MARGIN};
use imcd::hw::Hw;
use imcd::mapper::Mapper;
use imcd::node::{now_ns, Node};
use imcd::regions::Cred;

fn peer_cred(s: &UnixStream) -> Cred {
    let mut c = libc::ucred { pid: 0, uid: u32::MAX, gid: u32::MAX };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills one ucred.
    unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    Cred { uid: c.uid, gid: c.gid }
}

/// Reads one request line (None: the client left).
fn read_line(s: &mut UnixStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    loop {
        match s.read(&mut b)? {
            0 if line.is_empty() => return Ok(None),
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            _ if b[0] == b'\n' => return Ok(Some(line)),
            _ if line.len() >= MAX_LINE => {
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "request too long"))
            }
            _ => line.push(b[0]),
        }
    }
}

fn run(settings: Settings) -> Result<()> {
    // Listen first: clients that come early wait in the backlog.
    let _ = std::fs::remove_file(IMCD_SOCKET);
    let listener = UnixListener::bind(IMCD_SOCKET).with_context(|| format!("cannot listen on {IMCD_SOCKET}"))?;
    std::fs::set_permissions(IMCD_SOCKET, std::fs::Permissions::from_mode(0o666))?;

    let node = Node::new(AdapterHw::open()?);
    node.publish_errcount(&mut None);
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    // Announce ourselves; a node already serving sends us the directory.
    let joined = node.join(now_ns(), name.trim(), settings.join_wait);
    let stop = AtomicBool::new(false);
    // The mapper wakes the main thread after every interrupt: a link
    // change, a join request or an outage to settle is the main thread's
    // work too.
    let (wake_rx, wake_tx) = UnixStream::pair()?;
    wake_tx.set_nonblocking(true)?;
    wake_rx.set_nonblocking(true)?;
    let woken = || {
        // Full means a wake-up is already pending.
        let _ = (&wake_tx).write(&[1]);
    };
    std::thread::scope(|s| -> Result<()> {
        let mapper = Mapper::new(&node, settings.flap_grace)?;
        let mapper_thread = s.spawn(|| mapper.run(&stop, &woken));
        // Without it every receive buffer is mapped when asked for.
        if let Err(e) = std::thread::Builder::new().name("spares".into()).spawn_scoped(s, || node.hw.keep_spares(&stop))
        {
            eprintln!("imcd: no spare receive buffers (cannot start their thread: {e})");
        }
        // On an error here the mapper must be stopped too, or the scope
        // would wait for it for ever and the error never be seen.
        let mut d = match Daemon::new(&node, settings) {
            Ok(d) => d,
            Err(e) => {
                stop.store(true, Ordering::Relaxed);
                let _ = mapper_thread.join();
                return Err(e.into());
            }
        };
        eprintln!("imcd: node {}, {} pages, {joined}; listening on {IMCD_SOCKET}", node.me, node.hw.pages());
        let r = serve(&mut d, &listener, &wake_rx);
        stop.store(true, Ordering::Relaxed);
        let _ = mapper_thread.join();
        r
    })
}

/// Serves clients; ticks ([`Daemon::tick`]) when the mapper wakes it
/// (`wake`) and when [`Daemon::next_tick`] says.
fn serve<H: Hw>(d: &mut Daemon<H>, listener: &UnixListener, mut wake: &UnixStream) -> Result<()> {
    let mut clients: Vec<(UnixStream, u64)> = Vec::new();
    let mut next_client = 0u64;
    // Clients come first in the poll set, after the listener and `wake`.
    const FIRST_CLIENT: usize = 2;
    loop {
        let mut fds: Vec<libc::pollfd> = [listener.as_raw_fd(), wake.as_raw_fd()]
            .into_iter()
            .chain(clients.iter().map(|c| c.0.as_raw_fd()))
            .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
            .collect();
        let ms = d.next_tick().as_millis().clamp(1, 60_000) as libc::c_int;
        // SAFETY: a valid array of pollfds.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if fds[1].revents != 0 {
            while matches!(wake.read(&mut [0u8; 64]), Ok(n) if n > 0) {}
        }
        d.tick();
        if ready <= 0 {
            continue;
        }
        if fds[0].revents & libc::POLLIN != 0 {
            if let Ok((s, _)) = listener.accept() {
                next_client += 1;
                clients.push((s, next_client));
            }
        }
        let mut gone = Vec::new();
        for (i, pfd) in fds.iter().enumerate().skip(FIRST_CLIENT) {
            if pfd.revents == 0 {
                continue;
            }
            let (c, id) = &mut clients[i - FIRST_CLIENT];
            let reply = match read_line(c) {
                Ok(None) | Err(_) => {
                    gone.push(i - FIRST_CLIENT);
                    continue;
                }
                Ok(Some(line)) => match decode_request(&line) {
                    Ok(req) => d.handle(req, peer_cred(c), *id),
                    Err(e) => (Reply::error(Status::Invalid, format!("bad request: {e}")), None),
                },
            };
            let out = encode_line(&reply.0);
            if send_with_fd(c, &out, reply.1.as_ref().map(|f| f.as_raw_fd())).is_err() {
                gone.push(i - FIRST_CLIENT);
            }
            let _ = c.flush();
        }
        for i in gone.into_iter().rev() {
            let (_, id) = clients.remove(i);
            d.client_left(id);
        }
    }
}

fn main() {
    let mut settings = Settings::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--test-hooks" => settings.test_hooks = true,
            "--flap-grace" => {
                let secs = args.next().and_then(|v| v.parse::<f64>().ok()).filter(|s| s.is_finite() && *s > 0.0);
                let Some(secs) = secs else {
                    eprintln!("imcd: --flap-grace needs a positive number of seconds");
                    std::process::exit(2);
                };
                settings.flap_grace = Duration::from_secs_f64(secs);
                settings.repair_after = settings.flap_grace + REPAIR_MARGIN;
            }
            "-h" | "--help" => {
                println!(
                    "usage: imcd [--test-hooks] [--flap-grace SECONDS]\n  the TruCluster MEMORY CHANNEL daemon; \
                     listens on {IMCD_SOCKET}\n  --flap-grace: link outages up to this long are ridden out \
                     (default {} s); the others repair a node out {} s later",
                    FLAP_GRACE.as_secs_f64(),
                    REPAIR_MARGIN.as_secs_f64()
                );
                return;
            }
            other => {
                eprintln!("imcd: unknown argument {other:?} (try --help)");
                std::process::exit(2);
            }
        }
    }
    if let Err(e) = run(settings) {
        eprintln!("imcd: {e:#}");
        std::process::exit(1);
    }
}
