//! The fuzz targets of `fuzz/` in the normal suite, so that they cannot rot unnoticed: every
//! target's body runs over its seeds and over the crash inputs kept in
//! `fuzz/regressions/<target>/`; `fuzz/` has exactly one target per body, calling it; and the
//! committed seeds are what the generators make today. Fuzzing itself is `scripts/fuzz` (see
//! `fuzz/README.md`).
//!
//! `TESSERA_FUZZ_WRITE_SEEDS=1 cargo test --release --test fuzz_targets` writes the seeds
//! again (after a change of an encoding), into `fuzz/seeds/<target>/`.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use tessera_fuzzing::TARGETS;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The files of `dir`, sorted by name; none when it does not exist.
fn files_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_target_runs_over_its_seeds_and_kept_crash_inputs() {
    let mut regressions = 0;
    for target in TARGETS {
        for seed in (target.seeds)() {
            (target.body)(&seed);
        }
        let kept = fuzz_dir().join("regressions").join(target.name);
        for file in files_in(&kept) {
            let input = fs::read(&file).unwrap();
            // A panic names the target and the file that brought it back.
            eprintln!("{}: {}", target.name, file.display());
            (target.body)(&input);
            regressions += 1;
        }
    }
    eprintln!("{} targets, {regressions} kept crash inputs", TARGETS.len());
}

#[test]
fn the_committed_seeds_are_what_the_generators_make() {
    let write = std::env::var_os("TESSERA_FUZZ_WRITE_SEEDS").is_some();
    let mut stale = Vec::new();
    for target in TARGETS {
        let dir = fuzz_dir().join("seeds").join(target.name);
        let generated = (target.seeds)();
        assert!(!generated.is_empty(), "{} has no seeds", target.name);
        if write {
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            for (i, seed) in generated.iter().enumerate() {
                fs::write(dir.join(format!("seed-{i:03}")), seed).unwrap();
            }
            continue;
        }
        let committed: Vec<Vec<u8>> = files_in(&dir)
            .iter()
            .map(|f| fs::read(f).unwrap())
            .collect();
        if committed != generated {
            stale.push(target.name);
        }
    }
    assert!(
        stale.is_empty(),
        "the seeds of {stale:?} in fuzz/seeds/ are not what their generators make (an encoding \
         changed?); write them again with \
         TESSERA_FUZZ_WRITE_SEEDS=1 cargo test --release --test fuzz_targets"
    );
}

#[test]
fn fuzz_has_one_target_per_body_and_each_calls_its_own() {
    let registered: BTreeSet<&str> = TARGETS.iter().map(|t| t.name).collect();
    assert_eq!(registered.len(), TARGETS.len(), "a target is listed twice");
    let files: BTreeSet<String> = files_in(&fuzz_dir().join("fuzz_targets"))
        .iter()
        .filter_map(|f| f.file_stem()?.to_str().map(str::to_string))
        .collect();
    let files: BTreeSet<&str> = files.iter().map(String::as_str).collect();
    assert_eq!(
        files, registered,
        "fuzz/fuzz_targets/ and tessera_fuzzing::TARGETS differ"
    );
    let manifest = fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
    let readme = fs::read_to_string(fuzz_dir().join("README.md")).unwrap();
    for name in registered {
        let source =
            fs::read_to_string(fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"))).unwrap();
        assert!(
            source.contains(&format!("tessera_fuzzing::{name}(data)")),
            "fuzz/fuzz_targets/{name}.rs does not call tessera_fuzzing::{name}"
        );
        assert!(
            manifest.contains(&format!(
                "name = \"{name}\"\npath = \"fuzz_targets/{name}.rs\""
            )),
            "fuzz/Cargo.toml has no [[bin]] for {name}"
        );
        assert!(
            readme.contains(&format!("`{name}`")),
            "fuzz/README.md does not list {name}"
        );
    }
}
