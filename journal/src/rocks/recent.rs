//! A bounded map that keeps what was used recently, for the names (persistence ids, tags) the
//! journal resolves to numbers again and again.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

/// Values by key, keeping those used recently: every key among the last `generation_len`
/// distinct keys used is kept, and at most twice that many are held. Two generations rather
/// than a least-recently-used list: a key used since the last turnover is kept, and when the
/// current generation is full the previous one is forgotten at once, so a working set larger
/// than the bound costs a lookup per forgotten key instead of emptying everything, and there
/// is no per-entry bookkeeping.
pub(crate) struct Recent<K, V> {
    current: HashMap<K, V>,
    /// The generation before; a key is looked for here only if `current` lacks it, so a
    /// value replaced in `current` is never read from here.
    previous: HashMap<K, V>,
    /// Keys per generation.
    generation_len: usize,
}

impl<K: Hash + Eq, V: Clone> Recent<K, V> {
    /// A map that keeps any `generation_len` keys used in a row (and holds at most twice as
    /// many).
    pub fn new(generation_len: usize) -> Self {
        Recent {
            current: HashMap::new(),
            previous: HashMap::new(),
            generation_len: generation_len.max(1),
        }
    }

    pub fn get<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Some(value) = self.current.get(key) {
            return Some(value.clone());
        }
        let (key, value) = self.previous.remove_entry(key)?;
        self.insert(key, value.clone());
        Some(value)
    }

    pub fn insert(&mut self, key: K, value: V) {
        if self.current.len() >= self.generation_len && !self.current.contains_key(&key) {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(key, value);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }
}

#[cfg(test)]
mod tests {
    use super::Recent;

    #[test]
    fn recent_values_keep_what_was_used_since_the_last_turnover_within_the_bound() {
        let mut names = Recent::new(2);
        names.insert("a".to_string(), 1);
        names.insert("b".to_string(), 2);
        // The generation is full: "c" starts the next one, "a" and "b" become the previous.
        names.insert("c".to_string(), 3);
        // Used again: back in the current generation.
        assert_eq!(names.get("a"), Some(1));
        // The current generation ("c", "a") is full: "d" turns it over, and "b", unused since
        // the last turnover, is forgotten.
        names.insert("d".to_string(), 4);
        assert_eq!(names.get("b"), None);
        assert_eq!(names.get("a"), Some(1));
        assert_eq!(names.get("c"), Some(3));
        assert_eq!(names.get("d"), Some(4));
        for i in 0..1_000 {
            names.insert(format!("n{i}"), i);
            assert!(names.len() <= 4, "{} names kept", names.len());
        }
    }

    #[test]
    fn a_replaced_value_is_the_one_read_whichever_generation_held_the_old_one() {
        let mut names = Recent::new(2);
        names.insert("a".to_string(), 1);
        names.insert("b".to_string(), 2);
        names.insert("c".to_string(), 3);
        // "a" is in the previous generation; its new value goes to the current one.
        names.insert("a".to_string(), 10);
        assert_eq!(names.get("a"), Some(10));
        names.insert("d".to_string(), 4);
        assert_eq!(names.get("a"), Some(10));
    }

    #[test]
    fn a_working_set_as_large_as_a_generation_is_looked_up_only_once() {
        let mut names = Recent::new(3);
        let mut misses = 0;
        for _ in 0..10 {
            for key in 0..3u64 {
                if names.get(&key).is_none() {
                    misses += 1;
                }
                // As the writer does: what it read or changed goes back in.
                names.insert(key, key);
            }
        }
        assert_eq!(misses, 3);
    }
}
