//! The simulated reader of the acknowledged log ([`crate::committed_reader`]), run beside the
//! writers of a [`Scenario`](super::Scenario) as a projection would run it: on one node, asking
//! every member what it holds (a `Locate`, as the queries by slice scan a replica's logs),
//! reading from the replicas through the same faulty network, crashing with its node (and at
//! random), and starting again from an offset it saved earlier — usually its last, sometimes
//! an older one, since resuming from any offset it delivered must lose nothing.
//!
//! The checks (docs/src/design.md §5 "Reading the acknowledged logs"): every delivered entry
//! is the log's own at that sequence number (never one that was not acknowledged, or was
//! truncated); each incarnation delivers sequence numbers one after the other from the
//! offset it resumed at, each once; and once the faults are over it delivers the whole final
//! log, every acknowledged value included.

use super::{Answer, Fate, LOG_ID, Simulation, TICK};
use crate::committed_reader::{CommittedReader, Delivered, Reach, ReaderSabotage, ReaderSettings};
use crate::message::{Request, Response};
use crate::writer::{RequestId, Target};
use rand::Rng;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Ids of the reader's reads (below the replays' [`super::READ_IDS`]).
pub(super) const SLICE_IDS: u64 = 1 << 61;
/// Ids of its scans.
const SCAN_IDS: u64 = SLICE_IDS + (1 << 60);
/// How often it asks every member what it holds.
const SCAN_INTERVAL: Duration = Duration::from_millis(60);

/// One delivery, as the reader's consumer saw it.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub incarnation: u64,
    /// The offset this incarnation resumed at.
    pub resumed_at: u64,
    pub seq: u64,
    /// The value (`None`: entries deleted up to `seq` before they were read).
    pub value: Option<u64>,
}

pub(super) struct ReaderProc {
    pub node: usize,
    sabotage: ReaderSabotage,
    reader: Option<CommittedReader<u64>>,
    incarnation: u64,
    resumed_at: u64,
    restart_at: Option<Instant>,
    next_scan: Instant,
    next_scan_id: u64,
    /// Offsets saved so far, in order (what an at-least-once projection stores).
    saved: Vec<u64>,
    pub deliveries: Vec<Delivery>,
    /// Whether it had delivered the whole final log when the run ended.
    pub caught_up: Option<bool>,
}

impl ReaderProc {
    pub fn new(node: usize, sabotage: ReaderSabotage, now: Instant) -> Self {
        ReaderProc {
            node,
            sabotage,
            reader: None,
            incarnation: 0,
            resumed_at: 0,
            restart_at: Some(now),
            next_scan: now,
            next_scan_id: SCAN_IDS,
            saved: vec![0],
            deliveries: Vec::new(),
            caught_up: None,
        }
    }

    fn settings() -> ReaderSettings {
        ReaderSettings {
            max_entries_per_read: 5,
            max_bytes_per_read: 1 << 20,
            max_reads_in_flight: 4,
            request_timeout: Duration::from_millis(300),
            retry_interval: Duration::from_millis(50),
            max_undelivered: 1_000,
        }
    }
}

impl Simulation {
    /// The reader's process dies; it starts again a little later.
    pub(super) fn crash_projection(&mut self) {
        let after = Duration::from_millis(self.rng.random_range(50..400));
        let now = self.now;
        if let Some(p) = self.projection.as_mut()
            && p.reader.is_some()
        {
            p.reader = None;
            p.restart_at = Some(now + after);
        }
    }

    /// The reader's turn, every tick.
    pub(super) fn tick_projection(&mut self, faults_on: bool) {
        let Some(node) = self.projection.as_ref().map(|p| p.node) else {
            return;
        };
        if self.paused(node).is_some() {
            return;
        }
        if faults_on && self.rng.random_bool(0.003) {
            self.crash_projection();
        }
        let now = self.now;
        let older = self.rng.random_bool(0.2);
        let pick: f64 = self.rng.random();
        let save = self.rng.random_bool(0.2);
        let Some(p) = self.projection.as_mut() else {
            return;
        };
        if p.reader.is_none() {
            if p.restart_at.is_none_or(|at| at > now) {
                return;
            }
            // Resume from the last offset saved, or (to show that any delivered offset
            // will do) from an older one.
            let at = if older {
                p.saved[(pick * p.saved.len() as f64) as usize % p.saved.len()]
            } else {
                *p.saved.last().unwrap_or(&0)
            };
            p.incarnation += 1;
            p.resumed_at = at;
            p.restart_at = None;
            let first = SLICE_IDS + (p.incarnation << 40);
            // Its own node's replica first, as a node's query does.
            let mut reader = CommittedReader::new(ReaderProc::settings(), first)
                .sabotaged(p.sabotage)
                .preferring(self.nodes[p.node].address.clone());
            reader.follow(LOG_ID, at);
            p.reader = Some(reader);
            p.next_scan = now;
        }
        let incarnation = p.incarnation;
        let scan = p.next_scan <= now;
        if scan {
            p.next_scan = now + SCAN_INTERVAL;
        }
        let Some(reader) = p.reader.as_mut() else {
            return;
        };
        reader.tick(now);
        if save && let Some(offset) = reader.offset(LOG_ID) {
            p.saved.push(offset);
        }
        if scan {
            let members: Vec<usize> = self.members.iter().copied().collect();
            for member in members {
                let address = self.nodes[member].address.clone();
                let Some(p) = self.projection.as_mut() else {
                    return;
                };
                let id = p.next_scan_id;
                p.next_scan_id += 1;
                self.send_request(
                    node,
                    incarnation,
                    id,
                    Target::Address(address),
                    Request::Locate,
                );
            }
        }
        self.send_projection_reads();
    }

    fn send_projection_reads(&mut self) {
        let Some(p) = self.projection.as_mut() else {
            return;
        };
        let (node, incarnation) = (p.node, p.incarnation);
        let Some(reader) = p.reader.as_mut() else {
            return;
        };
        for read in reader.take_requests() {
            self.send_request(
                node,
                incarnation,
                read.id,
                Target::Address(read.to),
                read.request,
            );
        }
    }

    /// An answer to the reader (a scan's or a read's).
    pub(super) fn projection_answer(
        &mut self,
        from: usize,
        incarnation: u64,
        id: RequestId,
        answer: Answer,
    ) {
        let now = self.now;
        let address = self.nodes[from].address.clone();
        let Some(p) = self.projection.as_mut() else {
            return;
        };
        if p.incarnation != incarnation {
            return;
        }
        let Some(reader) = p.reader.as_mut() else {
            return;
        };
        if id >= SCAN_IDS {
            if let Answer::Response(Response::Located {
                summary: Some(summary),
                ..
            }) = answer
            {
                reader.reported(LOG_ID, &address, Reach::of(&summary));
            }
        } else {
            match answer {
                Answer::Response(response) => reader.on_response(id, response, now),
                Answer::WrongStorage => reader.on_failure(id, now),
            }
            reader.pump(now);
        }
        for delivered in reader.take_delivered() {
            let (seq, value) = match delivered {
                Delivered::Entry { entry, .. } => (entry.seq, Some(entry.payload)),
                Delivered::Deleted { to, .. } => (to, None),
            };
            p.deliveries.push(Delivery {
                incarnation: p.incarnation,
                resumed_at: p.resumed_at,
                seq,
                value,
            });
        }
        self.send_projection_reads();
    }

    /// After the audit: the reader runs on, restarted if it is down, until it delivered the
    /// final log or 10 s passed.
    pub(super) fn finish_projection(&mut self) {
        let Some(last) = self.final_log.as_ref().map(|l| l.last().map_or(0, |e| e.0)) else {
            return;
        };
        let Some(p) = self.projection.as_mut() else {
            return;
        };
        p.restart_at = Some(self.now);
        let deadline = self.now + Duration::from_secs(10);
        let mut caught_up = false;
        while self.now < deadline {
            let next = self.now + TICK;
            self.run_until(next, false);
            self.tick_projection(false);
            let offset = self
                .projection
                .as_ref()
                .and_then(|p| p.reader.as_ref())
                .and_then(|r| r.offset(LOG_ID));
            if offset.is_some_and(|o| o >= last.max(self.final_base)) {
                caught_up = true;
                break;
            }
        }
        if let Some(p) = self.projection.as_mut() {
            p.caught_up = Some(caught_up);
        }
    }

    /// The reader's checks (see the module).
    pub(super) fn check_projection(&self) -> Vec<String> {
        let Some(p) = &self.projection else {
            return Vec::new();
        };
        let mut found = Vec::new();
        let final_log: BTreeMap<u64, u64> = self
            .final_log
            .as_ref()
            .map(|l| l.iter().copied().collect())
            .unwrap_or_default();
        // Values seen at each seq by any replay (deleted entries are known only so).
        let mut seen: BTreeMap<u64, u64> = BTreeMap::new();
        for replay in &self.replays {
            seen.extend(replay.entries.iter().copied());
        }
        seen.extend(final_log.iter().map(|(s, v)| (*s, *v)));
        let mut expected_next: Option<(u64, u64)> = None;
        let mut covered: BTreeMap<u64, ()> = BTreeMap::new();
        for d in &p.deliveries {
            let next = match expected_next {
                Some((incarnation, next)) if incarnation == d.incarnation => next,
                _ => d.resumed_at + 1,
            };
            match d.value {
                Some(value) => {
                    if d.seq != next {
                        found.push(format!(
                            "the reader (incarnation {}) delivered seq {} where {next} was next",
                            d.incarnation, d.seq
                        ));
                    }
                    if let Some(Fate::NotApplied) = self.writes.get(&value).map(|w| &w.fate) {
                        found.push(format!(
                            "the reader delivered value {value} at seq {}, whose write was not \
                             applied",
                            d.seq
                        ));
                    }
                    match seen.get(&d.seq) {
                        Some(&v) if v == value => {}
                        Some(&v) => found.push(format!(
                            "the reader delivered value {value} at seq {}, where the log holds \
                             {v} (an entry not acknowledged, later truncated)",
                            d.seq
                        )),
                        None if d.seq > self.final_base => found.push(format!(
                            "the reader delivered value {value} at seq {}, beyond the final log",
                            d.seq
                        )),
                        None => {
                            // Deleted before any replay saw it: it must be the value written
                            // at that seq.
                            if self.writes.get(&value).map(|w| w.seq) != Some(d.seq) {
                                found.push(format!(
                                    "the reader delivered value {value} at seq {}, which was \
                                     written at {:?}",
                                    d.seq,
                                    self.writes.get(&value).map(|w| w.seq)
                                ));
                            }
                        }
                    }
                    covered.insert(d.seq, ());
                }
                None => {
                    if d.seq > self.deleted_up_to {
                        found.push(format!(
                            "the reader passed seqs {next}..={} as deleted, but no delete went \
                             beyond {}",
                            d.seq, self.deleted_up_to
                        ));
                    }
                    for seq in next..=d.seq {
                        covered.insert(seq, ());
                    }
                }
            }
            expected_next = Some((d.incarnation, d.seq.max(next - 1) + 1));
        }
        if p.caught_up == Some(false) {
            found.push(format!(
                "10 s after the audit the reader had not delivered the final log (offset {:?}, \
                 log ends at {:?})",
                p.reader.as_ref().and_then(|r| r.offset(LOG_ID)),
                self.final_log.as_ref().and_then(|l| l.last())
            ));
        }
        for (&seq, value) in &final_log {
            if !covered.contains_key(&seq) {
                found.push(format!(
                    "value {value} at seq {seq} of the final log was never delivered"
                ));
                break;
            }
        }
        for (value, write) in &self.writes {
            if let Fate::Acknowledged(_) = write.fate
                && write.seq > self.final_base
                && !covered.contains_key(&write.seq)
            {
                found.push(format!(
                    "acknowledged value {value} (seq {}) was never delivered",
                    write.seq
                ));
                break;
            }
        }
        found
    }
}

impl Simulation {
    /// Whether `id` is one of the reader's.
    pub(super) fn is_projection_request(id: RequestId) -> bool {
        (SLICE_IDS..super::READ_IDS).contains(&id)
    }

    /// The reader's deliveries (for the simulation's tests).
    pub fn projection_deliveries(&self) -> &[Delivery] {
        self.projection
            .as_ref()
            .map_or(&[], |p| p.deliveries.as_slice())
    }

    /// Starts the reader on a node of the cluster, if the scenario has one.
    pub(super) fn place_projection(&mut self) {
        if let Some(sabotage) = self.scenario.committed_reader {
            let node = self.rng.random_range(0..self.scenario.nodes);
            self.projection = Some(ReaderProc::new(node, sabotage, self.now));
        }
    }
}
