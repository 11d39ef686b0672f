//! A projection instance's offset in the replicated journal: a log of its own,
//! `#projection|<projection>|<index>-of-<instances>`, whose records each hold the logs whose
//! sequence numbers moved since the record before (every [`FULL_RECORD_EVERY`] saves a full
//! one, and the records before it are deleted). The offset is every record merged.
//!
//! The log has one fenced writer, like every log of the replicated journal: opening it
//! makes this node its writer (recovering it, which fences any writer before), and only then
//! is the offset read. Every save goes through that very writer
//! ([`ReplicatedJournal::append_fenced`]): a writer fenced by a successor can no longer have
//! a write acknowledged, and one dropped or replaced on this node is not started again for
//! a save (which would fence the successor in turn). So a save by an instance that lost its
//! slot fails, and the instance stops.

use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tessera_journal::{AtomicWrite, Journal, JournalError, Manifest, NewEvent, SliceOffset};
use tessera_persistence::ReplicatedJournal;
use tessera_replication::Epoch;

/// Where the offset logs are.
#[derive(Clone)]
pub enum OffsetJournal {
    /// The cluster's: opened and written through one fenced writer.
    Replicated(Arc<ReplicatedJournal>),
    /// A node's own journal (tests, single-node tools): no writer to fence.
    Local(Arc<dyn Journal>),
}

impl OffsetJournal {
    fn journal(&self) -> Arc<dyn Journal> {
        match self {
            OffsetJournal::Replicated(journal) => journal.clone(),
            OffsetJournal::Local(journal) => journal.clone(),
        }
    }
}

/// The entity type of the offset logs: `#` is no entity type name's character, so no
/// entity's log and no query by slice of an entity type meets them.
pub const OFFSET_LOG_TYPE: &str = "#projection";

/// The manifest of an offset record.
pub const OFFSET_RECORD_MANIFEST: &str = "tessera.projection.OffsetRecord";

/// A full record, and the deletion of the ones before it, after this many saves.
pub const FULL_RECORD_EVERY: u32 = 64;

/// The offset log of instance `index` of `instances` of projection `projection`.
pub fn offset_log_id(projection: &str, index: u32, instances: u32) -> String {
    format!("{OFFSET_LOG_TYPE}|{projection}|{index}-of-{instances}")
}

/// One save.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct OffsetRecord {
    /// The offset is these alone (a full record, or a reset), not these merged into the
    /// records before.
    replaces: bool,
    seqs: Vec<(String, u64)>,
    /// The operators' resets applied to the offset so far (see [`crate::control`]).
    resets: u64,
}

/// The manifest version of [`OffsetRecord`]; version 1 had no `resets`.
const OFFSET_RECORD_VERSION: u32 = 2;

#[derive(Deserialize)]
struct OffsetRecordV1 {
    replaces: bool,
    seqs: Vec<(String, u64)>,
}

fn decode_record(repr: &tessera_journal::PersistentRepr) -> Result<OffsetRecord, postcard::Error> {
    if repr.manifest.version == 1 {
        let v1: OffsetRecordV1 = postcard::from_bytes(&repr.payload)?;
        return Ok(OffsetRecord {
            replaces: v1.replaces,
            seqs: v1.seqs,
            resets: 0,
        });
    }
    postcard::from_bytes(&repr.payload)
}

/// A save's record, made by [`OffsetLog::prepare_save`].
#[derive(Debug)]
pub struct PreparedSave {
    record: OffsetRecord,
}

/// Why an offset could not be read or saved.
#[derive(Debug, thiserror::Error)]
pub enum OffsetError {
    #[error("offset log {persistence_id}: {source}")]
    Journal {
        persistence_id: String,
        source: JournalError,
    },
    #[error("offset log {persistence_id}: record {sequence_nr} does not decode: {reason}")]
    Corrupt {
        persistence_id: String,
        sequence_nr: u64,
        reason: String,
    },
}

/// An instance's offset log, with this node as its writer.
pub struct OffsetLog {
    journal: OffsetJournal,
    /// The epoch of this node's writer that opened the log (none for a local journal).
    fence: Option<Epoch>,
    persistence_id: String,
    writer_id: String,
    highest: u64,
    saves_since_full: u32,
    /// The resets applied to the offset.
    resets: u64,
}

impl OffsetLog {
    /// Takes the log over (fencing any writer before) and reads the offset saved in it.
    pub async fn open(
        journal: OffsetJournal,
        persistence_id: String,
        writer_id: String,
    ) -> Result<(Self, SliceOffset), OffsetError> {
        let failed = |source| OffsetError::Journal {
            persistence_id: persistence_id.clone(),
            source,
        };
        // The highest sequence number comes from this node's writer of the log, which
        // recovers the log first: the fence.
        let (highest, fence) = match &journal {
            OffsetJournal::Replicated(replicated) => {
                let opened = replicated
                    .open_fenced(&persistence_id)
                    .await
                    .map_err(failed)?;
                (opened.highest, Some(opened.epoch))
            }
            OffsetJournal::Local(local) => (
                local
                    .highest_sequence_nr(&persistence_id)
                    .await
                    .map_err(failed)?,
                None,
            ),
        };
        let mut offset = SliceOffset::start();
        let mut resets = 0;
        let mut records = journal
            .journal()
            .replay(&persistence_id, 1, highest, u64::MAX);
        while let Some(repr) = records.next().await {
            let repr = repr.map_err(failed)?;
            let record = decode_record(&repr).map_err(|e| OffsetError::Corrupt {
                persistence_id: persistence_id.clone(),
                sequence_nr: repr.sequence_nr,
                reason: e.to_string(),
            })?;
            resets = resets.max(record.resets);
            if record.replaces {
                offset = SliceOffset::start();
            }
            for (pid, seq) in record.seqs {
                offset.advance(&pid, seq);
            }
        }
        let log = OffsetLog {
            journal,
            fence,
            persistence_id,
            writer_id,
            highest,
            saves_since_full: 0,
            resets,
        };
        Ok((log, offset))
    }

    /// The epoch of the writer that opened the log: higher than that of every instance's
    /// before, so a fencing token for a store of the instance's own (exactly-once). None
    /// for a local journal.
    pub fn fence(&self) -> Option<Epoch> {
        self.fence
    }

    /// The operators' resets applied to the offset (see [`crate::control`]).
    pub fn resets(&self) -> u64 {
        self.resets
    }

    /// Saves `offset`, of which the logs in `moved` are those that moved since the last
    /// save: a record of those alone (nothing is written when none did), or, every
    /// [`FULL_RECORD_EVERY`] saves, a full one.
    ///
    /// A log that moved and is missing from `moved` is saved by the next full record only;
    /// the caller names each one (a run's moves are a handful of the logs it follows, so the
    /// record is not made by a walk over all of them).
    pub async fn save(
        &mut self,
        offset: &SliceOffset,
        moved: &BTreeSet<String>,
    ) -> Result<(), OffsetError> {
        match self.prepare_save(offset, moved) {
            Some(save) => self.write_save(save).await,
            None => Ok(()),
        }
    }

    /// The record [`OffsetLog::save`] writes, taken now, so that the caller may go on moving
    /// its offset while [`OffsetLog::write_save`] writes it. None: nothing to write. Saves
    /// are written one at a time, in the order they were prepared.
    pub fn prepare_save(
        &mut self,
        offset: &SliceOffset,
        moved: &BTreeSet<String>,
    ) -> Option<PreparedSave> {
        let full = self.saves_since_full + 1 >= FULL_RECORD_EVERY;
        let seqs: Vec<(String, u64)> = if full {
            offset
                .iter()
                .map(|(pid, seq)| (pid.to_string(), seq))
                .collect()
        } else {
            moved
                .iter()
                .map(|pid| (pid.clone(), offset.get(pid)))
                .filter(|(_, seq)| *seq > 0)
                .collect()
        };
        if seqs.is_empty() && !full {
            return None;
        }
        Some(PreparedSave {
            record: OffsetRecord {
                replaces: full,
                seqs,
                resets: self.resets,
            },
        })
    }

    /// Writes a save [`OffsetLog::prepare_save`] made.
    pub async fn write_save(&mut self, save: PreparedSave) -> Result<(), OffsetError> {
        let full = save.record.replaces;
        self.write(save.record).await?;
        if full {
            self.saves_since_full = 0;
            // The full record holds everything before it.
            if let Err(e) = self
                .journal
                .journal()
                .delete_to(&self.persistence_id, self.highest - 1)
                .await
            {
                tracing::debug!(log = %self.persistence_id, error = %e, "old offset records not deleted; the next full record tries again");
            }
        } else {
            self.saves_since_full += 1;
        }
        Ok(())
    }

    /// Replaces the offset with `offset`, recording that `resets` resets are applied (an
    /// operator's reset: see [`crate::control`]).
    pub async fn replace(&mut self, offset: &SliceOffset, resets: u64) -> Result<(), OffsetError> {
        let seqs = offset
            .iter()
            .map(|(pid, seq)| (pid.to_string(), seq))
            .collect();
        self.write(OffsetRecord {
            replaces: true,
            seqs,
            resets,
        })
        .await?;
        self.saves_since_full = 0;
        self.resets = resets;
        Ok(())
    }

    async fn write(&mut self, record: OffsetRecord) -> Result<(), OffsetError> {
        let failed = |source| OffsetError::Journal {
            persistence_id: self.persistence_id.clone(),
            source,
        };
        let payload = postcard::to_allocvec(&record).map_err(|e| OffsetError::Corrupt {
            persistence_id: self.persistence_id.clone(),
            sequence_nr: self.highest + 1,
            reason: e.to_string(),
        })?;
        let timestamp_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let write = AtomicWrite {
            persistence_id: self.persistence_id.clone(),
            writer_id: self.writer_id.clone(),
            events: vec![NewEvent {
                sequence_nr: self.highest + 1,
                timestamp_ms,
                manifest: Manifest::new(OFFSET_RECORD_MANIFEST, OFFSET_RECORD_VERSION),
                payload: Bytes::from(payload),
                tags: Vec::new(),
            }],
        };
        let appended = match (&self.journal, self.fence) {
            (OffsetJournal::Replicated(replicated), Some(fence)) => {
                replicated.append_fenced(write, fence).await
            }
            (journal, _) => journal.journal().append(write).await,
        };
        appended.map_err(failed)?;
        self.highest += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_journal::MemoryJournal;

    #[tokio::test]
    async fn an_offset_is_the_records_merged_and_survives_a_reopen_and_compaction() {
        let memory: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
        let journal = OffsetJournal::Local(memory.clone());
        let id = offset_log_id("balances", 1, 4);
        assert_eq!(id, "#projection|balances|1-of-4");
        let (mut log, offset) = OffsetLog::open(journal.clone(), id.clone(), "w".into())
            .await
            .unwrap();
        assert!(offset.is_empty());
        let mut offset = SliceOffset::start();
        for round in 1..=(FULL_RECORD_EVERY as u64 * 2 + 3) {
            let pid = format!("account|{}", round % 7);
            offset.advance(&pid, round);
            log.save(&offset, &BTreeSet::from([pid])).await.unwrap();
        }
        // Nothing moved: nothing written.
        let highest = memory.highest_sequence_nr(&id).await.unwrap();
        log.save(&offset, &BTreeSet::new()).await.unwrap();
        assert_eq!(memory.highest_sequence_nr(&id).await.unwrap(), highest);
        let (_, reopened) = OffsetLog::open(journal.clone(), id.clone(), "w".into())
            .await
            .unwrap();
        assert_eq!(reopened, offset);
        // Full records let the older ones go.
        let kept = memory.replay(&id, 1, u64::MAX, u64::MAX).count().await;
        assert!(kept < FULL_RECORD_EVERY as usize + 1, "{kept} records kept");

        let (mut log, _) = OffsetLog::open(journal.clone(), id.clone(), "w".into())
            .await
            .unwrap();
        let mut reset = SliceOffset::start();
        reset.advance("account|1", 2);
        log.replace(&reset, 3).await.unwrap();
        log.save(&reset, &BTreeSet::from(["account|1".to_string()]))
            .await
            .unwrap();
        let (log, reopened) = OffsetLog::open(journal, id, "w".into()).await.unwrap();
        assert_eq!(reopened, reset);
        assert_eq!(log.resets(), 3, "the resets applied survive the reopen");
    }
}
