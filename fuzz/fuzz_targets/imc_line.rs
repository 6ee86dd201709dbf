//! Fuzz target: imcd's request decoder (`imc_proto::decode_request`) and the
//! clients' reply decoder (`imc_proto::decode_reply`). What decodes must
//! encode (`encode_line`) to a line that decodes to the same value.
#![no_main]

use imc_proto::{decode_reply, decode_request, encode_line};
use libfuzzer_sys::fuzz_target;

fuzz_target!(init: fuzz::write_seeds(fuzz::imc_line()), |data: &[u8]| {
    if let Ok(req) = decode_request(data) {
        let line = encode_line(&req);
        assert_eq!(line.last(), Some(&b'\n'));
        let again = decode_request(&line[..line.len() - 1]).expect("an encoded request decodes");
        assert_eq!(again, req);
    }
    if let Ok(rep) = decode_reply(data) {
        let line = encode_line(&rep);
        assert_eq!(line.last(), Some(&b'\n'));
        let again = decode_reply(&line[..line.len() - 1]).expect("an encoded reply decodes");
        assert_eq!(again, rep);
    }
});
