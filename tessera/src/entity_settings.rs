//! The settings of one entity type (Akka's `Entity` settings and the per-type part of
//! `ClusterShardingSettings`): its role, remember-entities, passivation, snapshots, shards,
//! rebalancing, handoff and asks.
//!
//! Every field is optional: a type takes what it does not set from the node's keys of the same
//! name. Where a value comes from, strongest first: the type's section of the configuration
//! (`[entity.<type>]` in the file, `TESSERA_ENTITY_<TYPE>_<KEY>`, `--entity <type>.<key>=<value>`),
//! then the code that registered the type, then the node-wide key, then its default. So code
//! states what its type needs, and an operator can still change it for one type.

use crate::config::{ConfigError, ConfigLayer, NodeConfig, RememberEntities, StateStoreMode};
use std::time::Duration;

/// The keys an entity type's section may set: the node-wide keys of the same names are their
/// defaults.
pub const ENTITY_KEYS: [&str; 13] = [
    "sharding_role",
    "remember_entities",
    "state_store_mode",
    "passivate_after",
    "active_entity_limit",
    "snapshot_every",
    "entity_ask_timeout",
    "number_of_shards",
    "rebalance_interval",
    "rebalance_absolute_limit",
    "rebalance_relative_limit",
    "handoff_timeout",
    "shard_buffer_size",
];

/// One entity type's settings; `None` takes the node's key of the same name. See the module
/// documentation for the order in which sources win.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EntitySettings {
    /// Only members with this role host the type and run its coordinator; the others route
    /// (proxy-only). An empty role means every member hosts the type (to lift, for one type,
    /// a role the node-wide key or the code set).
    pub sharding_role: Option<String>,
    /// Whether and where the type's shards remember their entities, to restart them wherever
    /// the shard lands (automatic passivation is off then, as in Akka).
    pub remember_entities: Option<RememberEntities>,
    /// Where the type's shard coordinator keeps its state.
    pub state_store_mode: Option<StateStoreMode>,
    /// Idle entities are passivated after this long (zero: never).
    pub passivate_after: Option<Duration>,
    /// Live entities of the type on a node; beyond it the least recently used are passivated
    /// (0: no limit).
    pub active_entity_limit: Option<u64>,
    /// A snapshot every this many events (0: never).
    pub snapshot_every: Option<u64>,
    /// How long an ask waits for the entity's reply.
    pub entity_ask_timeout: Option<Duration>,
    /// Shards of the type: fixed for the cluster's life, the same on every node.
    pub number_of_shards: Option<u32>,
    /// How often the coordinator considers a rebalance round.
    pub rebalance_interval: Option<Duration>,
    /// Most shards moved in one rebalance round.
    pub rebalance_absolute_limit: Option<u32>,
    /// Most shards moved in one rebalance round, as a fraction of the shards, in (0, 1].
    pub rebalance_relative_limit: Option<f64>,
    /// A handoff not finished within this long is given up.
    pub handoff_timeout: Option<Duration>,
    /// Messages a region buffers for shards whose home it does not know yet.
    pub shard_buffer_size: Option<u32>,
}

impl EntitySettings {
    /// Nothing set: every value from the node's keys.
    pub fn new() -> Self {
        Self::default()
    }

    /// Hosts the type only on members with `role`.
    pub fn role(mut self, role: impl Into<String>) -> Self {
        self.sharding_role = Some(role.into());
        self
    }

    /// Remembers the type's entities in `store`.
    pub fn remember_entities(mut self, store: RememberEntities) -> Self {
        self.remember_entities = Some(store);
        self
    }

    /// Keeps the coordinator's state in `mode`.
    pub fn state_store_mode(mut self, mode: StateStoreMode) -> Self {
        self.state_store_mode = Some(mode);
        self
    }

    /// Passivates entities idle for `idle` (zero: never).
    pub fn passivate_after(mut self, idle: Duration) -> Self {
        self.passivate_after = Some(idle);
        self
    }

    /// At most `limit` live entities of the type per node (0: no limit).
    pub fn active_entity_limit(mut self, limit: u64) -> Self {
        self.active_entity_limit = Some(limit);
        self
    }

    /// A snapshot every `events` events (0: never).
    pub fn snapshot_every(mut self, events: u64) -> Self {
        self.snapshot_every = Some(events);
        self
    }

    /// Asks wait `timeout` for the entity's reply.
    pub fn ask_timeout(mut self, timeout: Duration) -> Self {
        self.entity_ask_timeout = Some(timeout);
        self
    }

    /// `shards` shards (the same on every node, for the cluster's life).
    pub fn number_of_shards(mut self, shards: u32) -> Self {
        self.number_of_shards = Some(shards);
        self
    }

    /// A rebalance round considered every `interval`.
    pub fn rebalance_interval(mut self, interval: Duration) -> Self {
        self.rebalance_interval = Some(interval);
        self
    }

    /// Handoffs given up after `timeout`.
    pub fn handoff_timeout(mut self, timeout: Duration) -> Self {
        self.handoff_timeout = Some(timeout);
        self
    }

    /// Regions buffer at most `messages` for shards whose home they do not know yet.
    pub fn shard_buffer_size(mut self, messages: u32) -> Self {
        self.shard_buffer_size = Some(messages);
        self
    }

    /// Each value set in `over` replaces this one's.
    pub fn overridden_by(self, over: &EntitySettings) -> EntitySettings {
        EntitySettings {
            sharding_role: over.sharding_role.clone().or(self.sharding_role),
            remember_entities: over.remember_entities.or(self.remember_entities),
            state_store_mode: over.state_store_mode.or(self.state_store_mode),
            passivate_after: over.passivate_after.or(self.passivate_after),
            active_entity_limit: over.active_entity_limit.or(self.active_entity_limit),
            snapshot_every: over.snapshot_every.or(self.snapshot_every),
            entity_ask_timeout: over.entity_ask_timeout.or(self.entity_ask_timeout),
            number_of_shards: over.number_of_shards.or(self.number_of_shards),
            rebalance_interval: over.rebalance_interval.or(self.rebalance_interval),
            rebalance_absolute_limit: over
                .rebalance_absolute_limit
                .or(self.rebalance_absolute_limit),
            rebalance_relative_limit: over
                .rebalance_relative_limit
                .or(self.rebalance_relative_limit),
            handoff_timeout: over.handoff_timeout.or(self.handoff_timeout),
            shard_buffer_size: over.shard_buffer_size.or(self.shard_buffer_size),
        }
    }

    /// The settings a type's section sets, checked by the same rules as the node-wide keys
    /// (the section is read as a layer of its own keys over the defaults). A key the section
    /// may not set is refused, naming the keys it may.
    pub fn from_section(section: &ConfigLayer) -> Result<EntitySettings, ConfigError> {
        let set = section.keys_set();
        if let Some(key) = set.iter().find(|key| !ENTITY_KEYS.contains(&key.as_str())) {
            return Err(ConfigError::NotAnEntityKey {
                key: key.clone(),
                allowed: ENTITY_KEYS.join(", "),
            });
        }
        let parsed = NodeConfig::from_layer(section.clone())?;
        let is_set = |key: &str| set.iter().any(|k| k == key);
        Ok(EntitySettings {
            // An empty role is kept as set: it lifts the role of the code or the node.
            sharding_role: is_set("sharding_role")
                .then(|| parsed.sharding_role.clone().unwrap_or_default()),
            remember_entities: is_set("remember_entities").then_some(parsed.remember_entities),
            state_store_mode: is_set("state_store_mode").then_some(parsed.state_store_mode),
            passivate_after: is_set("passivate_after").then_some(parsed.passivate_after),
            active_entity_limit: is_set("active_entity_limit")
                .then_some(parsed.active_entity_limit),
            snapshot_every: is_set("snapshot_every").then_some(parsed.snapshot_every),
            entity_ask_timeout: is_set("entity_ask_timeout").then_some(parsed.entity_ask_timeout),
            number_of_shards: is_set("number_of_shards").then_some(parsed.number_of_shards),
            rebalance_interval: is_set("rebalance_interval").then_some(parsed.rebalance_interval),
            rebalance_absolute_limit: is_set("rebalance_absolute_limit")
                .then_some(parsed.rebalance_absolute_limit),
            rebalance_relative_limit: is_set("rebalance_relative_limit")
                .then_some(parsed.rebalance_relative_limit),
            handoff_timeout: is_set("handoff_timeout").then_some(parsed.handoff_timeout),
            shard_buffer_size: is_set("shard_buffer_size").then_some(parsed.shard_buffer_size),
        })
    }

    /// The values set, as the text of their keys (for checking code's settings by the rules
    /// of the configuration).
    pub fn to_section(&self) -> ConfigLayer {
        let duration = |d: &Duration| humantime::format_duration(*d).to_string();
        let entries: [(&str, Option<String>); 13] = [
            ("sharding_role", self.sharding_role.clone()),
            (
                "remember_entities",
                self.remember_entities.map(|r| r.to_string()),
            ),
            (
                "state_store_mode",
                self.state_store_mode.map(|m| m.to_string()),
            ),
            (
                "passivate_after",
                self.passivate_after.as_ref().map(duration),
            ),
            (
                "active_entity_limit",
                self.active_entity_limit.map(|n| n.to_string()),
            ),
            ("snapshot_every", self.snapshot_every.map(|n| n.to_string())),
            (
                "entity_ask_timeout",
                self.entity_ask_timeout.as_ref().map(duration),
            ),
            (
                "number_of_shards",
                self.number_of_shards.map(|n| n.to_string()),
            ),
            (
                "rebalance_interval",
                self.rebalance_interval.as_ref().map(duration),
            ),
            (
                "rebalance_absolute_limit",
                self.rebalance_absolute_limit.map(|n| n.to_string()),
            ),
            (
                "rebalance_relative_limit",
                self.rebalance_relative_limit.map(|n| n.to_string()),
            ),
            (
                "handoff_timeout",
                self.handoff_timeout.as_ref().map(duration),
            ),
            (
                "shard_buffer_size",
                self.shard_buffer_size.map(|n| n.to_string()),
            ),
        ];
        let mut layer = ConfigLayer::default();
        for (key, value) in entries {
            if let Some(value) = value {
                layer.set(key, value);
            }
        }
        layer
    }

    /// The settings checked by the configuration's rules (a zero where one is not allowed, a
    /// fraction out of range...); the error names the type and the key.
    pub fn validated(&self, type_name: &str) -> Result<EntitySettings, ConfigError> {
        EntitySettings::from_section(&self.to_section()).map_err(|source| {
            ConfigError::EntitySection {
                type_name: type_name.to_string(),
                source: Box::new(source),
            }
        })
    }
}

/// One entity type's settings with nothing left to the node: what the node starts the type
/// with.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedEntitySettings {
    pub sharding_role: Option<String>,
    pub remember_entities: RememberEntities,
    pub state_store_mode: StateStoreMode,
    pub passivate_after: Duration,
    pub active_entity_limit: u64,
    pub snapshot_every: u64,
    pub entity_ask_timeout: Duration,
    pub number_of_shards: u32,
    pub rebalance_interval: Duration,
    pub rebalance_absolute_limit: u32,
    pub rebalance_relative_limit: f64,
    pub handoff_timeout: Duration,
    pub shard_buffer_size: u32,
}

impl ResolvedEntitySettings {
    /// `settings`, with what they leave unset taken from the node's `config`.
    pub fn resolve(settings: &EntitySettings, config: &NodeConfig) -> Self {
        ResolvedEntitySettings {
            sharding_role: match &settings.sharding_role {
                Some(role) if role.is_empty() => None,
                Some(role) => Some(role.clone()),
                None => config.sharding_role.clone(),
            },
            remember_entities: settings
                .remember_entities
                .unwrap_or(config.remember_entities),
            state_store_mode: settings.state_store_mode.unwrap_or(config.state_store_mode),
            passivate_after: settings.passivate_after.unwrap_or(config.passivate_after),
            active_entity_limit: settings
                .active_entity_limit
                .unwrap_or(config.active_entity_limit),
            snapshot_every: settings.snapshot_every.unwrap_or(config.snapshot_every),
            entity_ask_timeout: settings
                .entity_ask_timeout
                .unwrap_or(config.entity_ask_timeout),
            number_of_shards: settings.number_of_shards.unwrap_or(config.number_of_shards),
            rebalance_interval: settings
                .rebalance_interval
                .unwrap_or(config.rebalance_interval),
            rebalance_absolute_limit: settings
                .rebalance_absolute_limit
                .unwrap_or(config.rebalance_absolute_limit),
            rebalance_relative_limit: settings
                .rebalance_relative_limit
                .unwrap_or(config.rebalance_relative_limit),
            handoff_timeout: settings.handoff_timeout.unwrap_or(config.handoff_timeout),
            shard_buffer_size: settings
                .shard_buffer_size
                .unwrap_or(config.shard_buffer_size),
        }
    }

    /// Whether the type's shards remember their entities.
    pub fn remembers(&self) -> bool {
        self.remember_entities != RememberEntities::Off
    }

    /// `active_entity_limit` as the host takes it: `None` for 0 (no limit).
    pub fn active_entity_limit(&self) -> Option<usize> {
        crate::config::entity_limit(self.active_entity_limit)
    }
}

/// The name an entity type's section goes by: lower case, with `-` and `.` as `_`, so that
/// `[entity.shop-cart]` in a file and `TESSERA_ENTITY_SHOP_CART_...` in the environment name
/// the same section.
pub fn section_name(type_name: &str) -> String {
    type_name
        .chars()
        .map(|c| match c {
            '-' | '.' => '_',
            c => c.to_ascii_lowercase(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_sets_only_its_keys_and_checks_them_as_the_node_does() {
        let mut section = ConfigLayer::default();
        section.set("passivate_after", "30s".into());
        section.set("number_of_shards", "64".into());
        let settings = EntitySettings::from_section(&section).unwrap();
        assert_eq!(
            settings,
            EntitySettings::new()
                .passivate_after(Duration::from_secs(30))
                .number_of_shards(64)
        );

        let mut bad = ConfigLayer::default();
        bad.set("number_of_shards", "0".into());
        let error = EntitySettings::from_section(&bad).unwrap_err().to_string();
        assert!(error.contains("number_of_shards"), "{error}");

        let mut node_key = ConfigLayer::default();
        node_key.set("host", "127.0.0.2".into());
        let error = EntitySettings::from_section(&node_key)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("host") && error.contains("passivate_after"),
            "{error}"
        );
    }

    #[test]
    fn code_settings_are_checked_by_the_same_rules() {
        let settings = EntitySettings::new()
            .role("backend")
            .snapshot_every(10)
            .ask_timeout(Duration::from_millis(1500));
        assert_eq!(settings.validated("order").unwrap(), settings);
        let error = EntitySettings::new()
            .number_of_shards(0)
            .validated("order")
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("entity type order: "), "{error}");
        assert!(error.contains("number_of_shards"), "{error}");
    }

    #[test]
    fn the_section_wins_over_code_and_code_over_the_node() {
        let node = NodeConfig {
            passivate_after: Duration::from_secs(120),
            number_of_shards: 1000,
            snapshot_every: 100,
            ..NodeConfig::default()
        };
        let code = EntitySettings::new()
            .passivate_after(Duration::from_secs(600))
            .number_of_shards(64);
        let section = EntitySettings::new().passivate_after(Duration::from_secs(5));
        let resolved = ResolvedEntitySettings::resolve(&code.overridden_by(&section), &node);
        assert_eq!(resolved.passivate_after, Duration::from_secs(5));
        assert_eq!(resolved.number_of_shards, 64);
        assert_eq!(resolved.snapshot_every, 100);
    }

    #[test]
    fn an_empty_role_in_a_section_lifts_the_role_of_the_code_and_the_node() {
        let node = NodeConfig {
            sharding_role: Some("backend".into()),
            ..NodeConfig::default()
        };
        let mut section = ConfigLayer::default();
        section.set("sharding_role", String::new());
        let section = EntitySettings::from_section(&section).unwrap();
        let code = EntitySettings::new().role("workers");
        let resolved = ResolvedEntitySettings::resolve(&code.overridden_by(&section), &node);
        assert_eq!(resolved.sharding_role, None);
        let resolved = ResolvedEntitySettings::resolve(&EntitySettings::new(), &node);
        assert_eq!(resolved.sharding_role.as_deref(), Some("backend"));
    }

    #[test]
    fn section_names_ignore_case_and_punctuation() {
        assert_eq!(section_name("shop.cart-v2"), "shop_cart_v2");
        assert_eq!(section_name("ACCOUNT"), "account");
    }
}
