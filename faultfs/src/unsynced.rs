//! The writes made to one file since its last fsync, kept in memory over the file's durable
//! content (the backing file, which only an fsync changes).
//!
//! Pure: the backing file is reached through the [`Backing`] trait, so the overlay's rules are
//! tested without FUSE against a plain byte vector.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::io;

/// Granularity of the overlay: a write dirties the pages it touches.
pub const PAGE_BYTES: u64 = 4096;

/// The durable content of a file, as the overlay reads and, at an fsync, writes it.
pub trait Backing {
    /// Reads up to `buf.len()` bytes at `offset`; fewer at the end of the file.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Sets the length, cutting or zero-extending.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// The current length.
    fn len(&self) -> io::Result<u64>;
}

impl Backing for std::fs::File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(self, buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(self, buf, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        std::fs::File::set_len(self, len)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
}

/// What a file holds beyond its durable content: the pages written and the length set since
/// its last fsync. Invariant: `backing_visible_len <= len`, and every byte of a page at or
/// beyond `len` is zero.
#[derive(Debug, Clone)]
pub struct Unsynced {
    /// The file's length as its readers see it.
    len: u64,
    /// Bytes of the durable content still visible: a byte below this offset that no page
    /// holds is read from the backing file, one at or beyond it reads as zero (a truncation
    /// hides what lay beyond it, also after the file grows again).
    backing_visible_len: u64,
    /// Pages written since the last fsync, by page number.
    pages: BTreeMap<u64, Box<[u8]>>,
}

impl Unsynced {
    /// Nothing unsynced yet over a durable file of `durable_len` bytes.
    pub fn new(durable_len: u64) -> Self {
        Unsynced {
            len: durable_len,
            backing_visible_len: durable_len,
            pages: BTreeMap::new(),
        }
    }

    /// The file's length as its readers see it.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Memory held by the written pages.
    pub fn held_bytes(&self) -> u64 {
        self.pages.len() as u64 * PAGE_BYTES
    }

    /// Pages a write of `len` bytes at `offset` would add to the memory held.
    pub fn pages_added_by_write(&self, offset: u64, len: u64) -> u64 {
        if len == 0 {
            return 0;
        }
        let first = offset / PAGE_BYTES;
        let last = (offset + len - 1) / PAGE_BYTES;
        (first..=last)
            .filter(|page| !self.pages.contains_key(page))
            .count() as u64
    }

    /// Reads up to `size` bytes at `offset`, as the file's readers see them.
    pub fn read(&self, backing: &impl Backing, offset: u64, size: u64) -> io::Result<Vec<u8>> {
        let end = offset.saturating_add(size).min(self.len);
        if end <= offset {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (end - offset) as usize];
        let durable_end = end.min(self.backing_visible_len);
        if durable_end > offset {
            read_fully(backing, &mut out[..(durable_end - offset) as usize], offset)?;
        }
        for (&page, bytes) in self
            .pages
            .range(offset / PAGE_BYTES..=(end - 1) / PAGE_BYTES)
        {
            let page_start = page * PAGE_BYTES;
            let from = offset.max(page_start);
            let to = end.min(page_start + PAGE_BYTES);
            out[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&bytes[(from - page_start) as usize..(to - page_start) as usize]);
        }
        Ok(out)
    }

    /// Writes `data` at `offset` (in memory only), growing the file if it ends beyond it.
    pub fn write(&mut self, backing: &impl Backing, offset: u64, data: &[u8]) -> io::Result<()> {
        let end = offset + data.len() as u64;
        let mut at = offset;
        while at < end {
            let page = at / PAGE_BYTES;
            let page_start = page * PAGE_BYTES;
            let to = end.min(page_start + PAGE_BYTES);
            let bytes = self.page_mut(backing, page)?;
            bytes[(at - page_start) as usize..(to - page_start) as usize]
                .copy_from_slice(&data[(at - offset) as usize..(to - offset) as usize]);
            at = to;
        }
        self.len = self.len.max(end);
        Ok(())
    }

    /// Sets the file's length (in memory only): what lies beyond a shorter length is gone,
    /// a longer one reads as zeros.
    pub fn set_len(&mut self, len: u64) {
        self.len = len;
        self.backing_visible_len = self.backing_visible_len.min(len);
        self.pages.split_off(&len.div_ceil(PAGE_BYTES));
        let tail = len % PAGE_BYTES;
        if tail != 0
            && let Some(bytes) = self.pages.get_mut(&(len / PAGE_BYTES))
        {
            bytes[tail as usize..].fill(0);
        }
    }

    /// Makes everything durable: writes the pages and the length to the backing file. The
    /// overlay is empty afterwards (the caller drops it).
    pub fn sync(&self, backing: &impl Backing) -> io::Result<()> {
        // Durable bytes a truncation hid must not come back when the file grows again.
        if backing.len()? > self.backing_visible_len {
            backing.set_len(self.backing_visible_len)?;
        }
        for (&page, bytes) in &self.pages {
            let page_start = page * PAGE_BYTES;
            let to = self.len.min(page_start + PAGE_BYTES);
            backing.write_at(&bytes[..(to - page_start) as usize], page_start)?;
        }
        backing.set_len(self.len)
    }

    /// The page numbered `page`, loaded from the durable content when first written.
    fn page_mut(&mut self, backing: &impl Backing, page: u64) -> io::Result<&mut [u8]> {
        let backing_visible_len = self.backing_visible_len;
        let bytes = match self.pages.entry(page) {
            Entry::Occupied(held) => held.into_mut(),
            Entry::Vacant(new) => {
                let page_start = page * PAGE_BYTES;
                let mut bytes = vec![0u8; PAGE_BYTES as usize].into_boxed_slice();
                let durable_end = backing_visible_len.min(page_start + PAGE_BYTES);
                if durable_end > page_start {
                    read_fully(
                        backing,
                        &mut bytes[..(durable_end - page_start) as usize],
                        page_start,
                    )?;
                }
                new.insert(bytes)
            }
        };
        Ok(bytes)
    }
}

/// Reads `buf.len()` bytes at `offset`, leaving zeros where the backing file ends early.
fn read_fully(backing: &impl Backing, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let n = backing.read_at(&mut buf[done..], offset + done as u64)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::cell::RefCell;

    /// A durable file in memory.
    #[derive(Default)]
    struct Bytes(RefCell<Vec<u8>>);

    impl Backing for Bytes {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            let bytes = self.0.borrow();
            let offset = (offset as usize).min(bytes.len());
            let n = buf.len().min(bytes.len() - offset);
            buf[..n].copy_from_slice(&bytes[offset..offset + n]);
            Ok(n)
        }

        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            let mut bytes = self.0.borrow_mut();
            let end = offset as usize + buf.len();
            if bytes.len() < end {
                bytes.resize(end, 0);
            }
            bytes[offset as usize..end].copy_from_slice(buf);
            Ok(())
        }

        fn set_len(&self, len: u64) -> io::Result<()> {
            self.0.borrow_mut().resize(len as usize, 0);
            Ok(())
        }

        fn len(&self) -> io::Result<u64> {
            Ok(self.0.borrow().len() as u64)
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Write(u64, Vec<u8>),
        SetLen(u64),
        Sync,
    }

    fn op() -> impl Strategy<Value = Op> {
        let offset = 0..(3 * PAGE_BYTES + 100);
        prop_oneof![
            4 => (offset.clone(), proptest::collection::vec(any::<u8>(), 1..9000))
                .prop_map(|(o, d)| Op::Write(o, d)),
            1 => offset.prop_map(Op::SetLen),
            1 => Just(Op::Sync),
        ]
    }

    proptest! {
        /// Readers see every write at once; the backing file holds exactly what was there at
        /// the last sync (what a power cut leaves).
        #[test]
        fn reads_see_writes_and_the_backing_holds_the_last_sync(
            initial in proptest::collection::vec(any::<u8>(), 0..10_000),
            ops in proptest::collection::vec(op(), 1..40),
        ) {
            let backing = Bytes(RefCell::new(initial.clone()));
            let mut visible = initial.clone();
            let mut durable = initial;
            let mut unsynced = Unsynced::new(visible.len() as u64);
            for op in ops {
                match op {
                    Op::Write(offset, data) => {
                        unsynced.write(&backing, offset, &data).unwrap();
                        let end = offset as usize + data.len();
                        if visible.len() < end {
                            visible.resize(end, 0);
                        }
                        visible[offset as usize..end].copy_from_slice(&data);
                    }
                    Op::SetLen(len) => {
                        unsynced.set_len(len);
                        visible.resize(len as usize, 0);
                    }
                    Op::Sync => {
                        unsynced.sync(&backing).unwrap();
                        unsynced = Unsynced::new(backing.len().unwrap());
                        durable = visible.clone();
                    }
                }
                prop_assert_eq!(unsynced.len(), visible.len() as u64);
                let read = unsynced.read(&backing, 0, u64::MAX).unwrap();
                prop_assert!(read == visible, "a reader sees every write");
                prop_assert!(*backing.0.borrow() == durable, "the backing changes only at a sync");
            }
            // A read of a middle range agrees too.
            let from = visible.len() as u64 / 3;
            let read = unsynced.read(&backing, from, 5000).unwrap();
            let to = (from as usize + 5000).min(visible.len());
            prop_assert!(read == visible[from as usize..to].to_vec());
        }
    }

    #[test]
    fn a_truncation_hides_durable_bytes_also_after_growing_again() {
        let backing = Bytes(RefCell::new(vec![7u8; 10_000]));
        let mut unsynced = Unsynced::new(10_000);
        unsynced.set_len(10);
        unsynced.set_len(9000);
        let read = unsynced.read(&backing, 0, u64::MAX).unwrap();
        assert_eq!(&read[..10], &[7u8; 10]);
        assert!(read[10..].iter().all(|&b| b == 0));
        unsynced.sync(&backing).unwrap();
        assert_eq!(*backing.0.borrow(), read);
    }

    #[test]
    fn pages_added_counts_only_new_pages() {
        let backing = Bytes::default();
        let mut unsynced = Unsynced::new(0);
        assert_eq!(unsynced.pages_added_by_write(4000, 200), 2);
        unsynced.write(&backing, 4000, &[1; 200]).unwrap();
        assert_eq!(unsynced.pages_added_by_write(0, 2 * PAGE_BYTES + 1), 1);
        assert_eq!(unsynced.held_bytes(), 2 * PAGE_BYTES);
    }
}
