//! Fuzz target: the hub's control-line parser (`Control::parse_line`) and
//! the reply decoder `mc-hub ctl` uses. A line that decodes must encode
//! back to a line that decodes to the same request; a line that does not
//! must give an error reply, never a panic.
#![no_main]

use hub::hub::{Control, ControlReply};
use libfuzzer_sys::fuzz_target;

fuzz_target!(init: fuzz::write_seeds(fuzz::control_line()), |data: &[u8]| {
    match Control::parse_line(data) {
        Ok(c) => {
            let line = serde_json::to_vec(&c).expect("a request encodes");
            assert_eq!(Control::parse_line(&line), Ok(c));
        }
        Err(ControlReply::Error { message }) => assert!(!message.is_empty()),
        Err(other) => panic!("a refusal that is not an error reply: {other:?}"),
    }
    if let Ok(reply) = serde_json::from_slice::<ControlReply>(data) {
        let line = serde_json::to_vec(&reply).expect("a reply encodes");
        assert_eq!(serde_json::from_slice::<ControlReply>(&line).expect("an encoded reply decodes"), reply);
    }
});
