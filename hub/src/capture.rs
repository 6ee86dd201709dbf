//! Capture: every ordered frame (deliveries and membership events) to a pcap
//! file, written by its own thread (`pcap`) so file I/O never holds up the
//! order. The ordering step only queues a record ([`Capture::record`]).
//!
//! A record's data is the link frame as the hub sends it (header and
//! payload, `protocol/link`). A `Deliver` record is followed by a 2-byte
//! trailer the frame itself does not carry: the write's destination, as
//! in its `Write` (0xFFFF broadcast, else the one node of a point-to-point
//! write). Readers: [`CaptureReader`] (for `mc-hub pcap` and
//! `hub::history`) and the Wireshark dissector (`hub/wireshark/mc.lua`).

use std::fs::File;
use std::io::{BufReader, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::DataLink;
use thiserror::Error;

use crate::port::Frame;

/// Writes every ordered frame to a pcap file (link type USER0) from its own
/// thread, so file I/O never holds up the order.
pub(crate) struct Capture {
    tx: std::sync::mpsc::SyncSender<Record>,
}

/// One queued record: when, the frame, and a delivery's destination.
type Record = (SystemTime, Frame, Option<u16>);

/// Bytes of a `Deliver` record's destination trailer.
pub const DEST_TRAILER: usize = 2;

/// pcap link type of the frames: LINKTYPE_USER0.
pub const PCAP_DATALINK: DataLink = DataLink::USER0;

impl Capture {
    pub(crate) fn open(path: &Path) -> std::io::Result<Capture> {
        let mut file = Flushable(Arc::new(Mutex::new(std::io::BufWriter::new(std::fs::File::create(path)?))));
        let header = PcapHeader { datalink: PCAP_DATALINK, ..PcapHeader::default() };
        let mut w = PcapWriter::with_header(file.clone(), header).map_err(std::io::Error::other)?;
        file.flush()?;
        let (tx, rx) = std::sync::mpsc::sync_channel::<Record>(65536);
        let mut data = Vec::with_capacity(link::HEADER_LEN + link::MAX_PAYLOAD + DEST_TRAILER);
        let mut record = move |(t, fr, dest): Record| {
            let ts = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
            data.clear();
            data.extend_from_slice(&fr);
            if let Some(d) = dest {
                data.extend_from_slice(&d.to_le_bytes());
            }
            w.write_packet(&PcapPacket::new(ts, data.len() as u32, &data)).is_ok()
        };
        std::thread::Builder::new().name("pcap".into()).spawn(move || {
            while let Ok(r) = rx.recv() {
                if !record(r) {
                    return;
                }
                while let Ok(r) = rx.try_recv() {
                    if !record(r) {
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

    /// Queues one frame for the file, with a delivery's destination
    /// (`Some` for a `Deliver`). A full queue drops the record rather than
    /// slow the order.
    pub(crate) fn record(&self, frame: &Frame, dest: Option<u16>) {
        let _ = self.tx.try_send((SystemTime::now(), frame.clone(), dest));
    }
}

/// Why a file cannot be read as a capture.
#[derive(Debug, Error)]
pub enum ReadError {
    /// It cannot be opened.
    #[error("{0}")]
    Open(std::io::Error),
    /// It is not a pcap file.
    #[error("not a pcap file: {0}")]
    NotPcap(String),
    /// It is a pcap file of another link type.
    #[error("link type {0:?}")]
    LinkType(DataLink),
}

/// What [`CaptureReader::next_record`] found.
pub enum Next {
    /// A whole record: when the hub ordered it, and its data.
    Record {
        /// Since the epoch.
        time: Duration,
        /// The frame (and a delivery's destination trailer).
        data: Vec<u8>,
    },
    /// The last record is cut short (a capture still being written).
    Incomplete,
    /// A damaged record.
    Corrupt(String),
    /// No more records.
    End,
}

/// Reads a capture record by record, from the thread that calls it.
pub struct CaptureReader {
    r: PcapReader<BufReader<File>>,
}

impl CaptureReader {
    /// Opens `path` and checks it is a pcap file of the hub's link type.
    pub fn open(path: &Path) -> Result<CaptureReader, ReadError> {
        let f = File::open(path).map_err(ReadError::Open)?;
        let r = PcapReader::new(BufReader::new(f)).map_err(|e| ReadError::NotPcap(e.to_string()))?;
        if r.header().datalink != PCAP_DATALINK {
            return Err(ReadError::LinkType(r.header().datalink));
        }
        Ok(CaptureReader { r })
    }

    /// The next record.
    pub fn next_record(&mut self) -> Next {
        match self.r.next_packet() {
            None => Next::End,
            Some(Ok(p)) => Next::Record { time: p.timestamp, data: p.data.into_owned() },
            Some(Err(pcap_file::PcapError::IoError(e))) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                Next::Incomplete
            }
            Some(Err(e)) => Next::Corrupt(e.to_string()),
        }
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
