//! Message buffers: what `pvm_pk*` packs and `pvm_upk*` unpacks, and the
//! bytes a buffer becomes when it is sent.
//!
//! Every guest is x86_64, so the three encodings carry the same bytes:
//! `PvmDataDefault` needs no conversion, `PvmDataRaw` is native, and
//! `PvmDataInPlace` keeps a reference to the caller's data (the C layer
//! makes it, see `ffi`) and copies it only when the message is sent, as
//! PVM specifies. Items are packed back to back in native layout, a string
//! as its length (a 4-byte int, counting the NUL) then its bytes and NUL.
//! Unpacking more than was packed is `PvmNoData`.
//!
//! Pure data: owned by the calling thread's PVM state (under the C
//! layer's lock).

use crate::consts::err;

/// Data packed by reference (`PvmDataInPlace`): `count` items of `size`
/// bytes, `stride` items apart, from `addr` in the calling process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InPlace {
    pub addr: usize,
    pub count: usize,
    pub size: usize,
    pub stride: usize,
}

impl InPlace {
    /// The bytes this reference covers, from the first item to the end
    /// of the last.
    pub fn span(&self) -> usize {
        if self.count == 0 {
            0
        } else {
            (self.count - 1) * self.stride * self.size + self.size
        }
    }
}

/// A piece of a buffer being packed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Bytes(Vec<u8>),
    Ref(InPlace),
}

/// One message buffer (`pvm_mkbuf`): packed parts, or a received
/// message with a read position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Buffer {
    /// The encoding it was made with.
    pub enc: i32,
    parts: Vec<Part>,
    /// Read position in `parts[0]` (a received buffer has one part).
    pos: usize,
    /// Set for a received message: (source tid, tag, context).
    pub from: Option<(i32, i32, i32)>,
}

impl Buffer {
    /// An empty buffer for packing with encoding `enc`.
    pub fn new(enc: i32) -> Buffer {
        Buffer { enc, parts: Vec::new(), pos: 0, from: None }
    }

    /// A received message, for unpacking.
    pub fn received(enc: i32, data: Vec<u8>, src: i32, tag: i32, ctx: i32) -> Buffer {
        Buffer { enc, parts: vec![Part::Bytes(data)], pos: 0, from: Some((src, tag, ctx)) }
    }

    /// The message's length in bytes (what `pvm_bufinfo` reports).
    pub fn len(&self) -> usize {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Bytes(b) => b.len(),
                Part::Ref(r) => r.count * r.size,
            })
            .sum()
    }

    /// Whether nothing has been packed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn tail(&mut self) -> &mut Vec<u8> {
        if !matches!(self.parts.last(), Some(Part::Bytes(_))) {
            self.parts.push(Part::Bytes(Vec::new()));
        }
        match self.parts.last_mut() {
            Some(Part::Bytes(b)) => b,
            _ => unreachable!("a bytes part was just pushed"),
        }
    }

    /// Packs `count` items of `size` bytes taken `stride` items apart
    /// from `data` (which starts at the first item and holds at least
    /// [`InPlace::span`] bytes).
    pub fn pack(&mut self, data: &[u8], count: usize, size: usize, stride: usize) -> Result<(), i32> {
        let span = InPlace { addr: 0, count, size, stride }.span();
        if stride == 0 || data.len() < span {
            return Err(err::BAD_PARAM);
        }
        let out = self.tail();
        if stride == 1 {
            out.extend_from_slice(&data[..count * size]);
        } else {
            out.reserve(count * size);
            for i in 0..count {
                let at = i * stride * size;
                out.extend_from_slice(&data[at..at + size]);
            }
        }
        Ok(())
    }

    /// Packs a reference to the caller's data (`PvmDataInPlace`).
    pub fn pack_ref(&mut self, r: InPlace) -> Result<(), i32> {
        if r.stride == 0 {
            return Err(err::BAD_PARAM);
        }
        if r.count > 0 {
            self.parts.push(Part::Ref(r));
        }
        Ok(())
    }

    /// Packs a string: its length with the NUL, then its bytes and a NUL.
    pub fn pack_str(&mut self, s: &[u8]) {
        let out = self.tail();
        out.extend_from_slice(&((s.len() + 1) as i32).to_ne_bytes());
        out.extend_from_slice(s);
        out.push(0);
    }

    /// Unpacks `count` items of `size` bytes into `out`, `stride` items
    /// apart (`out` holds at least the span).
    pub fn unpack(&mut self, out: &mut [u8], count: usize, size: usize, stride: usize) -> Result<(), i32> {
        let span = InPlace { addr: 0, count, size, stride }.span();
        if stride == 0 || out.len() < span {
            return Err(err::BAD_PARAM);
        }
        let src = self.take(count * size)?;
        if stride == 1 {
            out[..src.len()].copy_from_slice(src);
        } else {
            for (i, item) in src.chunks_exact(size).enumerate() {
                let at = i * stride * size;
                out[at..at + size].copy_from_slice(item);
            }
        }
        Ok(())
    }

    /// Unpacks a string (with its NUL) into `out`, which must hold it.
    pub fn unpack_str(&mut self, out: &mut [u8]) -> Result<usize, i32> {
        let n = self.unpack_str_len()?;
        if out.len() < n {
            return Err(err::NO_MEM);
        }
        let s = self.take(n)?;
        out[..n].copy_from_slice(s);
        out[n - 1] = 0;
        Ok(n)
    }

    /// The length (with the NUL) of the string at the read position,
    /// consuming its length word; the bytes follow.
    fn unpack_str_len(&mut self) -> Result<usize, i32> {
        let w = self.take(4)?;
        let n = i32::from_ne_bytes([w[0], w[1], w[2], w[3]]);
        if n < 1 {
            return Err(err::BAD_MSG);
        }
        Ok(n as usize)
    }

    /// The next `n` bytes of a received (or flattened) buffer.
    fn take(&mut self, n: usize) -> Result<&[u8], i32> {
        let Some(Part::Bytes(b)) = self.parts.first() else {
            return Err(err::NO_DATA);
        };
        if self.parts.len() > 1 || b.len() - self.pos < n {
            return Err(err::NO_DATA);
        }
        let at = self.pos;
        self.pos += n;
        match self.parts.first() {
            Some(Part::Bytes(b)) => Ok(&b[at..at + n]),
            _ => Err(err::NO_DATA),
        }
    }

    /// Bytes left to unpack.
    pub fn left(&self) -> usize {
        match self.parts.first() {
            Some(Part::Bytes(b)) if self.parts.len() == 1 => b.len() - self.pos,
            _ => 0,
        }
    }

    /// The message as bytes, reading in-place parts with `read` (which
    /// copies a reference's items out of the caller's memory).
    pub fn flatten(&self, read: impl Fn(&InPlace, &mut Vec<u8>)) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len());
        for p in &self.parts {
            match p {
                Part::Bytes(b) => out.extend_from_slice(b),
                Part::Ref(r) => read(r, &mut out),
            }
        }
        out
    }

    /// Rewinds a received buffer to its start (a buffer sent again, or
    /// forwarded, is read from the start).
    pub fn rewind(&mut self) {
        self.pos = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of<T: Copy>(v: &[T]) -> Vec<u8> {
        // Test helper over plain numbers.
        let mut out = Vec::new();
        for x in v {
            let p = x as *const T as *const u8;
            // SAFETY: `x` is a plain number of size_of::<T>() bytes.
            out.extend_from_slice(unsafe { std::slice::from_raw_parts(p, std::mem::size_of::<T>()) });
        }
        out
    }

    #[test]
    fn every_item_size_round_trips_with_strides() {
        for size in [1usize, 2, 4, 8, 16] {
            for stride in [1usize, 2, 3] {
                let n = 7;
                let data: Vec<u8> = (0..(n * stride * size) as u32).map(|i| (i * 7 + size as u32) as u8).collect();
                let mut b = Buffer::new(DATA_FOR_TEST);
                b.pack(&data, n, size, stride).unwrap();
                assert_eq!(b.len(), n * size);
                let mut r = Buffer::received(DATA_FOR_TEST, b.flatten(|_, _| unreachable!()), 1, 2, 0);
                let mut out = vec![0u8; data.len()];
                r.unpack(&mut out, n, size, stride).unwrap();
                for i in 0..n {
                    let at = i * stride * size;
                    assert_eq!(out[at..at + size], data[at..at + size], "size {size} stride {stride} item {i}");
                }
                assert_eq!(r.left(), 0);
                assert_eq!(r.unpack(&mut out, 1, size, 1), Err(err::NO_DATA));
            }
        }
    }

    const DATA_FOR_TEST: i32 = crate::consts::DATA_DEFAULT;

    #[test]
    fn strings_and_numbers_interleave() {
        let mut b = Buffer::new(crate::consts::DATA_RAW);
        b.pack(&bytes_of(&[1i32, -2, 3]), 3, 4, 1).unwrap();
        b.pack_str(b"hello, world");
        b.pack(&bytes_of(&[2.5f64]), 1, 8, 1).unwrap();
        let mut r = Buffer::received(1, b.flatten(|_, _| unreachable!()), 5, 6, 0);
        let mut ints = [0u8; 12];
        r.unpack(&mut ints, 3, 4, 1).unwrap();
        assert_eq!(ints.to_vec(), bytes_of(&[1i32, -2, 3]));
        let mut s = [0xffu8; 20];
        assert_eq!(r.unpack_str(&mut s), Ok(13));
        assert_eq!(&s[..13], b"hello, world\0");
        let mut d = [0u8; 8];
        r.unpack(&mut d, 1, 8, 1).unwrap();
        assert_eq!(f64::from_ne_bytes(d), 2.5);
        let mut small = [0u8; 4];
        let mut again = Buffer::received(
            1,
            {
                let mut b = Buffer::new(1);
                b.pack_str(b"too long");
                b.flatten(|_, _| unreachable!())
            },
            0,
            0,
            0,
        );
        assert_eq!(again.unpack_str(&mut small), Err(err::NO_MEM));
    }

    #[test]
    fn in_place_parts_are_read_when_flattened() {
        let mut b = Buffer::new(crate::consts::DATA_IN_PLACE);
        b.pack(&[1, 2, 3, 4], 4, 1, 1).unwrap();
        b.pack_ref(InPlace { addr: 100, count: 3, size: 2, stride: 2 }).unwrap();
        b.pack_str(b"x");
        assert_eq!(b.len(), 4 + 6 + 6);
        let flat = b.flatten(|r, out| {
            assert_eq!(r.addr, 100);
            assert_eq!(r.span(), 10);
            for i in 0..r.count {
                out.extend_from_slice(&[i as u8; 2]);
            }
        });
        assert_eq!(flat[..10], [1, 2, 3, 4, 0, 0, 1, 1, 2, 2]);
        // A buffer still holding references is not read as a message.
        assert_eq!(b.unpack(&mut [0u8; 4], 4, 1, 1), Err(err::NO_DATA));
    }

    #[test]
    fn bad_arguments_are_refused() {
        let mut b = Buffer::new(0);
        assert_eq!(b.pack(&[0u8; 4], 4, 1, 0), Err(err::BAD_PARAM));
        assert_eq!(b.pack(&[0u8; 4], 3, 2, 1), Err(err::BAD_PARAM));
        let mut r = Buffer::received(0, vec![0xff, 0xff, 0xff, 0xff], 0, 0, 0);
        assert_eq!(r.unpack_str(&mut [0u8; 8]), Err(err::BAD_MSG));
    }
}
