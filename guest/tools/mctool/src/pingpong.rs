//! `mctool pingpong`: round trips of 8-byte values between two nodes over
//! MEMORY CHANNEL, TCP or ivshmem, through one [`Wire`] interface.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use guest_driver::guest_mem::{Mapping, ReadWrite};
use guest_driver::Adapter;
use regs::{pct, PAGE_SIZE};

use crate::raw::{disable_rx, load64, setup_rx, tx_page, wait_value};
use clap::ValueEnum;

use crate::{PingRole, Via};

/// One end of a ping-pong: 8-byte values, never 0, sent and awaited.
pub(crate) trait Wire {
    /// Sends `v` to the other end.
    fn send(&mut self, v: u64) -> Result<()>;
    /// Pong: waits for the next value from the other end.
    fn next(&mut self, limit: Duration) -> Result<u64>;
    /// Ping: waits until the other end has sent `v` back.
    fn wait_for(&mut self, v: u64, limit: Duration) -> Result<()>;
    /// Leaves the device as it was found.
    fn finish(&mut self) {}
}

/// MEMORY CHANNEL: stores into our transmit page, polling our receive page.
pub(crate) struct McWire {
    a: Adapter,
    buf: Mapping<ReadWrite>,
    rx_page: u64,
    tx_page: u64,
    last: u64,
}

impl McWire {
    fn open(role: PingRole, rx_page: u64, tx_page_no: u64) -> Result<McWire> {
        let name = if role == PingRole::Ping { "ping" } else { "pong" };
        let buffer = PathBuf::from(format!("/dev/shm/mc-pingpong-{name}"));
        let (a, buf) = setup_rx(&[rx_page], &buffer)?;
        tx_page(&a, tx_page_no)?;
        // setup_rx cleared the buffer: nothing has arrived yet.
        Ok(McWire { a, buf, rx_page, tx_page: tx_page_no, last: 0 })
    }

    fn rx_off(&self) -> usize {
        (self.rx_page * PAGE_SIZE) as usize
    }
}

impl Wire for McWire {
    fn send(&mut self, v: u64) -> Result<()> {
        self.a.store64(self.tx_page * PAGE_SIZE, v);
        Ok(())
    }
    fn next(&mut self, limit: Duration) -> Result<u64> {
        self.last = poll_change(|| load64(&self.buf, self.rx_off()), self.last, limit)?;
        Ok(self.last)
    }
    fn wait_for(&mut self, v: u64, limit: Duration) -> Result<()> {
        wait_value(&self.buf, self.rx_off(), v, limit).map(|_| ())
    }
    fn finish(&mut self) {
        disable_rx(&self.a, self.rx_page);
        let (bits, iova) = self.a.page(self.tx_page);
        self.a.set_page(self.tx_page, bits & !pct::TX, iova);
    }
}

/// ivshmem: ping's word at offset 0, pong's at 64 (another cache line).
pub(crate) struct IvshmemWire {
    mem: guest_driver::ivshmem::Ivshmem,
    rx_off: usize,
    tx_off: usize,
    last: u64,
}

impl IvshmemWire {
    fn open(role: PingRole) -> Result<IvshmemWire> {
        let mem = guest_driver::ivshmem::Ivshmem::open()?;
        let (rx_off, tx_off) = if role == PingRole::Ping { (64, 0) } else { (0, 64) };
        if role == PingRole::Pong {
            // Clear our answer word; whatever ping's word holds (an earlier
            // run's value) is not a ping.
            mem.mem.store::<u64>(tx_off, 0)?;
        }
        let last = mem.mem.load::<u64>(rx_off)?;
        Ok(IvshmemWire { mem, rx_off, tx_off, last })
    }
}

impl Wire for IvshmemWire {
    fn send(&mut self, v: u64) -> Result<()> {
        self.mem.mem.store::<u64>(self.tx_off, v)?;
        Ok(())
    }
    fn next(&mut self, limit: Duration) -> Result<u64> {
        self.last = poll_change(|| load64(&self.mem.mem, self.rx_off), self.last, limit)?;
        Ok(self.last)
    }
    fn wait_for(&mut self, v: u64, limit: Duration) -> Result<()> {
        let t0 = Instant::now();
        while self.mem.mem.load::<u64>(self.rx_off)? != v {
            if t0.elapsed() > limit {
                bail!("no echo of {v:#x} within {limit:?}");
            }
            std::hint::spin_loop();
        }
        Ok(())
    }
}

/// TCP: 8 bytes each way on one connection, Nagle off.
pub(crate) struct TcpWire {
    s: std::net::TcpStream,
}

impl TcpWire {
    /// Pong: listen on `port`, tell the caller we are ready, take one connection.
    fn accept(port: u16, limit: Duration) -> Result<TcpWire> {
        let l =
            std::net::TcpListener::bind(("0.0.0.0", port)).with_context(|| format!("listening on TCP port {port}"))?;
        l.set_nonblocking(true)?;
        println!("pong ready");
        std::io::stdout().flush()?;
        let t0 = Instant::now();
        let s = loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if t0.elapsed() > limit {
                        bail!("no ping connected to TCP port {port} within {limit:?}");
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(e).context("accepting the ping connection"),
            }
        };
        s.set_nonblocking(false)?;
        Self::tune(s, limit)
    }

    /// Ping: connect to pong at `peer:port`.
    fn connect(peer: &str, port: u16, limit: Duration) -> Result<TcpWire> {
        use std::net::ToSocketAddrs;
        let what = || format!("TCP connection to {peer}:{port} (within {limit:?})");
        let to = (peer, port).to_socket_addrs().with_context(what)?.next().with_context(what)?;
        let s = std::net::TcpStream::connect_timeout(&to, limit).with_context(what)?;
        Self::tune(s, limit)
    }

    fn tune(s: std::net::TcpStream, limit: Duration) -> Result<TcpWire> {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(limit))?;
        s.set_write_timeout(Some(limit))?;
        Ok(TcpWire { s })
    }
}

impl Wire for TcpWire {
    fn send(&mut self, v: u64) -> Result<()> {
        self.s.write_all(&v.to_le_bytes()).context("TCP send")
    }
    fn next(&mut self, _limit: Duration) -> Result<u64> {
        use std::io::Read;
        let mut b = [0u8; 8];
        self.s.read_exact(&mut b).context("TCP receive (read timeout is --timeout)")?;
        Ok(u64::from_le_bytes(b))
    }
    fn wait_for(&mut self, v: u64, limit: Duration) -> Result<()> {
        let got = self.next(limit)?;
        if got != v {
            bail!("TCP echo {got:#x} is not the {v:#x} sent");
        }
        Ok(())
    }
}

/// Polls `read` until it returns something other than `last` (and not 0).
pub(crate) fn poll_change(read: impl Fn() -> u64, last: u64, limit: Duration) -> Result<u64> {
    let t0 = Instant::now();
    loop {
        let v = read();
        if v != 0 && v != last {
            return Ok(v);
        }
        if t0.elapsed() > limit {
            bail!("no ping within {limit:?}");
        }
        std::hint::spin_loop();
    }
}

pub(crate) struct PingpongArgs {
    pub(crate) role: PingRole,
    pub(crate) via: Via,
    pub(crate) rounds: u64,
    pub(crate) warmup: u64,
    pub(crate) ping_page: u64,
    pub(crate) pong_page: u64,
    pub(crate) peer: Option<String>,
    pub(crate) port: u16,
    pub(crate) samples: Option<PathBuf>,
    pub(crate) timeout: u64,
}

pub(crate) fn pingpong(p: PingpongArgs) -> Result<()> {
    let ping = p.role == PingRole::Ping;
    if p.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let total = p.rounds.checked_add(p.warmup).filter(|&t| t <= u32::MAX as u64);
    let total = total.context("--rounds plus --warmup must be at most 2^32 - 1")?;
    if p.via != Via::Tcp && p.peer.is_some() {
        bail!("--peer is only for --via tcp");
    }
    let limit = Duration::from_secs(p.timeout);
    let mut wire: Box<dyn Wire> = match p.via {
        Via::Mc => {
            let (rx, tx) = if ping { (p.pong_page, p.ping_page) } else { (p.ping_page, p.pong_page) };
            Box::new(McWire::open(p.role, rx, tx)?)
        }
        Via::Ivshmem => Box::new(IvshmemWire::open(p.role)?),
        Via::Tcp if ping => {
            let peer =
                p.peer.as_deref().context("--via tcp --role ping needs --peer IP (the pong node's LAN address)")?;
            Box::new(TcpWire::connect(peer, p.port, limit)?)
        }
        Via::Tcp => Box::new(TcpWire::accept(p.port, limit)?),
    };
    if !ping {
        if p.via != Via::Tcp {
            println!("pong ready");
            std::io::stdout().flush()?;
        }
        let r = (0..total).try_for_each(|_| {
            let v = wire.next(limit)?;
            wire.send(v)
        });
        wire.finish();
        return r;
    }
    // Values never seen before on this wire: the clock in the high half.
    let nonce = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64) << 32;
    let mut rtts = Vec::with_capacity(p.rounds as usize);
    let r = (1..=total).try_for_each(|i| {
        let v = nonce | i;
        let t0 = Instant::now();
        wire.send(v)?;
        wire.wait_for(v, limit)?;
        if i > p.warmup {
            rtts.push(t0.elapsed());
        }
        Ok::<(), anyhow::Error>(())
    });
    wire.finish();
    r?;
    if let Some(path) = &p.samples {
        let text: String = rtts.iter().map(|d| format!("{}\n", d.as_nanos())).collect();
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    let rtt = testkit::stats::Summary::of(&mut rtts).context("no samples")?;
    println!(
        "via={} rounds={} warmup={} {} {}",
        p.via.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default(),
        p.rounds,
        p.warmup,
        rtt.fields("rtt"),
        rtt.div(2).fields("one_way")
    );
    Ok(())
}
