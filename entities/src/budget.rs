//! A limit on active entities shared by several hosts: a node's cap over all its entity
//! types, so that adding a type does not add another `active_entity_limit` worth of memory.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Active entities of every host given this budget (in
/// [`EntityConfig::node_budget`](crate::EntityConfig::node_budget)), against one limit. Cheap to clone; clones share the
/// count.
///
/// A host partition about to start an entity while the budget is at its limit first
/// passivates its own least recently used entity, as it does at its share of
/// `active_entity_limit`; one that has no active entity starts it anyway, so a type that
/// has none running is never locked out by the others. Hence the invariant: the active
/// entities of all the hosts sharing a budget number at most `limit` plus their partitions
/// (16 per host by default). A partition evicts only its own entities (no lock spans hosts
/// or partitions), so a type that fills the budget keeps its entities until they are used
/// less recently than its own new ones or passivate when idle; the others then work within
/// one entity per partition.
#[derive(Clone)]
pub struct ActiveEntityBudget {
    inner: Arc<Budget>,
}

struct Budget {
    limit: usize,
    active: AtomicUsize,
}

impl ActiveEntityBudget {
    /// A budget of `limit` active entities (at least 1).
    pub fn new(limit: usize) -> Result<Self, String> {
        if limit == 0 {
            return Err("node active-entity limit = 0: must be at least 1".to_string());
        }
        Ok(Self {
            inner: Arc::new(Budget {
                limit,
                active: AtomicUsize::new(0),
            }),
        })
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.inner.limit
    }

    /// Entities taking commands now, over every host sharing the budget.
    pub fn active(&self) -> usize {
        self.inner.active.load(Ordering::Relaxed)
    }

    /// Whether starting one more entity would go beyond the limit.
    pub(crate) fn is_full(&self) -> bool {
        self.active() >= self.inner.limit
    }

    pub(crate) fn started(&self) {
        self.inner.active.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn stopped(&self) {
        self.inner.active.fetch_sub(1, Ordering::Relaxed);
    }
}

impl PartialEq for ActiveEntityBudget {
    /// Two budgets are equal when they are the same budget (clones), not when their numbers
    /// happen to agree.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for ActiveEntityBudget {}

impl fmt::Debug for ActiveEntityBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActiveEntityBudget")
            .field("limit", &self.limit())
            .field("active", &self.active())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_count_and_a_zero_limit_is_refused() {
        let budget = ActiveEntityBudget::new(2).unwrap();
        let clone = budget.clone();
        budget.started();
        clone.started();
        assert!(budget.is_full());
        assert_eq!(clone.active(), 2);
        clone.stopped();
        assert!(!budget.is_full());
        assert_eq!(budget, clone);
        assert_ne!(budget, ActiveEntityBudget::new(2).unwrap());
        assert!(
            ActiveEntityBudget::new(0)
                .unwrap_err()
                .contains("at least 1")
        );
    }
}
