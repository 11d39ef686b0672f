//! The fault filesystem mounted for real: what a power cut keeps and what it throws away.
//! Skipped (saying why) where FUSE cannot be mounted.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use tessera_faultfs::FaultFs;

/// A mounted filesystem over a fresh backing directory, or `None` (after saying why) where
/// this machine cannot mount one.
fn mounted(test: &str) -> Option<(FaultFs, tempfile::TempDir, tempfile::TempDir)> {
    if let Some(reason) = FaultFs::unavailable() {
        eprintln!("{test}: SKIPPED: {reason}");
        return None;
    }
    let backing = tempfile::tempdir().unwrap();
    let mountpoint = tempfile::tempdir().unwrap();
    let fs = FaultFs::mount(backing.path(), mountpoint.path()).unwrap();
    Some((fs, backing, mountpoint))
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Asserts that `actual` is `expected`, naming the first difference rather than printing
/// kilobytes.
fn assert_bytes(actual: &[u8], expected: &[u8], what: &str) {
    if actual != expected {
        let at = actual.iter().zip(expected).position(|(a, b)| a != b);
        panic!(
            "{what}: {} bytes where {} were expected; first difference at {at:?}",
            actual.len(),
            expected.len()
        );
    }
}

#[test]
fn a_cut_keeps_what_was_fsynced_and_loses_the_rest() {
    let Some((fs, backing, mountpoint)) = mounted("a_cut_keeps_what_was_fsynced") else {
        return;
    };
    let at = |name: &str| mountpoint.path().join(name);
    // Durable content before the mount, changed through it without an fsync.
    std::fs::write(backing.path().join("old"), vec![b'o'; 5000]).unwrap();

    let mut synced = File::create(at("synced")).unwrap();
    synced.write_all(&vec![b's'; 10_000]).unwrap();
    synced.sync_data().unwrap();
    synced.write_all(b"appended, never synced").unwrap();

    let mut never = File::create(at("never")).unwrap();
    never.write_all(b"written, never synced").unwrap();

    let mut old = OpenOptions::new().write(true).open(at("old")).unwrap();
    old.set_len(10).unwrap();
    old.seek(SeekFrom::Start(100)).unwrap();
    old.write_all(b"rewritten").unwrap();

    std::fs::create_dir(at("dir")).unwrap();
    std::fs::write(at("dir/renamed-away"), b"renamed").unwrap();
    std::fs::rename(at("dir/renamed-away"), at("dir/renamed")).unwrap();

    // Readers see every change at once.
    assert_eq!(read(&at("synced")).len(), 10_000 + 22);
    assert_eq!(read(&at("never")), b"written, never synced");
    let old_now = read(&at("old"));
    assert_eq!(old_now.len(), 109);
    assert_eq!(&old_now[..10], &[b'o'; 10]);
    assert!(old_now[10..100].iter().all(|&b| b == 0));
    assert_eq!(read(&at("dir/renamed")), b"renamed");
    assert!(fs.unsynced_bytes() > 0);

    let cut = fs.cut_power();
    assert_eq!(
        cut.files, 4,
        "synced (its append), never, old, renamed: {cut:?}"
    );
    // The disk is dead for whoever still runs.
    let mut buf = [0u8; 1];
    let after_cut = synced
        .seek(SeekFrom::Start(0))
        .and_then(|_| synced.read(&mut buf));
    assert!(after_cut.is_err(), "a read after the cut: {after_cut:?}");
    assert!(synced.sync_data().is_err(), "an fsync after the cut");
    drop((synced, never, old));
    fs.unmount().unwrap();

    // What the disk holds: the last fsync of each file; names are durable at once.
    let on_disk = |name: &str| read(&backing.path().join(name));
    assert_bytes(&on_disk("synced"), &[b's'; 10_000], "synced on disk");
    assert_eq!(on_disk("never"), b"");
    assert_bytes(&on_disk("old"), &[b'o'; 5000], "old on disk");
    assert_eq!(on_disk("dir/renamed"), b"");
    assert!(!backing.path().join("dir/renamed-away").exists());

    // Mounted again, the files read as they are on disk.
    let fs = FaultFs::mount(backing.path(), mountpoint.path()).unwrap();
    assert_bytes(
        &read(&at("synced")),
        &[b's'; 10_000],
        "synced, mounted again",
    );
    assert_bytes(&read(&at("old")), &[b'o'; 5000], "old, mounted again");
    fs.unmount().unwrap();
}

#[test]
fn a_clean_unmount_keeps_everything() {
    let Some((fs, backing, mountpoint)) = mounted("a_clean_unmount_keeps_everything") else {
        return;
    };
    let path = mountpoint.path().join("file");
    std::fs::write(&path, b"never fsynced").unwrap();
    assert_eq!(read(&backing.path().join("file")), b"", "not durable yet");
    fs.unmount().unwrap();
    assert_eq!(read(&backing.path().join("file")), b"never fsynced");
}

#[test]
fn an_open_file_survives_its_removal_until_closed() {
    let Some((fs, _backing, mountpoint)) = mounted("an_open_file_survives_its_removal") else {
        return;
    };
    let path = mountpoint.path().join("file");
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    file.write_all(b"still readable").unwrap();
    std::fs::remove_file(&path).unwrap();
    let mut content = String::new();
    file.seek(SeekFrom::Start(0)).unwrap();
    file.read_to_string(&mut content).unwrap();
    assert_eq!(content, "still readable");
    file.sync_all().unwrap();
    drop(file);
    assert!(!path.exists());
    fs.unmount().unwrap();
}

/// A process that made itself a new mount namespace while the filesystem was mounted holds
/// a copy of the mount, which keeps the FUSE connection alive after the unmount here: the
/// unmount aborts the connection rather than wait for that process.
#[test]
fn unmounting_ends_the_server_also_with_a_copy_in_another_mount_namespace() {
    let Some((fs, _backing, mountpoint)) = mounted("unmounting_with_a_copy_elsewhere") else {
        return;
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("unmounting_with_a_copy_elsewhere: SKIPPED: unshare needs root");
        return;
    }
    std::fs::write(mountpoint.path().join("file"), b"x").unwrap();
    let mut holder = match std::process::Command::new("unshare")
        .args(["--mount", "sleep", "60"])
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!("unmounting_with_a_copy_elsewhere: SKIPPED: no unshare: {e}");
            return;
        }
    };
    // The copy exists once the holder's namespace does: it is made by unshare(2) before
    // sleep runs, so wait until the holder runs sleep.
    let comm = format!("/proc/{}/comm", holder.id());
    while std::fs::read_to_string(&comm).is_ok_and(|c| c.trim() != "sleep") {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    fs.unmount().unwrap();
    let _ = holder.kill();
    let _ = holder.wait();
}
