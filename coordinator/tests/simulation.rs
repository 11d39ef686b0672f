//! The sharding simulation over many seeds per scenario (`TESSERA_SIM_SEEDS` for more).

use tessera_coordinator::sim::{self, Sabotage, SimConfig, SimOutcome};

fn seeds() -> u64 {
    std::env::var("TESSERA_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000)
}

fn run_all(name: &str, config: SimConfig) -> Vec<SimOutcome> {
    let mut outcomes = Vec::new();
    for seed in 0..seeds() {
        let outcome = sim::run(config.clone(), seed);
        assert!(
            outcome.violations.is_empty(),
            "{name}, seed {seed}: {:#?}",
            outcome.violations
        );
        outcomes.push(outcome);
    }
    outcomes
}

fn total(outcomes: &[SimOutcome], f: impl Fn(&SimOutcome) -> u64) -> u64 {
    outcomes.iter().map(f).sum()
}

#[test]
fn joins_and_graceful_leaves_lose_and_reorder_nothing() {
    let outcomes = run_all(
        "joins and leaves",
        SimConfig {
            joins: 2,
            leaves: 1,
            crashes: 0,
            ..SimConfig::default()
        },
    );
    for (seed, outcome) in outcomes.iter().enumerate() {
        assert_eq!(
            outcome.lost_to_crashes + outcome.lost_to_cuts,
            0,
            "seed {seed} lost messages without a crash or a cut"
        );
    }
    assert!(total(&outcomes, |o| o.handoffs_completed) > 0);
    assert_eq!(total(&outcomes, |o| o.refused), 0);
}

#[test]
fn crashes_lose_only_what_was_on_the_crashed_node() {
    let outcomes = run_all(
        "crashes",
        SimConfig {
            joins: 1,
            leaves: 0,
            crashes: 2,
            initial_nodes: 4,
            ..SimConfig::default()
        },
    );
    assert!(total(&outcomes, |o| o.coordinator_starts) > seeds());
}

#[test]
fn everything_at_once_with_a_proxy_cut_links_and_failing_writes() {
    run_all(
        "everything",
        SimConfig {
            initial_nodes: 4,
            joins: 2,
            leaves: 1,
            crashes: 1,
            partitions: 2,
            proxy: true,
            write_failure_probability: 0.1,
            ..SimConfig::default()
        },
    );
}

fn caught(config: SimConfig) -> usize {
    (0..200)
        .filter(|seed| !sim::run(config.clone(), *seed).violations.is_empty())
        .count()
}

#[test]
fn acknowledging_a_handoff_past_the_marker_is_caught() {
    let config = SimConfig {
        joins: 2,
        leaves: 1,
        crashes: 0,
        callers_per_node: 4,
        sabotage: Sabotage {
            acks_bypass_markers: true,
            ..Sabotage::default()
        },
        ..SimConfig::default()
    };
    assert!(caught(config) > 0);
}

#[test]
fn reporting_a_shard_stopped_before_it_stopped_is_caught() {
    let config = SimConfig {
        joins: 2,
        leaves: 1,
        crashes: 0,
        sabotage: Sabotage {
            stopped_before_stopping: true,
            ..Sabotage::default()
        },
        ..SimConfig::default()
    };
    assert!(caught(config) > 0);
}

/// `TESSERA_SIM_TRACE=scenario:seed` prints one run's events (scenarios: crashes, everything).
#[test]
fn trace_one_seed() {
    let Ok(spec) = std::env::var("TESSERA_SIM_TRACE") else {
        return;
    };
    let (name, seed) = spec.split_once(':').expect("scenario:seed");
    let mut config = match name {
        "joins" => SimConfig {
            joins: 2,
            leaves: 1,
            crashes: 0,
            ..SimConfig::default()
        },
        "crashes" => SimConfig {
            joins: 1,
            leaves: 0,
            crashes: 2,
            initial_nodes: 4,
            ..SimConfig::default()
        },
        _ => SimConfig {
            initial_nodes: 4,
            joins: 2,
            leaves: 1,
            crashes: 1,
            partitions: 2,
            proxy: true,
            write_failure_probability: 0.1,
            ..SimConfig::default()
        },
    };
    config.trace = true;
    let outcome = sim::run(config, seed.parse().expect("seed"));
    eprintln!("{:#?}", outcome.violations);
}
