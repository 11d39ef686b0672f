//! The stores this node has seen among the cluster's members, kept in a file of its data
//! directory so that a restart remembers them.
//!
//! A log is created only when fewer than W of the stores that could know it did not answer
//! ([`tessera_replication::Placement::known_stores`]). After the whole cluster restarts,
//! the first node is Up alone: the members it sees are no proof of absence, but the stores
//! it saw before are.
//!
//! A node learns a store when its probe of the members finds it; a node without a list yet
//! (new, or upgraded from a release without it) also learns, in its first scan, every store
//! the configurations of the logs it holds name. Nothing is forgotten by itself: no node
//! can tell alone that no log anywhere still needs a store that left, crashed for good or
//! lost its disk (a graceful stop is a leave too, and a cluster stopped one node at a time
//! must still find its logs). An operator forgets a store that is gone for good on each node
//! ([`crate::ReplicatedJournal::forget_store`]), which refuses while a member runs it or
//! unless every other known store answers that no log's latest configuration names it.
//! While W unheard stores are remembered, logs no member knows are not created.
//!
//! The file is text, one store per line after a header line:
//! `<storage id, 16 hex digits> <host:port>`. It is replaced atomically (written beside,
//! synced, renamed, the directory synced).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use tessera_cluster::Address;
use tessera_replication::ReplicaId;

const HEADER: &str = "tessera known stores 1";

/// The known-stores file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum KnownStoresError {
    #[error("reading the known stores file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the known stores file {path} is malformed at line {line}: {reason}")]
    Malformed {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("writing the known stores file {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Storage id → the address its node was last seen at.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KnownStores {
    stores: BTreeMap<u64, Address>,
}

impl KnownStores {
    /// Reads the file at `path`; a missing file is an empty list (a new node).
    pub fn load(path: &Path) -> Result<Self, KnownStoresError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Self::parse(path, &text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(KnownStoresError::Read {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    fn parse(path: &Path, text: &str) -> Result<Self, KnownStoresError> {
        let malformed = |line: usize, reason: String| KnownStoresError::Malformed {
            path: path.to_path_buf(),
            line,
            reason,
        };
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, HEADER)) => {}
            Some((_, other)) => {
                return Err(malformed(
                    1,
                    format!("expected {HEADER:?}, found {other:?}"),
                ));
            }
            None => return Err(malformed(1, "the file is empty".to_string())),
        }
        let mut stores = BTreeMap::new();
        for (index, line) in lines {
            let number = index + 1;
            let Some((id, address)) = line.split_once(' ') else {
                return Err(malformed(number, format!("no space in {line:?}")));
            };
            let id = u64::from_str_radix(id, 16)
                .map_err(|e| malformed(number, format!("storage id {id:?}: {e}")))?;
            let address: Address = address
                .parse()
                .map_err(|e| malformed(number, format!("{e}")))?;
            stores.insert(id, address);
        }
        Ok(KnownStores { stores })
    }

    fn render(&self) -> String {
        let mut text = String::with_capacity(HEADER.len() + 1 + self.stores.len() * 40);
        text.push_str(HEADER);
        text.push('\n');
        for (id, address) in &self.stores {
            text.push_str(&format!("{id:016x} {address}\n"));
        }
        text
    }

    /// Replaces the file at `path` with this list, durably.
    pub fn save(&self, path: &Path) -> Result<(), KnownStoresError> {
        let failed = |source| KnownStoresError::Write {
            path: path.to_path_buf(),
            source,
        };
        let mut temporary = path.as_os_str().to_owned();
        temporary.push(".new");
        let temporary = PathBuf::from(temporary);
        let mut file = std::fs::File::create(&temporary).map_err(failed)?;
        file.write_all(self.render().as_bytes()).map_err(failed)?;
        file.sync_all().map_err(failed)?;
        drop(file);
        std::fs::rename(&temporary, path).map_err(failed)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(failed)?;
        }
        Ok(())
    }

    /// The store `storage_id` answered from `address` now (a store known at another address
    /// moved there). Returns whether the list changed.
    pub fn saw(&mut self, address: &Address, storage_id: u64) -> bool {
        if self.stores.get(&storage_id) == Some(address) {
            return false;
        }
        self.stores.insert(storage_id, address.clone());
        true
    }

    /// A log's configuration names the store `storage_id` at `address`: learned unless known
    /// (an answer from the store itself says better where it is). Returns whether the list
    /// changed.
    pub fn named(&mut self, address: &Address, storage_id: u64) -> bool {
        if self.stores.contains_key(&storage_id) {
            return false;
        }
        self.stores.insert(storage_id, address.clone());
        true
    }

    /// Forgets a store (an operator's decision that it is gone for good). Returns whether it
    /// was known.
    pub fn forget(&mut self, storage_id: u64) -> bool {
        self.stores.remove(&storage_id).is_some()
    }

    pub fn replicas(&self) -> Vec<ReplicaId> {
        self.stores
            .iter()
            .map(|(id, address)| ReplicaId::new(address.clone(), *id))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.stores.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stores.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(port: u16) -> Address {
        Address::new("10.0.0.1", port)
    }

    #[test]
    fn a_store_is_forgotten_only_when_told() {
        let mut known = KnownStores::default();
        assert!(known.saw(&address(1), 11));
        assert!(known.saw(&address(2), 12));
        assert!(!known.saw(&address(1), 11));
        // It moved: the same store at another address.
        assert!(known.saw(&address(3), 12));
        assert_eq!(known.len(), 2);
        // A configuration's older address does not move it back.
        assert!(!known.named(&address(2), 12));
        assert!(known.named(&address(4), 14));
        // Its node lost its disk: another store at its address, the old one still known.
        assert!(known.saw(&address(1), 21));
        assert_eq!(
            known.replicas(),
            vec![
                ReplicaId::new(address(1), 11),
                ReplicaId::new(address(3), 12),
                ReplicaId::new(address(4), 14),
                ReplicaId::new(address(1), 21)
            ]
        );
        assert!(known.forget(11));
        assert!(!known.forget(11));
        assert_eq!(known.len(), 3);
    }

    #[test]
    fn the_list_survives_a_save_and_load_and_a_bad_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("known-stores");
        assert!(KnownStores::load(&path).unwrap().is_empty());
        let mut known = KnownStores::default();
        known.saw(&address(1), u64::MAX);
        known.saw(&address(2), 7);
        known.save(&path).unwrap();
        assert_eq!(KnownStores::load(&path).unwrap(), known);
        for (text, line) in [
            ("", 1),
            ("something else\n", 1),
            ("tessera known stores 1\n00000000000000ff\n", 2),
            ("tessera known stores 1\nzz 10.0.0.1:1\n", 2),
            ("tessera known stores 1\n0a 10.0.0.1:1\n0b 10.0.0.1\n", 3),
        ] {
            std::fs::write(&path, text).unwrap();
            match KnownStores::load(&path) {
                Err(KnownStoresError::Malformed { line: at, .. }) => assert_eq!(at, line, "{text}"),
                other => panic!("{text:?}: {other:?}"),
            }
        }
    }
}
