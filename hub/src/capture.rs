//! Capture: every ordered frame (deliveries and membership events) to a pcap
//! file, written by its own thread (`pcap`) so file I/O never holds up the
//! order. The ordering step only queues a record ([`Capture::record`]).

use std::io::Write as _;
use std::path::Path;
use std::time::SystemTime;

use crate::order::Frame;

/// Writes every ordered frame to a pcap file (link type USER0) from its own
/// thread, so file I/O never holds up the order.
pub(crate) struct Capture {
    tx: std::sync::mpsc::SyncSender<(SystemTime, Frame)>,
}

/// pcap link type for the frames: LINKTYPE_USER0.
pub const PCAP_LINKTYPE: u32 = 147;

impl Capture {
    pub(crate) fn open(path: &Path) -> std::io::Result<Capture> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
        // pcap global header: magic, v2.4, zone 0, sigfigs 0, snaplen, link type.
        f.write_all(&0xa1b2_c3d4u32.to_le_bytes())?;
        f.write_all(&2u16.to_le_bytes())?;
        f.write_all(&4u16.to_le_bytes())?;
        for v in [0u32, 0, 65535, PCAP_LINKTYPE] {
            f.write_all(&v.to_le_bytes())?;
        }
        f.flush()?;
        let (tx, rx) = std::sync::mpsc::sync_channel::<(SystemTime, Frame)>(65536);
        fn record(f: &mut impl std::io::Write, t: SystemTime, fr: &[u8]) -> std::io::Result<()> {
            let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
            for v in [d.as_secs() as u32, d.subsec_micros(), fr.len() as u32, fr.len() as u32] {
                f.write_all(&v.to_le_bytes())?;
            }
            f.write_all(fr)
        }
        std::thread::Builder::new().name("pcap".into()).spawn(move || {
            while let Ok((t, fr)) = rx.recv() {
                if record(&mut f, t, &fr).is_err() {
                    return;
                }
                while let Ok((t, fr)) = rx.try_recv() {
                    if record(&mut f, t, &fr).is_err() {
                        return;
                    }
                }
                if f.flush().is_err() {
                    return;
                }
            }
        })?;
        Ok(Capture { tx })
    }

    /// Queues one frame for the file. A full queue drops the record rather
    /// than slow the order.
    pub(crate) fn record(&self, frame: &Frame) {
        let _ = self.tx.try_send((SystemTime::now(), frame.clone()));
    }
}
