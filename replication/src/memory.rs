//! A replica's log held in memory, applying [`Rules`] exactly as the RocksDB store does: the
//! simulation's replicas, and the in-memory replica store of the tokio layer's tests.

use crate::epoch::Epoch;
use crate::message::{Entry, LogSummary, Payload, Request, Response};
use crate::replica::{Decision, EntryEpochs, Leases, LogMeta, Mutation, Reply, Rules};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Bounds on what one answer carries.
#[derive(Clone, Copy, Debug)]
pub struct ReadLimits {
    /// Entries above the acknowledged mark sent with a promise (the rest is read).
    pub max_tail_entries: usize,
    /// Payload bytes in a promise's tail or a read, beyond its first entry.
    pub max_bytes: usize,
}

/// One log of a replica, in memory.
#[derive(Clone, Debug)]
pub struct MemoryLog<P> {
    pub meta: Option<LogMeta>,
    pub entries: BTreeMap<u64, Entry<P>>,
}

impl<P> Default for MemoryLog<P> {
    fn default() -> Self {
        MemoryLog {
            meta: None,
            entries: BTreeMap::new(),
        }
    }
}

impl<P> EntryEpochs for MemoryLog<P> {
    fn epoch_at(&self, seq: u64) -> Option<Epoch> {
        self.entries.get(&seq).map(|e| e.epoch)
    }
}

/// Entries of `range` in order, at most `max_entries` and `max_bytes` (but at least one).
fn take_bounded<'a, P: Payload + 'a>(
    entries: impl Iterator<Item = &'a Entry<P>>,
    max_entries: usize,
    max_bytes: usize,
) -> (Vec<Entry<P>>, bool) {
    let mut taken = Vec::new();
    let mut bytes = 0;
    for entry in entries {
        bytes += entry.payload.size_bytes();
        if taken.len() >= max_entries || (bytes > max_bytes && !taken.is_empty()) {
            return (taken, false);
        }
        taken.push(entry.clone());
    }
    (taken, true)
}

impl<P: Payload> MemoryLog<P> {
    /// Applies a decision: the meta, then the entry mutations, as one atomic write.
    pub fn apply(&mut self, decision: Decision<P>) -> Reply {
        if let Some(meta) = decision.meta {
            self.meta = Some(meta);
        }
        for mutation in decision.mutations {
            match mutation {
                Mutation::TruncateFrom(seq) => {
                    self.entries.split_off(&seq);
                }
                Mutation::Put(entry) => {
                    self.entries.insert(entry.seq, entry);
                }
                Mutation::Reseal { seq, epoch } => {
                    if let Some(entry) = self.entries.get_mut(&seq) {
                        entry.epoch = epoch;
                    }
                }
                Mutation::DeleteTo(seq) => {
                    self.entries = self.entries.split_off(&(seq.saturating_add(1)));
                }
            }
        }
        decision.reply
    }

    pub fn summary(&self) -> Option<LogSummary> {
        self.meta.as_ref().map(|m| m.summary())
    }

    /// Answers one request, as a replica service does (`Locate` answers with storage id 0:
    /// the caller fills in its own).
    pub fn handle(
        &mut self,
        rules: &Rules,
        request: Request<P>,
        limits: ReadLimits,
    ) -> Response<P> {
        let meta = self.meta.clone();
        let confirm = matches!(request, Request::Confirm { .. });
        let decision = match request {
            Request::Locate => {
                return Response::Located {
                    storage_id: 0,
                    summary: self.summary(),
                };
            }
            Request::Read {
                from,
                to,
                max_entries,
                max_bytes,
            } => {
                let summary = self
                    .summary()
                    .unwrap_or_else(|| LogMeta::default().summary());
                // An empty range, as the RocksDB store answers it (`BTreeMap::range` would
                // panic on a start above the end, which any peer can send).
                if from > to {
                    return Response::Entries {
                        entries: Vec::new(),
                        summary,
                    };
                }
                let max_bytes = (max_bytes as usize).min(limits.max_bytes);
                let (entries, _) = take_bounded(
                    self.entries.range(from..=to).map(|(_, e)| e),
                    max_entries as usize,
                    max_bytes,
                );
                return Response::Entries { entries, summary };
            }
            Request::Prepare { epoch } => rules.prepare(meta.as_ref(), epoch),
            Request::Append {
                epoch,
                prev,
                entries,
                lac,
                config,
            } => rules.append(meta.as_ref(), self, epoch, prev, entries, lac, config),
            Request::Seal { epoch, at, config } => {
                rules.seal(meta.as_ref(), self, epoch, at, config)
            }
            Request::Install {
                epoch,
                base,
                config,
            } => rules.install(meta.as_ref(), epoch, base, config),
            Request::DeleteTo { epoch, to } => rules.delete_to(meta.as_ref(), self, epoch, to),
            Request::Confirm {
                epoch,
                prev,
                lac,
                config,
                lease_ms: _,
            } => rules.append(meta.as_ref(), self, epoch, prev, Vec::new(), lac, config),
        };
        let reply = self.apply(decision);
        let summary = LogMeta::summary_of(self.meta.as_ref(), &reply);
        match reply {
            Reply::Promised => {
                let (tail, tail_complete) = take_bounded(
                    self.entries
                        .range(summary.lac.saturating_add(1)..)
                        .map(|(_, e)| e),
                    limits.max_tail_entries,
                    limits.max_bytes,
                );
                Response::Promised {
                    summary,
                    tail,
                    tail_complete,
                }
            }
            Reply::Appended if confirm => Response::Confirmed {
                summary,
                lease_ms: 0,
            },
            Reply::Appended => Response::Appended { summary },
            Reply::Sealed => Response::Sealed { summary },
            Reply::Installed => Response::Installed { summary },
            Reply::Deleted => Response::Deleted { summary },
            Reply::Fenced(promise) => Response::Fenced { promise },
            Reply::Mismatch => Response::Mismatch { summary },
            Reply::Invalid(reason) => Response::Invalid { reason },
            Reply::Leased(remaining) => Response::Leased {
                remaining_ms: remaining_ms(remaining),
            },
            Reply::Confirmed(lease) => Response::Confirmed {
                summary,
                lease_ms: lease_ms(lease),
            },
        }
    }

    /// Answers one request as [`MemoryLog::handle`] does, under the replica's read leases:
    /// a prepare waits for a running lease, and a confirmation it takes grants one.
    pub fn handle_leased(
        &mut self,
        rules: &Rules,
        request: Request<P>,
        limits: ReadLimits,
        leases: &mut Leases,
        log: &str,
        now: Instant,
    ) -> Response<P> {
        if let Request::Prepare { epoch } = &request
            && let Some(remaining) = rules.held_off(leases, log, self.meta.as_ref(), *epoch, now)
        {
            return Response::Leased {
                remaining_ms: remaining_ms(remaining),
            };
        }
        let grant = match &request {
            Request::Confirm {
                epoch, lease_ms, ..
            } => Some((*epoch, Duration::from_millis(*lease_ms))),
            _ => None,
        };
        let mut response = self.handle(rules, request, limits);
        if let (Some((epoch, lease)), Response::Confirmed { lease_ms, .. }) = (grant, &mut response)
        {
            *lease_ms = self::lease_ms(leases.grant(log, epoch, lease, now));
        }
        response
    }
}

/// A lease granted, in whole milliseconds, rounded down (a replica never says it granted
/// more than it did).
pub fn lease_ms(lease: Duration) -> u64 {
    u64::try_from(lease.as_millis()).unwrap_or(u64::MAX)
}

/// A wait in whole milliseconds, rounded up (a replica never says "0 ms more" of a wait).
pub fn remaining_ms(remaining: Duration) -> u64 {
    let ms = remaining.as_micros().div_ceil(1_000);
    u64::try_from(ms).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::configuration::{Configuration, ReplicaId};
    use crate::epoch::Position;
    use tessera_cluster::Address;

    const LIMITS: ReadLimits = ReadLimits {
        max_tail_entries: 1_000,
        max_bytes: 1024 * 1024,
    };

    /// A log holding entries 1 to 5 of one writer.
    fn log_of_five() -> MemoryLog<u64> {
        let rules = Rules::default();
        let epoch = Epoch {
            counter: 1,
            writer: 7,
        };
        let config = Configuration::new(
            1,
            vec![ReplicaId::new(Address::new("10.0.0.1", 25521), 1007)],
        );
        let mut log = MemoryLog::default();
        log.handle(&rules, Request::Prepare { epoch }, LIMITS);
        let entries = (1..=5).map(|seq| Entry {
            seq,
            epoch,
            payload: seq,
        });
        let appended = log.handle(
            &rules,
            Request::Append {
                epoch,
                prev: Position::new(0, epoch),
                entries: entries.collect(),
                lac: 0,
                config: Some(config),
            },
            LIMITS,
        );
        assert!(
            matches!(appended, Response::Appended { .. }),
            "{appended:?}"
        );
        log
    }

    /// Found by the fuzz target `replica_requests` (input kept in
    /// `fuzz/regressions/replica_requests/read-from-above-to`): a read whose start is above
    /// its end panicked in `BTreeMap::range` once the log held entries.
    #[test]
    fn a_read_whose_start_is_above_its_end_answers_no_entries() {
        let mut log = log_of_five();
        let read = Request::Read {
            from: 5,
            to: 1,
            max_entries: 10,
            max_bytes: 100,
        };
        match log.handle(&Rules::default(), read, LIMITS) {
            Response::Entries { entries, summary } => {
                assert!(entries.is_empty());
                assert_eq!(summary.last.seq, 5);
            }
            other => panic!("a read answered {other:?}"),
        }
        let read_all = Request::Read {
            from: 1,
            to: 5,
            max_entries: 10,
            max_bytes: 100,
        };
        let Response::Entries { entries, .. } = log.handle(&Rules::default(), read_all, LIMITS)
        else {
            panic!("a read answered something else");
        };
        assert_eq!(entries.len(), 5, "the log the test reads holds entries");
    }
}
