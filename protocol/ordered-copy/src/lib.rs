//! [`ordered_store`]: MEMORY CHANNEL's ordering inside one copy. A reader
//! that sees a word of the copy also sees every byte before it.
//!
//! Both sides of the interconnect need it: the adapter's receive side,
//! which applies a packet to guest memory (`device::dma`: a block and the
//! flag stored after it are often coalesced into one packet), and guest
//! processes that copy into a transmit window or a shared ring
//! (`guest_mem::Window::write_ordered`). No I/O; any thread.

use std::sync::atomic::Ordering;

use vm_memory::{Bytes, VolatileSlice};

/// Stores `src` into `dst` (which starts at byte `base` of its mapping) in
/// ascending address order, each store naturally aligned, at most 8 bytes
/// wide, and a release store. Stores `min(src.len(), dst.len())` bytes.
///
/// A bulk copy gives no such promise: glibc's vector `memcpy` writes the
/// first bytes last for mid-sized copies, so a reader polling the last
/// word saw it before the first one. Release stores are plain `mov`s on
/// x86 and keep the order on hosts with weaker memory models too. An
/// aligned store of 8 bytes or less is never torn, so an aligned 8-byte
/// store arrives whole, and a copy of whole aligned words makes only
/// 8-byte stores (what the adapter's transmit window takes). Mappings are
/// page aligned, so the alignment of `base + i` is the alignment of the
/// address.
pub fn ordered_store(dst: &VolatileSlice<'_, ()>, base: usize, src: &[u8]) {
    let mut i = 0;
    let n = src.len().min(dst.len());
    while i < n {
        let left = n - i;
        let at = base + i;
        // Every store is inside `dst` and aligned, so the accessors cannot
        // fail; they check again anyway.
        let r = if at % 8 == 0 && left >= 8 {
            let v = u64::from_ne_bytes(src[i..i + 8].try_into().unwrap_or_default());
            i += 8;
            dst.store(v, at - base, Ordering::Release)
        } else if at % 4 == 0 && left >= 4 {
            let v = u32::from_ne_bytes(src[i..i + 4].try_into().unwrap_or_default());
            i += 4;
            dst.store(v, at - base, Ordering::Release)
        } else if at % 2 == 0 && left >= 2 {
            let v = u16::from_ne_bytes(src[i..i + 2].try_into().unwrap_or_default());
            i += 2;
            dst.store(v, at - base, Ordering::Release)
        } else {
            let v = src[i];
            i += 1;
            dst.store(v, at - base, Ordering::Release)
        };
        debug_assert!(r.is_ok(), "ordered store at {at}: {r:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    use vm_memory::{MmapRegion, VolatileMemory};

    /// A reader polling the last word of each copy never sees it before
    /// the words below it: every word of a copy holds the round number, so
    /// a first word older than the last word is a violation.
    #[test]
    fn copies_are_seen_in_ascending_order_by_a_concurrent_reader() {
        const LEN: usize = 1 << 16;
        let region = Arc::new(MmapRegion::<()>::new(LEN).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        for size in [64usize, 1024, 2048, 4096, 8192] {
            stop.store(false, Ordering::SeqCst);
            let (r, halt) = (region.clone(), stop.clone());
            let writer = std::thread::spawn(move || {
                let dst = r.get_slice(0x1000, size).unwrap();
                let mut round = 0u64;
                while !halt.load(Ordering::Relaxed) {
                    round += 1;
                    let block: Vec<u8> = (0..size / 8).flat_map(|_| round.to_ne_bytes()).collect();
                    ordered_store(&dst, 0x1000, &block);
                }
                round
            });
            let view = region.get_slice(0, LEN).unwrap();
            let (mut violations, mut seen, mut last) = (0u64, 0u64, 0u64);
            let t0 = std::time::Instant::now();
            while seen < 5000 && t0.elapsed() < std::time::Duration::from_secs(5) {
                let flag: u64 = view.load(0x1000 + size - 8, Ordering::Acquire).unwrap();
                let first: u64 = view.load(0x1000, Ordering::Acquire).unwrap();
                if first < flag {
                    violations += 1;
                }
                if flag != last {
                    seen += 1;
                    last = flag;
                }
            }
            stop.store(true, Ordering::SeqCst);
            let rounds = writer.join().unwrap();
            assert_eq!(violations, 0, "{size}-byte copies ({rounds}): the last word was seen before the first");
            assert!(seen >= 100, "{size}-byte copies: the reader saw only {seen} flags; the test checked nothing");
        }
    }

    /// Unaligned edges go by narrower stores; the bytes are the copy's and
    /// nothing outside it changes; a copy longer than `dst` stops at its end.
    #[test]
    fn unaligned_edges_are_copied_exactly() {
        let region = MmapRegion::<()>::new(4096).unwrap();
        let data: Vec<u8> = (1..=29).collect();
        ordered_store(&region.get_slice(3, 40).unwrap(), 3, &data);
        let mut got = [0u8; 40];
        region.get_slice(0, 40).unwrap().copy_to(&mut got[..]);
        assert_eq!(&got[..34], &[&[0u8; 3][..], &data, &[0, 0]].concat()[..]);
        ordered_store(&region.get_slice(101, 5).unwrap(), 101, &data);
        let mut got = [0u8; 7];
        region.get_slice(101, 7).unwrap().copy_to(&mut got[..]);
        assert_eq!(got, [1, 2, 3, 4, 5, 0, 0]);
    }
}
