//! Capture: every ordered frame (deliveries and membership events) to a pcap
//! file, written by its own thread (`pcap`) so file I/O never holds up the
//! order. The ordering step only queues a record ([`Capture::record`]).

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::DataLink;

use crate::port::Frame;

/// Writes every ordered frame to a pcap file (link type USER0) from its own
/// thread, so file I/O never holds up the order.
pub(crate) struct Capture {
    tx: std::sync::mpsc::SyncSender<(SystemTime, Frame)>,
}

/// pcap link type of the frames: LINKTYPE_USER0.
pub const PCAP_DATALINK: DataLink = DataLink::USER0;

impl Capture {
    pub(crate) fn open(path: &Path) -> std::io::Result<Capture> {
        let mut file = Flushable(Arc::new(Mutex::new(std::io::BufWriter::new(std::fs::File::create(path)?))));
        let header = PcapHeader { datalink: PCAP_DATALINK, ..PcapHeader::default() };
        let mut w = PcapWriter::with_header(file.clone(), header).map_err(std::io::Error::other)?;
        file.flush()?;
        let (tx, rx) = std::sync::mpsc::sync_channel::<(SystemTime, Frame)>(65536);
        let mut record = move |t: SystemTime, fr: &[u8]| {
            let ts = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
            w.write_packet(&PcapPacket::new(ts, fr.len() as u32, fr)).is_ok()
        };
        std::thread::Builder::new().name("pcap".into()).spawn(move || {
            while let Ok((t, fr)) = rx.recv() {
                if !record(t, &fr) {
                    return;
                }
                while let Ok((t, fr)) = rx.try_recv() {
                    if !record(t, &fr) {
                        return;
                    }
                }
                if file.flush().is_err() {
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

/// The capture file's buffer, shared by the pcap writer (which owns its
/// writer) and the thread that flushes it after each batch of records.
#[derive(Clone)]
struct Flushable(Arc<Mutex<std::io::BufWriter<std::fs::File>>>);

impl Write for Flushable {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).flush()
    }
}
