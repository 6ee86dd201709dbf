//! The caller's buffers a send or a receive uses: a lent send buffer, a
//! posted contiguous receive buffer (each made only by an unsafe
//! constructor whose caller promises the memory lives until completion),
//! or owned bytes.

/// `cap` bytes of the caller's memory that a receive may write, until
/// it completes or is cancelled (MPI's rule for receive buffers). Made
/// only by [`Posted::new`], whose caller promises that.
#[derive(Debug, Clone, Copy)]
pub struct Posted {
    pub(super) ptr: *mut u8,
    pub(super) cap: usize,
}

impl Posted {
    /// The receive buffer of `cap` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr + cap` must stay valid for writes, and written by nothing
    /// else, until the receive that takes it completes or is cancelled.
    pub unsafe fn new(ptr: *mut u8, cap: usize) -> Posted {
        Posted { ptr, cap }
    }
}

/// Where a receive puts the message.
#[derive(Debug, Clone, Copy)]
pub enum RecvBuf {
    /// Straight into the caller's memory.
    Contig(Posted),
    /// Into a buffer the engine keeps (the caller unpacks it later with
    /// [`Engine::take_packed`]): for non-contiguous datatypes.
    Packed {
        /// Bytes wanted at most.
        cap: usize,
    },
}

impl RecvBuf {
    pub(super) fn cap(&self) -> usize {
        match *self {
            RecvBuf::Contig(Posted { cap, .. }) | RecvBuf::Packed { cap } => cap,
        }
    }
}

/// `len` bytes of the caller's memory that a send reads, until it
/// completes or is cancelled (MPI's rule for send buffers). Made only by
/// [`Lent::new`], whose caller promises that.
#[derive(Debug, Clone, Copy)]
pub struct Lent {
    pub(super) ptr: *const u8,
    pub(super) len: usize,
}

impl Lent {
    /// The send buffer of `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr + len` must stay valid for reads, and unchanged, until the
    /// send that takes it completes or is cancelled.
    pub unsafe fn new(ptr: *const u8, len: usize) -> Lent {
        Lent { ptr, len }
    }
}

/// What a send takes its bytes from.
#[derive(Debug)]
pub enum SendBuf {
    /// Bytes the engine owns (packed, or copied).
    Owned(Vec<u8>),
    /// The caller's memory.
    Borrowed(Lent),
}

impl SendBuf {
    /// The same bytes, owned by the engine (a copy of the caller's): for a
    /// send that completes before the bytes leave (`MPI_Bsend`).
    pub fn into_owned(self) -> SendBuf {
        match self {
            SendBuf::Borrowed(_) => SendBuf::Owned(self.bytes(0, self.len()).to_vec()),
            owned => owned,
        }
    }
    pub(super) fn len(&self) -> usize {
        match self {
            SendBuf::Owned(v) => v.len(),
            SendBuf::Borrowed(Lent { len, .. }) => *len,
        }
    }
    pub(super) fn bytes(&self, off: usize, n: usize) -> &[u8] {
        match self {
            SendBuf::Owned(v) => &v[off..off + n],
            // SAFETY: `Lent::new`'s caller keeps `len` bytes at `ptr` valid
            // and unchanged until the send completes; off + n <= len.
            SendBuf::Borrowed(Lent { ptr, len }) => unsafe {
                std::slice::from_raw_parts(ptr.add(off), n.min(len - off))
            },
        }
    }
}
