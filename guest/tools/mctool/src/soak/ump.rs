//! The `ump` thread: node 2k pings node 2k+1 with numbered messages of
//! varied length, contents checked on both sides; after an error or a
//! timeout the pinger opens a new channel.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;

use super::Shared;

/// This workload's figures in the status file.
#[derive(Debug, Default, Clone, Serialize)]
pub(super) struct Ump {
    role: String,
    pings: u64,
    echoed: u64,
    bytes: u64,
    corrupt: u64,
    interrupted_announced: u64,
    interrupted_unannounced: u64,
    reopens: u64,
}

/// UMP handles: the echo side listens on `ECHO + pair`; the pinger opens
/// from a new handle each time.
const ECHO: u64 = 0x50AC_E000_0000;
const PING: u64 = 0x50AC_F000_0000;

/// Message lengths the pinger cycles through.
const LENGTHS: [usize; 6] = [16, 100, 1000, 4096, 9000, 20000];

/// Header of a ping: sequence number and length; the rest is
/// `testkit::message(seq, len - 16)`.
pub(super) fn ping_message(seq: u64, len: usize) -> Vec<u8> {
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&seq.to_le_bytes());
    m.extend_from_slice(&(len as u64).to_le_bytes());
    m.extend_from_slice(&testkit::message(seq, len.saturating_sub(16)));
    m
}

/// Whether `m` is a well-formed ping.
pub(super) fn ping_ok(m: &[u8]) -> bool {
    if m.len() < 16 {
        return false;
    }
    let seq = u64::from_le_bytes(m[..8].try_into().expect("8 bytes"));
    let len = u64::from_le_bytes(m[8..16].try_into().expect("8 bytes")) as usize;
    len == m.len() && m[16..] == testkit::message(seq, len - 16)[..]
}

pub(super) fn ump_worker(sh: &Shared, tick: impl Fn()) -> Result<()> {
    let pair = sh.node / 2;
    let echo_node = pair * 2 + 1;
    if echo_node >= sh.nodes {
        sh.with(|s| s.ump.role = "none".into());
        return Ok(());
    }
    let pinger = sh.node % 2 == 0;
    let peer = if pinger { echo_node } else { pair * 2 };
    let mut st = Ump { role: if pinger { "ping" } else { "echo" }.into(), ..Ump::default() };
    let mut attempt = 0u64;
    let mut seq = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    while !sh.stopping() {
        sh.doing("waiting for the link".into());
        if !sh.wait_link() {
            break;
        }
        sh.doing("ump exit and init".into());
        let _ = ump::exit();
        if let Err(e) = ump::init(ump::Config::from_env()?) {
            sh.error(format!("ump: init: {e}"));
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        let errs = || sh.cluster_errors.load(Ordering::Acquire);
        let mark = (sh.own(), sh.absent(peer), errs());
        // The peer's own errors reach us through the clusterwide count (the
        // echo side closes its channel when its error count moves).
        let announced = |m: (u64, u64, u64)| sh.own() != m.0 || sh.absent(peer) != m.1 || errs() != m.2 || !sh.up(peer);
        if pinger {
            attempt += 1;
            let me = PING + ((pair as u64) << 24) + (u64::from(sh.inc) << 12) + (attempt & 0xFFF);
            sh.doing(format!("opening {me:#x} to {:#x}", ECHO + pair as u64));
            let id = match ump::open(me, ECHO + pair as u64, ump::Want::Mc) {
                Ok(id) => id,
                Err(e) => {
                    sh.error(format!("ump: open: {e}"));
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
            };
            st.reopens += 1;
            sh.doing(format!("waiting for node {peer} to open channel {me:#x}"));
            let t0 = Instant::now();
            let mut open = false;
            while !open && t0.elapsed() < Duration::from_secs(20) && !sh.stopping() {
                open = matches!(ump::wait(Some(id), Some(Duration::from_millis(200))), Ok(Some(ump::Event::Open(_))));
            }
            if !open {
                continue;
            }
            while !sh.stopping() {
                seq += 1;
                let msg = ping_message(seq, LENGTHS[(seq % LENGTHS.len() as u64) as usize]);
                let m0 = (sh.own(), sh.absent(peer), errs());
                sh.doing(format!("ping {seq} of {} bytes", msg.len()));
                let r = ump::write_timeout(id, &msg, Duration::from_secs(10))
                    .and_then(|_| ump::read_timeout(id, &mut buf, Duration::from_secs(10)));
                match r {
                    Ok(n) if buf[..n] == msg[..] => {
                        st.pings += 1;
                        st.bytes += 2 * n as u64;
                        tick();
                    }
                    Ok(n) => {
                        st.corrupt += 1;
                        sh.error(format!("ump: ping {seq}: {n} bytes came back different from the {} sent", msg.len()));
                        break;
                    }
                    Err(e) => {
                        let state = ump::chan(id).map(|c| c.state()).unwrap_or_default();
                        // The echo side stops a moment before we do.
                        let t = Instant::now();
                        while !sh.stopping() && t.elapsed() < Duration::from_secs(3) {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        if sh.stopping() {
                            break;
                        }
                        if announced(m0) || announced(mark) {
                            st.interrupted_announced += 1;
                        } else {
                            st.interrupted_unannounced += 1;
                            sh.error(format!("ump: ping {seq}: {e}, and no outage was announced ({state})"));
                        }
                        break;
                    }
                }
                sh.with(|s| s.ump = st.clone());
                std::thread::sleep(Duration::from_millis(20));
            }
        } else {
            sh.doing("listening".into());
            if let Err(e) = ump::listen(ECHO + pair as u64, ump::Want::Mc) {
                sh.error(format!("ump: listen: {e}"));
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
            st.reopens += 1;
            sh.doing("listening, no channel yet".into());
            let mut cur: Option<i32> = None;
            let mut last = Instant::now();
            tick();
            while !sh.stopping() {
                if sh.own() != mark.0 || last.elapsed() > Duration::from_secs(30) {
                    // Our link went down (the inbox may be gone) or nobody
                    // pinged for long: listen afresh.
                    break;
                }
                match ump::wait(None, Some(Duration::from_millis(200))) {
                    Ok(Some(ump::Event::Open(id))) => {
                        sh.doing(format!("echoing on channel {id}"));
                        if let Some(old) = cur.replace(id) {
                            let _ = ump::close(old);
                        }
                        last = Instant::now();
                    }
                    Ok(Some(ump::Event::Message(id))) if Some(id) == cur => {
                        let r = ump::read_timeout(id, &mut buf, Duration::from_secs(10));
                        match r {
                            Ok(n) if ping_ok(&buf[..n]) => {
                                if ump::write_timeout(id, &buf[..n], Duration::from_secs(10)).is_ok() {
                                    st.echoed += 1;
                                    st.bytes += 2 * n as u64;
                                    last = Instant::now();
                                    tick();
                                }
                            }
                            Ok(n) => {
                                st.corrupt += 1;
                                sh.error(format!("ump: echo: a {n}-byte message is not a well-formed ping"));
                                let _ = ump::close(id);
                                cur = None;
                            }
                            Err(_) => {
                                let _ = ump::close(id);
                                cur = None;
                            }
                        }
                    }
                    Ok(Some(ump::Event::Message(id) | ump::Event::Closed(id))) => {
                        let _ = ump::close(id);
                        if Some(id) == cur {
                            cur = None;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        sh.error(format!("ump: wait: {e}"));
                        break;
                    }
                }
                sh.with(|s| s.ump = st.clone());
            }
        }
        sh.with(|s| s.ump = st.clone());
    }
    let _ = ump::exit();
    sh.with(|s| s.ump = st.clone());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pings_are_checked() {
        let m = ping_message(5, 1000);
        assert!(ping_ok(&m));
        let mut bad = m.clone();
        bad[500] ^= 1;
        assert!(!ping_ok(&bad));
        assert!(!ping_ok(&m[..999]));
        assert!(ping_ok(&ping_message(1, 16)));
        assert!(!ping_ok(&[0u8; 8]));
    }
}
