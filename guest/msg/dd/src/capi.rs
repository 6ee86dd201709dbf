//! The C face of Direct Deposit (`include/dd.h`). Each call returns 0 (or
//! a count, a ticket) on success and a negative `DD_E*` code on failure;
//! `dd_errmsg()` says what went wrong in words, for the calling thread.
//! Queues and connections are opaque pointers owned by the caller until
//! `dd_queue_close` / `dd_close`.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CString};
use std::time::Duration;

use crate::error::DdError;
use crate::layout::Note;
use crate::mc::{Conn, Queue};

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

fn fail(e: DdError) -> c_int {
    let code = e.code();
    LAST.with(|l| *l.borrow_mut() = CString::new(e.to_string().replace('\0', " ")).unwrap_or_default());
    code
}

fn invalid(what: &str) -> c_int {
    fail(DdError::Invalid(what.into()))
}

fn timeout(ms: c_int) -> Option<Duration> {
    (ms >= 0).then(|| Duration::from_millis(ms as u64))
}

/// `dd_note_t`.
#[repr(C)]
pub struct DdNote {
    /// Connection id.
    pub conn: u32,
    /// Offset in the connection's buffer.
    pub offset: u32,
    /// Bytes.
    pub len: u32,
    /// `DD_NOTE_DMA` when the bytes came by DMA.
    pub flags: u32,
    /// Sequence number on the connection (from 1).
    pub seq: u64,
    /// CRC-32 of the bytes.
    pub crc: u32,
    /// Reserved (0).
    pub reserved: u32,
}

impl DdNote {
    fn from(n: &Note) -> DdNote {
        DdNote { conn: n.conn, offset: n.offset, len: n.len, flags: n.flags, seq: n.seq, crc: n.crc, reserved: 0 }
    }
    fn to(&self) -> Note {
        Note { conn: self.conn, seq: self.seq, offset: self.offset, len: self.len, crc: self.crc, flags: self.flags }
    }
}

/// The message of the calling thread's last failure.
#[no_mangle]
pub extern "C" fn dd_errmsg() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// Opens a notification queue in `*q`.
///
/// # Safety
/// `q` is a valid pointer to a `dd_queue *`.
#[no_mangle]
pub unsafe extern "C" fn dd_queue_open(q: *mut *mut Queue) -> c_int {
    if q.is_null() {
        return invalid("dd_queue_open: q is NULL");
    }
    match Queue::open() {
        Ok(queue) => {
            // SAFETY: the caller passes a valid pointer (checked non-null).
            unsafe { *q = Box::into_raw(Box::new(queue)) };
            0
        }
        Err(e) => fail(e),
    }
}

/// Closes a queue and lets go of its connections.
///
/// # Safety
/// `q` came from `dd_queue_open` and is not used after.
#[no_mangle]
pub unsafe extern "C" fn dd_queue_close(q: *mut Queue) {
    if !q.is_null() {
        // SAFETY: made by Box::into_raw in dd_queue_open, closed once.
        drop(unsafe { Box::from_raw(q) });
    }
}

/// # Safety
/// `q` is NULL or came from `dd_queue_open` and is open.
unsafe fn queue<'a>(q: *mut Queue) -> Result<&'a mut Queue, c_int> {
    // SAFETY: the caller's promise; NULL is refused.
    unsafe { q.as_mut() }.ok_or_else(|| invalid("the queue is NULL"))
}

/// # Safety
/// `c` is NULL or came from `dd_connect` and is open.
unsafe fn conn<'a>(c: *mut Conn) -> Result<&'a mut Conn, c_int> {
    // SAFETY: the caller's promise; NULL is refused.
    unsafe { c.as_mut() }.ok_or_else(|| invalid("the connection is NULL"))
}

/// This node's number, or a negative code.
///
/// # Safety
/// `q` came from `dd_queue_open`.
#[no_mangle]
pub unsafe extern "C" fn dd_queue_node(q: *mut Queue) -> c_int {
    // SAFETY: the caller's promise.
    match unsafe { queue(q) } {
        Ok(q) => q.node() as c_int,
        Err(c) => c,
    }
}

/// Reserves a buffer of `bytes` for connection `tag` from node `sender`;
/// returns the connection id (>= 0).
///
/// # Safety
/// `q` came from `dd_queue_open`.
#[no_mangle]
pub unsafe extern "C" fn dd_accept(q: *mut Queue, sender: c_int, tag: u32, bytes: u64) -> i64 {
    // SAFETY: the caller's promise.
    let q = match unsafe { queue(q) } {
        Ok(q) => q,
        Err(c) => return c as i64,
    };
    let Ok(sender) = u8::try_from(sender) else { return invalid(&format!("sender node {sender}")) as i64 };
    match q.accept(sender, tag as u64, bytes) {
        Ok(id) => id as i64,
        Err(e) => fail(e) as i64,
    }
}

/// # Safety
/// `note` is NULL or valid for writes.
unsafe fn put_note(note: *mut DdNote, n: &Note) -> c_int {
    // SAFETY: the caller's promise; NULL is refused.
    match unsafe { note.as_mut() } {
        Some(out) => {
            *out = DdNote::from(n);
            0
        }
        None => invalid("the note is NULL"),
    }
}

/// User-level receive: 1 and `*note` when a note arrived, 0 when none.
///
/// # Safety
/// `q` came from `dd_queue_open`; `note` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn dd_poll(q: *mut Queue, note: *mut DdNote) -> c_int {
    // SAFETY: the caller's promise.
    let q = match unsafe { queue(q) } {
        Ok(q) => q,
        Err(c) => return c,
    };
    match q.poll() {
        // SAFETY: the caller's promise.
        Ok(Some(n)) => match unsafe { put_note(note, &n) } {
            0 => 1,
            c => c,
        },
        Ok(None) => 0,
        Err(e) => fail(e),
    }
}

/// Blocking receive: sleeps until a note arrives (up to `timeout_ms`, or
/// for ever when negative); 0 and `*note`.
///
/// # Safety
/// `q` came from `dd_queue_open`; `note` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn dd_recv(q: *mut Queue, note: *mut DdNote, timeout_ms: c_int) -> c_int {
    // SAFETY: the caller's promise.
    let q = match unsafe { queue(q) } {
        Ok(q) => q,
        Err(c) => return c,
    };
    match q.recv(timeout(timeout_ms)) {
        // SAFETY: the caller's promise.
        Ok(n) => unsafe { put_note(note, &n) },
        Err(e) => fail(e),
    }
}

/// Copies up to `len` bytes of received note `note` into `dst`; returns
/// the bytes copied.
///
/// # Safety
/// `q` came from `dd_queue_open`; `note` is readable; `dst` is valid for
/// `len` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn dd_read(q: *mut Queue, note: *const DdNote, dst: *mut c_void, len: usize) -> i64 {
    // SAFETY: the caller's promise.
    let q = match unsafe { queue(q) } {
        Ok(q) => q,
        Err(c) => return c as i64,
    };
    // SAFETY: the caller's promise; NULL is refused.
    let Some(n) = (unsafe { note.as_ref() }) else { return invalid("the note is NULL") as i64 };
    if dst.is_null() && len > 0 {
        return invalid("dst is NULL") as i64;
    }
    let n = n.to();
    let k = len.min(n.len as usize);
    let out: &mut [u8] = if k == 0 {
        &mut []
    } else {
        // SAFETY: the caller gives `len` writable bytes at `dst` (k <= len).
        unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, k) }
    };
    match q.read(&n, out) {
        Ok(()) => k as i64,
        Err(e) => fail(e) as i64,
    }
}

/// Hands received note `note`'s buffer space back to its sender.
///
/// # Safety
/// `q` came from `dd_queue_open`; `note` is readable.
#[no_mangle]
pub unsafe extern "C" fn dd_release(q: *mut Queue, note: *const DdNote) -> c_int {
    // SAFETY: the caller's promise.
    let q = match unsafe { queue(q) } {
        Ok(q) => q,
        Err(c) => return c,
    };
    // SAFETY: the caller's promise; NULL is refused.
    let Some(n) = (unsafe { note.as_ref() }) else { return invalid("the note is NULL") };
    match q.release(&n.to()) {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// Connects to connection `tag` accepted on node `receiver`, waiting up to
/// `timeout_ms` for it.
///
/// # Safety
/// `c` is a valid pointer to a `dd_conn *`.
#[no_mangle]
pub unsafe extern "C" fn dd_connect(c: *mut *mut Conn, receiver: c_int, tag: u32, timeout_ms: c_int) -> c_int {
    if c.is_null() {
        return invalid("dd_connect: c is NULL");
    }
    let Ok(receiver) = u8::try_from(receiver) else { return invalid(&format!("receiver node {receiver}")) };
    match Conn::connect(receiver, tag as u64, timeout(timeout_ms).unwrap_or(Duration::MAX)) {
        Ok(conn) => {
            // SAFETY: the caller passes a valid pointer (checked non-null).
            unsafe { *c = Box::into_raw(Box::new(conn)) };
            0
        }
        Err(e) => fail(e),
    }
}

/// Closes a connection.
///
/// # Safety
/// `c` came from `dd_connect` and is not used after.
#[no_mangle]
pub unsafe extern "C" fn dd_close(c: *mut Conn) {
    if !c.is_null() {
        // SAFETY: made by Box::into_raw in dd_connect, closed once.
        drop(unsafe { Box::from_raw(c) });
    }
}

/// Bytes of the receiver's buffer, or a negative code.
///
/// # Safety
/// `c` came from `dd_connect`.
#[no_mangle]
pub unsafe extern "C" fn dd_buffer_size(c: *mut Conn) -> i64 {
    // SAFETY: the caller's promise.
    match unsafe { conn(c) } {
        Ok(c) => c.buffer_len() as i64,
        Err(e) => e as i64,
    }
}

/// Sends `len` bytes from `src` to `offset` of the receiver's buffer (by
/// DMA from the threshold up); returns the send's ticket (> 0).
///
/// # Safety
/// `c` came from `dd_connect`; `src` is readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn dd_send(c: *mut Conn, offset: u64, src: *const c_void, len: usize) -> i64 {
    // SAFETY: the caller's promise.
    let c = match unsafe { conn(c) } {
        Ok(c) => c,
        Err(e) => return e as i64,
    };
    if src.is_null() && len > 0 {
        return invalid("src is NULL") as i64;
    }
    let data: &[u8] = if len == 0 {
        &[]
    } else {
        // SAFETY: the caller gives `len` readable bytes at `src`.
        unsafe { std::slice::from_raw_parts(src as *const u8, len) }
    };
    match c.send(offset, data) {
        Ok(t) => t.seq as i64,
        Err(e) => fail(e) as i64,
    }
}

/// Whether send `ticket` is done: 1 done, 0 in flight, negative on error.
///
/// # Safety
/// `c` came from `dd_connect`.
#[no_mangle]
pub unsafe extern "C" fn dd_test(c: *mut Conn, ticket: i64) -> c_int {
    // SAFETY: the caller's promise.
    let c = match unsafe { conn(c) } {
        Ok(c) => c,
        Err(e) => return e,
    };
    let t = c.ticket(ticket as u64);
    match c.test(&t) {
        Ok(done) => done as c_int,
        Err(e) => fail(e),
    }
}

/// Waits up to `timeout_ms` for send `ticket` to be done.
///
/// # Safety
/// `c` came from `dd_connect`.
#[no_mangle]
pub unsafe extern "C" fn dd_wait(c: *mut Conn, ticket: i64, timeout_ms: c_int) -> c_int {
    // SAFETY: the caller's promise.
    let c = match unsafe { conn(c) } {
        Ok(c) => c,
        Err(e) => return e,
    };
    let t = c.ticket(ticket as u64);
    match c.wait(&t, timeout(timeout_ms).unwrap_or(Duration::from_secs(3600))) {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// Messages of at least `bytes` go by DMA (0: never).
///
/// # Safety
/// `c` came from `dd_connect`.
#[no_mangle]
pub unsafe extern "C" fn dd_set_dma_threshold(c: *mut Conn, bytes: usize) -> c_int {
    // SAFETY: the caller's promise.
    match unsafe { conn(c) } {
        Ok(c) => {
            c.set_dma_threshold(bytes);
            0
        }
        Err(e) => e,
    }
}

/// Messages sent and not yet released by the receiver.
///
/// # Safety
/// `c` came from `dd_connect`.
#[no_mangle]
pub unsafe extern "C" fn dd_outstanding(c: *mut Conn) -> c_int {
    // SAFETY: the caller's promise.
    match unsafe { conn(c) } {
        Ok(c) => c.outstanding() as c_int,
        Err(e) => e,
    }
}
