//! Message handlers (`pvm_addmhf`, `pvm_delmhf`): functions a task
//! registers for messages of a source, tag and context (-1: any), which
//! get those messages instead of the receive queue, as in PVM 3.4.
//!
//! This module owns the list and the matching: no two handlers may both
//! match a message (`pvm_addmhf` of an overlapping one is `PvmExists`,
//! wildcards counted both ways), ids are the smallest free slot
//! numbers, the most recently freed first, as PVM hands them out. The C
//! layer (`ffi`) looks at each message once, as it arrives in a PVM call
//! that drains the channels (`Engine::claim_fresh`): one a handler
//! matches goes to it instead of the queue; one that came before the
//! handler was added stays queued, as in PVM. The handlers run with the
//! task's lock released (a handler calls PVM itself): each gets a
//! receive buffer holding its message, with the send buffer set aside,
//! the receive buffer and context of the message, all put back after.
//! Messages of the library's own context are never handed to a handler.
//!
//! Pure data: owned by the task's PVM state (under the C layer's lock).

use std::ffi::c_int;

use crate::consts::err;
use crate::engine::Msg;

/// A handler as `pvm3.h` declares it: `int (*)(int)`, called with the
/// buffer id of the message.
pub type HandlerFn = unsafe extern "C" fn(c_int) -> c_int;

/// Handlers one task may have at once.
pub const MAX_HANDLERS: usize = 1024;

/// One handler: what it matches and the function.
#[derive(Clone, Copy)]
pub struct Handler {
    pub src: i32,
    pub tag: i32,
    pub ctx: i32,
    pub f: HandlerFn,
}

impl Handler {
    fn matches(&self, m: &Msg) -> bool {
        (self.src == -1 || self.src == m.src)
            && (self.tag == -1 || self.tag == m.tag)
            && (self.ctx == -1 || self.ctx == m.ctx)
    }

    /// Whether a message could match both this handler and one for
    /// (`src`, `tag`, `ctx`).
    fn overlaps(&self, src: i32, tag: i32, ctx: i32) -> bool {
        let both = |a: i32, b: i32| a == -1 || b == -1 || a == b;
        both(self.src, src) && both(self.tag, tag) && both(self.ctx, ctx)
    }
}

/// A task's handlers, by id.
#[derive(Default)]
pub struct Handlers {
    slots: Vec<Option<Handler>>,
    /// Freed ids, the most recently freed last.
    free: Vec<usize>,
}

impl Handlers {
    /// `pvm_addmhf`: the new handler's id, or `PvmExists` when one that
    /// overlaps is there.
    pub fn add(&mut self, h: Handler) -> Result<i32, i32> {
        if self.slots.iter().flatten().any(|o| o.overlaps(h.src, h.tag, h.ctx)) {
            return Err(err::EXISTS);
        }
        if let Some(id) = self.free.pop() {
            self.slots[id] = Some(h);
            return Ok(id as i32);
        }
        if self.slots.len() >= MAX_HANDLERS {
            return Err(err::OUT_OF_RES);
        }
        self.slots.push(Some(h));
        Ok(self.slots.len() as i32 - 1)
    }

    /// `pvm_delmhf`.
    pub fn delete(&mut self, id: i32) -> Result<(), i32> {
        if id < 0 {
            return Err(err::BAD_PARAM);
        }
        match self.slots.get_mut(id as usize) {
            Some(s @ Some(_)) => {
                *s = None;
                self.free.push(id as usize);
                Ok(())
            }
            _ => Err(err::NOT_FOUND),
        }
    }

    /// The handler for message `m`, if one matches.
    pub fn find(&self, m: &Msg) -> Option<HandlerFn> {
        self.slots.iter().flatten().find(|h| h.matches(m)).map(|h| h.f)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.slots.iter().all(Option::is_none)
    }

    /// The handlers there are: (id, source, tag, context).
    pub fn list(&self) -> Vec<(i32, i32, i32, i32)> {
        self.slots.iter().enumerate().filter_map(|(i, h)| h.map(|h| (i as i32, h.src, h.tag, h.ctx))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" fn nop(_: c_int) -> c_int {
        0
    }

    fn h(src: i32, tag: i32, ctx: i32) -> Handler {
        Handler { src, tag, ctx, f: nop }
    }

    fn msg(src: i32, tag: i32, ctx: i32) -> Msg {
        Msg { src, tag, ctx, enc: 0, data: Vec::new() }
    }

    #[test]
    fn handlers_match_with_wildcards_and_never_overlap() {
        let mut hs = Handlers::default();
        assert_eq!(hs.add(h(5, 1, 0)), Ok(0));
        assert_eq!(hs.add(h(5, 2, 0)), Ok(1));
        assert_eq!(hs.add(h(-1, 1, 0)), Err(err::EXISTS), "would match (5, 1, 0) too");
        assert_eq!(hs.add(h(6, -1, 7)), Ok(2));
        assert!(hs.find(&msg(5, 1, 0)).is_some());
        assert!(hs.find(&msg(6, 99, 7)).is_some());
        assert!(hs.find(&msg(6, 99, 8)).is_none());
        assert!(hs.find(&msg(4, 1, 0)).is_none());
        assert_eq!(hs.delete(1), Ok(()));
        assert_eq!(hs.delete(1), Err(err::NOT_FOUND));
        assert_eq!(hs.delete(-1), Err(err::BAD_PARAM));
        assert_eq!(hs.delete(9), Err(err::NOT_FOUND));
        assert!(hs.find(&msg(5, 2, 0)).is_none());
        // A freed id is handed out again first.
        assert_eq!(hs.add(h(9, 9, 9)), Ok(1));
        assert_eq!(hs.list(), vec![(0, 5, 1, 0), (1, 9, 9, 9), (2, 6, -1, 7)]);
        for id in 0..3 {
            hs.delete(id).unwrap();
        }
        assert!(hs.is_empty());
    }
}
