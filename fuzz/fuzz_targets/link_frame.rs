//! Fuzz target: the link decoder (`link::Header::parse`, `link::Msg::parse`,
//! `link::read_frame`).
//!
//! The input is read twice: as a raw byte stream of frames, as a hub or an
//! adapter reads its socket; and as byte 0 = kind, the rest = a payload
//! sealed with a correct header and CRC, so the payload checks behind the
//! CRC are reached too. Whatever decodes must encode back to a frame that
//! decodes to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use link::{read_frame, seal, Header, Kind, Msg, HEADER_LEN};

fn round_trips(m: &Msg<'_>) {
    let f = m.encode();
    let h = Header::parse(f[..HEADER_LEN].try_into().unwrap()).expect("an encoded header decodes");
    assert_eq!(h.len, f.len() - HEADER_LEN);
    assert_eq!(&Msg::parse(&h, &f[HEADER_LEN..]).expect("an encoded frame decodes"), m);
}

fuzz_target!(init: fuzz::write_seeds(fuzz::link_frame()), |data: &[u8]| {
    let mut r = data;
    let mut buf = Vec::new();
    while let Ok(h) = read_frame(&mut r, &mut buf) {
        assert_eq!(buf.len(), h.len);
        if let Ok(m) = Msg::parse(&h, &buf) {
            round_trips(&m);
        }
    }
    if let Some((&k, payload)) = data.split_first() {
        let Ok(kind) = Kind::try_from(k % 8) else { return };
        let mut f = vec![0u8; HEADER_LEN];
        f.extend_from_slice(payload);
        seal(&mut f, kind);
        if let Ok(h) = Header::parse(f[..HEADER_LEN].try_into().unwrap()) {
            assert_eq!(h.kind, kind);
            if let Ok(m) = Msg::parse(&h, &f[HEADER_LEN..]) {
                round_trips(&m);
            }
        }
    }
});
