//! The README's library snippets are compiled code: every ```rust block of its "Library API"
//! section is a region of a program under `examples/` (between `// README: begin <name>` and
//! `// README: end <name>`, dedented), and every such region appears in the README. The
//! examples are compiled by `cargo test` (and run by hand); this test ties the README to them,
//! so that a snippet can never drift from code that builds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const BEGIN: &str = "// README: begin ";
const END: &str = "// README: end ";
const SECTION: &str = "## Library API";

/// A marked region of an example.
struct Region {
    /// `examples/<file>.rs:<line of the begin marker>`, for messages.
    origin: String,
    /// The region's lines, dedented to their smallest indentation, joined with `\n`.
    text: String,
}

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every region of every `examples/*.rs`, by name. Panics on a malformed marker: an end
/// without its begin, a begin without its end, nested or duplicate names, an empty region.
fn example_regions() -> BTreeMap<String, Region> {
    let dir = workspace_root().join("examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry of examples/").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .collect();
    files.sort();
    let mut regions = BTreeMap::new();
    for path in &files {
        let source = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        for (name, region) in regions_of(path, &source) {
            if let Some(earlier) = regions.insert(name.clone(), region) {
                panic!(
                    "region {name:?} is marked twice (also at {})",
                    earlier.origin
                );
            }
        }
    }
    regions
}

fn regions_of(path: &Path, source: &str) -> Vec<(String, Region)> {
    let file = format!(
        "examples/{}",
        path.file_name().unwrap_or_default().to_string_lossy()
    );
    let mut regions = Vec::new();
    let mut open: Option<(String, usize, Vec<&str>)> = None;
    for (index, line) in source.lines().enumerate() {
        let number = index + 1;
        let marker = line.trim();
        if let Some(name) = marker.strip_prefix(BEGIN) {
            if let Some((open_name, open_at, _)) = &open {
                panic!(
                    "{file}:{number}: region {name:?} begins inside {open_name:?} ({file}:{open_at})"
                );
            }
            open = Some((name.trim().to_string(), number, Vec::new()));
        } else if let Some(name) = marker.strip_prefix(END) {
            let Some((open_name, open_at, lines)) = open.take() else {
                panic!("{file}:{number}: region {name:?} ends but never began");
            };
            assert_eq!(
                open_name,
                name.trim(),
                "{file}:{number}: the region that began at line {open_at} ends under another name"
            );
            let origin = format!("{file}:{open_at}");
            assert!(
                lines.iter().any(|l| !l.trim().is_empty()),
                "{origin}: region {open_name:?} is empty"
            );
            regions.push((
                open_name,
                Region {
                    origin,
                    text: dedent(&lines),
                },
            ));
        } else if let Some((_, _, lines)) = &mut open {
            lines.push(line);
        }
    }
    if let Some((name, open_at, _)) = open {
        panic!("{file}:{open_at}: region {name:?} never ends");
    }
    regions
}

/// The lines without their common indentation (blank lines do not count), joined with `\n`.
fn dedent(lines: &[&str]) -> String {
    let indent = lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    let dedented: Vec<&str> = lines
        .iter()
        .map(|l| {
            if l.trim().is_empty() {
                ""
            } else {
                &l[indent..]
            }
        })
        .collect();
    dedented.join("\n")
}

/// The ```rust blocks of `markdown`, each with the line its fence is on.
fn rust_blocks(markdown: &str, first_line: usize) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, Vec<&str>)> = None;
    for (index, line) in markdown.lines().enumerate() {
        let number = first_line + index;
        match &mut open {
            None if line.trim_end() == "```rust" => open = Some((number, Vec::new())),
            None => {}
            Some(_) if line.trim_end() == "```" => {
                let (at, lines) = open.take().expect("an open block");
                blocks.push((at, lines.join("\n")));
            }
            Some((_, lines)) => lines.push(line),
        }
    }
    assert!(open.is_none(), "README.md: a ```rust block never closes");
    blocks
}

/// The README's "Library API" section (up to the next `## ` heading) and its first line.
fn library_api_section(readme: &str) -> (usize, String) {
    let lines: Vec<&str> = readme.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim_end() == SECTION)
        .unwrap_or_else(|| panic!("README.md has no {SECTION:?} section"));
    let end = lines[start + 1..]
        .iter()
        .position(|l| l.starts_with("## "))
        .map_or(lines.len(), |offset| start + 1 + offset);
    (start + 1, lines[start..end].join("\n"))
}

fn readme() -> String {
    let path = workspace_root().join("README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Where `example` (a region) and `block` (the README block whose fence is on line `fence`)
/// first differ, for a message that says where a snippet drifted.
fn first_difference(example: &str, block: &str, fence: usize) -> String {
    let (mut example_lines, mut block_lines) = (example.lines(), block.lines());
    let mut number = 1;
    loop {
        match (example_lines.next(), block_lines.next()) {
            (Some(x), Some(y)) if x == y => number += 1,
            (None, None) => return "identical".to_string(),
            (x, y) => {
                return format!(
                    "first difference at README.md:{}: the example has {:?}, the README {:?}",
                    fence + number,
                    x.unwrap_or("<end of region>"),
                    y.unwrap_or("<end of block>"),
                );
            }
        }
    }
}

/// How many lines two texts share at the same position: picks the README block a drifted
/// region most likely was.
fn same_lines(a: &str, b: &str) -> usize {
    a.lines().zip(b.lines()).filter(|(x, y)| x == y).count()
}

#[test]
fn every_marked_example_region_is_a_rust_block_of_the_readme() {
    let regions = example_regions();
    assert!(
        !regions.is_empty(),
        "no `{BEGIN}<name>` regions in examples/*.rs"
    );
    let readme = readme();
    let blocks = rust_blocks(&readme, 1);
    let mut drifted = Vec::new();
    for (name, region) in &regions {
        if blocks.iter().any(|(_, block)| *block == region.text) {
            continue;
        }
        let nearest = blocks
            .iter()
            .max_by_key(|(_, block)| same_lines(&region.text, block))
            .map(|(at, block)| {
                format!(
                    "closest is the block at README.md:{at}, {}",
                    first_difference(&region.text, block, *at)
                )
            })
            .unwrap_or_else(|| "README.md has no ```rust block".to_string());
        drifted.push(format!(
            "region {name:?} ({}) is not a ```rust block of README.md; {nearest}\n\
             --- the README block should read:\n{}\n---",
            region.origin, region.text
        ));
    }
    assert!(drifted.is_empty(), "{}", drifted.join("\n\n"));
}

#[test]
fn every_rust_block_of_the_library_api_section_is_a_marked_example_region() {
    let regions = example_regions();
    let (first_line, section) = library_api_section(&readme());
    let blocks = rust_blocks(&section, first_line);
    assert!(
        !blocks.is_empty(),
        "the {SECTION:?} section has no ```rust block"
    );
    let unbacked: Vec<String> = blocks
        .iter()
        .filter(|(_, block)| !regions.values().any(|region| region.text == *block))
        .map(|(at, block)| {
            let nearest = regions
                .iter()
                .max_by_key(|(_, region)| same_lines(&region.text, block))
                .map(|(name, region)| {
                    format!(
                        "closest is region {name:?} ({}), {}",
                        region.origin,
                        first_difference(&region.text, block, *at)
                    )
                })
                .unwrap_or_default();
            format!(
                "the ```rust block at README.md:{at} is no region of examples/*.rs \
                 (mark the code it shows with `{BEGIN}<name>` / `{END}<name>`); {nearest}"
            )
        })
        .collect();
    assert!(unbacked.is_empty(), "{}", unbacked.join("\n"));
}
