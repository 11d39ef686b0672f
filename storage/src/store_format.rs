//! The store-level format check, done before a RocksDB directory is opened for writing.

use std::path::{Path, PathBuf};

/// Why a store directory cannot be opened with this release's format.
#[derive(Debug, thiserror::Error)]
pub enum StoreFormatError {
    /// The directory holds a store written by a newer release.
    #[error(
        "the store at {path} has format version {found}, newer than the version {supported} \
         this release can read; use a newer tessera or another directory"
    )]
    Newer {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    /// The directory holds a RocksDB database that is not a store of this kind.
    #[error("the directory {path} holds a RocksDB database that is not a tessera {kind} store")]
    Foreign { path: PathBuf, kind: &'static str },
    /// The format marker cannot be read.
    #[error("cannot read the format version of the store at {path}: {detail}")]
    Unreadable { path: PathBuf, detail: String },
}

/// The key, in the store's metadata column family, of its format version (u32 big-endian).
pub const FORMAT_VERSION_KEY: &[u8] = b"format_version";

/// Checks the format version of an existing store before it is opened for writing, by opening
/// it read-only: a store written by a newer release is refused without changing a byte.
/// Returns `None` for a directory without a database (a new store), else the version found.
/// `meta_cf` holds the marker; `other_cfs` are the store's other column families.
///
/// A database without the marker that holds nothing at all and has no column family but the
/// store's own is new too: a store is created by opening RocksDB and then recording the
/// format, and a crash between the two leaves such a database, which must still open.
pub fn check_store_format(
    path: &Path,
    kind: &'static str,
    meta_cf: &str,
    other_cfs: &[&str],
    supported: u32,
) -> Result<Option<u32>, StoreFormatError> {
    let options = rocksdb::Options::default();
    let Ok(column_families) = rocksdb::DB::list_cf(&options, path) else {
        // No CURRENT file: nothing was ever written here.
        return Ok(None);
    };
    let foreign = || StoreFormatError::Foreign {
        path: path.to_path_buf(),
        kind,
    };
    let unreadable = |detail: String| StoreFormatError::Unreadable {
        path: path.to_path_buf(),
        detail,
    };
    let has_meta = column_families.iter().any(|cf| cf == meta_cf);
    let only_own = column_families
        .iter()
        .all(|cf| cf == "default" || cf == meta_cf || other_cfs.contains(&cf.as_str()));
    if !has_meta && !only_own {
        return Err(foreign());
    }
    // Without the metadata column family, an error is that of a database that is not ours.
    let error = |e: rocksdb::Error| {
        if has_meta {
            unreadable(e.to_string())
        } else {
            foreign()
        }
    };
    let db = rocksdb::DB::open_cf_for_read_only(&options, path, &column_families, false)
        .map_err(error)?;
    let marker = match db.cf_handle(meta_cf) {
        Some(cf) => db.get_cf(cf, FORMAT_VERSION_KEY).map_err(error)?,
        None => None,
    };
    let Some(value) = marker else {
        if only_own && holds_nothing(&db, &column_families).map_err(error)? {
            return Ok(None);
        }
        return Err(if has_meta {
            unreadable("no format version recorded".to_string())
        } else {
            foreign()
        });
    };
    let found = <[u8; 4]>::try_from(value.as_slice())
        .map(u32::from_be_bytes)
        .map_err(|_| unreadable(format!("format version of {} bytes", value.len())))?;
    if found > supported {
        return Err(StoreFormatError::Newer {
            path: path.to_path_buf(),
            found,
            supported,
        });
    }
    Ok(Some(found))
}

/// Whether no column family of `db` holds a key.
fn holds_nothing(db: &rocksdb::DB, column_families: &[String]) -> Result<bool, rocksdb::Error> {
    for name in column_families {
        let Some(cf) = db.cf_handle(name) else {
            continue;
        };
        let mut iter = db.raw_iterator_cf(cf);
        iter.seek_to_first();
        iter.status()?;
        if iter.valid() {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Creates a RocksDB database at `path` with `column_families` (and `default`), putting
    /// `entries` (column family, key) into it.
    fn database(path: &Path, column_families: &[&str], entries: &[(&str, &[u8])]) {
        let mut options = rocksdb::Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        let db = rocksdb::DB::open_cf(&options, path, column_families).unwrap();
        for (cf, key) in entries {
            match db.cf_handle(cf) {
                Some(cf) => db.put_cf(cf, key, b"v").unwrap(),
                // `default`, which is not among the handles opened by name.
                None => db.put(key, b"v").unwrap(),
            }
        }
    }

    #[test]
    fn an_empty_database_without_a_marker_is_a_new_store() {
        // The states a crash during a store's creation can leave: RocksDB opened (with some or
        // all column families) but the format not yet recorded.
        for column_families in [&[][..], &["events"][..], &["events", "meta"][..]] {
            let dir = tempfile::tempdir().unwrap();
            database(dir.path(), column_families, &[]);
            let found = check_store_format(dir.path(), "journal", "meta", &["events"], 3);
            assert!(matches!(found, Ok(None)), "{column_families:?}: {found:?}");
        }
    }

    #[test]
    fn a_database_holding_keys_but_no_marker_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        database(dir.path(), &["events", "meta"], &[("events", b"k")]);
        let found = check_store_format(dir.path(), "journal", "meta", &["events"], 3);
        assert!(
            matches!(&found, Err(StoreFormatError::Unreadable { detail, .. })
                if detail.contains("no format version")),
            "{found:?}"
        );
        // Another application's database, with keys or without: never adopted.
        for entries in [&[("default", &b"k"[..])][..], &[][..]] {
            let dir = tempfile::tempdir().unwrap();
            database(dir.path(), &["other"], entries);
            let found = check_store_format(dir.path(), "journal", "meta", &["events"], 3);
            assert!(
                matches!(found, Err(StoreFormatError::Foreign { .. })),
                "{entries:?}: {found:?}"
            );
        }
    }

    #[test]
    fn the_marker_decides_once_recorded() {
        let dir = tempfile::tempdir().unwrap();
        database(dir.path(), &["meta"], &[]);
        {
            let db =
                rocksdb::DB::open_cf(&rocksdb::Options::default(), dir.path(), ["meta"]).unwrap();
            let meta = db.cf_handle("meta").unwrap();
            db.put_cf(meta, FORMAT_VERSION_KEY, 4u32.to_be_bytes())
                .unwrap();
        }
        let found = check_store_format(dir.path(), "journal", "meta", &["events"], 3);
        assert!(
            matches!(found, Err(StoreFormatError::Newer { found: 4, .. })),
            "{found:?}"
        );
        assert!(matches!(
            check_store_format(dir.path(), "journal", "meta", &["events"], 4),
            Ok(Some(4))
        ));
    }
}
