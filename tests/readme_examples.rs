//! The README's and the book's code samples are compiled code. Every ```rust block of the
//! README's "A first service" section is a region of a program the suite compiles (between
//! `// ANCHOR: <name>` and `// ANCHOR_END: <name>`, dedented), and every `{{#include}}` of the
//! book names a file and an anchor that exist, so that neither can drift from code that builds.
//! The README stays a front door of at most 250 lines, and the book builds with mdBook.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const BEGIN: &str = "// ANCHOR: ";
const END: &str = "// ANCHOR_END: ";
const SECTION: &str = "## A first service";
const README_MAX_LINES: usize = 250;

/// A marked region of a program.
struct Region {
    /// `<path>:<line of the begin marker>`, for messages.
    origin: String,
    /// The region's lines, dedented to their smallest indentation, joined with `\n`.
    text: String,
}

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `.rs` files under `dir`, recursively, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The anchored regions of `path`, by name. Panics on a malformed marker: an end without its
/// begin, a begin without its end, nested or duplicate names, an empty region.
fn regions_of(path: &Path) -> BTreeMap<String, Region> {
    let root = workspace_root();
    let file = path
        .strip_prefix(&root)
        .unwrap_or(path)
        .display()
        .to_string();
    let source =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {file}: {e}"));
    let mut regions = BTreeMap::new();
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
            let region = Region {
                origin: origin.clone(),
                text: dedent(&lines),
            };
            if regions.insert(open_name.clone(), region).is_some() {
                panic!("{origin}: region {open_name:?} is marked twice in {file}");
            }
        } else if let Some((_, _, lines)) = &mut open {
            lines.push(line);
        }
    }
    if let Some((name, open_at, _)) = open {
        panic!("{file}:{open_at}: region {name:?} never ends");
    }
    regions
}

/// Every region of the programs the suite compiles as samples: the library's examples and
/// the example crates.
fn example_regions() -> Vec<Region> {
    let root = workspace_root();
    let mut files = rust_files(&root.join("tessera").join("examples"));
    files.extend(rust_files(&root.join("examples")));
    files
        .iter()
        .flat_map(|path| regions_of(path).into_values())
        .collect()
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
    assert!(open.is_none(), "a ```rust block never closes");
    blocks
}

/// The README's "A first service" section (up to the next `## ` heading) and its first line.
fn first_service_section(readme: &str) -> (usize, String) {
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

/// How many lines two texts share at the same position: picks the region a drifted block most
/// likely was.
fn same_lines(a: &str, b: &str) -> usize {
    a.lines().zip(b.lines()).filter(|(x, y)| x == y).count()
}

#[test]
fn every_rust_block_of_the_first_service_section_is_an_anchored_region() {
    let regions = example_regions();
    let (first_line, section) = first_service_section(&readme());
    let blocks = rust_blocks(&section, first_line);
    assert!(
        !blocks.is_empty(),
        "the {SECTION:?} section has no ```rust block"
    );
    let unbacked: Vec<String> = blocks
        .iter()
        .filter(|(_, block)| !regions.iter().any(|region| region.text == *block))
        .map(|(at, block)| {
            let nearest = regions
                .iter()
                .max_by_key(|region| same_lines(&region.text, block))
                .map(|region| {
                    format!(
                        "closest is the region at {}, {}",
                        region.origin,
                        first_difference(&region.text, block, *at)
                    )
                })
                .unwrap_or_default();
            format!(
                "the ```rust block at README.md:{at} is no anchored region of an example \
                 (mark the code it shows with `{BEGIN}<name>` / `{END}<name>`); {nearest}"
            )
        })
        .collect();
    assert!(unbacked.is_empty(), "{}", unbacked.join("\n"));
}

#[test]
fn every_include_of_the_book_names_a_file_and_an_anchor_that_exist() {
    let src = workspace_root().join("docs").join("src");
    let mut pages: Vec<PathBuf> = std::fs::read_dir(&src)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", src.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    pages.sort();
    let mut includes = 0;
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("a page");
        let name = page.file_name().unwrap_or_default().to_string_lossy();
        for (index, line) in text.lines().enumerate() {
            let mut rest = line;
            while let Some(at) = rest.find("{{#include ") {
                // `\{{#include ...}}` is mdBook's escape: shown, not included.
                let escaped = rest[..at].ends_with('\\');
                let after = &rest[at + "{{#include ".len()..];
                let Some(end) = after.find("}}") else {
                    broken.push(format!("{name}:{}: an include never closes", index + 1));
                    break;
                };
                rest = &after[end..];
                if escaped {
                    continue;
                }
                includes += 1;
                let target = after[..end].trim();
                let (file, anchor) = match target.rsplit_once(':') {
                    Some((file, anchor)) if !anchor.contains('/') => (file, Some(anchor)),
                    _ => (target, None),
                };
                let path = src.join(file);
                if !path.is_file() {
                    broken.push(format!("{name}:{}: {file} does not exist", index + 1));
                    continue;
                }
                if let Some(anchor) = anchor
                    && !regions_of(&path).contains_key(anchor)
                {
                    broken.push(format!(
                        "{name}:{}: {file} has no anchor {anchor:?}",
                        index + 1
                    ));
                }
            }
        }
    }
    assert!(includes > 0, "the book includes no code");
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_readme_is_a_front_door() {
    let lines = readme().lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines; at most {README_MAX_LINES} (the rest belongs in the book)"
    );
}

/// `mdbook build docs`, into a temporary directory; skipped, saying why, where mdBook is not
/// installed (`scripts/test` installs it).
#[test]
fn the_book_builds() {
    let Ok(version) = std::process::Command::new("mdbook")
        .arg("--version")
        .output()
    else {
        eprintln!("skipped: mdbook is not installed (scripts/test installs it)");
        return;
    };
    assert!(version.status.success(), "mdbook --version failed");
    let out = tempfile::tempdir().expect("a temporary directory");
    let built = std::process::Command::new("mdbook")
        .arg("build")
        .arg(workspace_root().join("docs"))
        .arg("--dest-dir")
        .arg(out.path())
        .output()
        .expect("mdbook runs");
    let stderr = String::from_utf8_lossy(&built.stderr);
    assert!(
        built.status.success(),
        "mdbook build docs failed:\n{stderr}"
    );
    // mdBook reports a missing include or anchor as an error but still builds.
    assert!(
        !stderr.contains("[ERROR]") && !stderr.contains(" ERROR "),
        "mdbook build docs reported errors:\n{stderr}"
    );
    assert!(out.path().join("index.html").is_file());
}
