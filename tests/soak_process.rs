//! The nemesis soak in the normal suite: `tessera soak --minutes 1` — five
//! `tessera node` processes under the mixed workload while the nemesis kills, pauses,
//! restarts and (as root, in network namespaces) partitions them — must end with no anomaly.
//! `TESSERA_SOAK_MINUTES=10` runs it longer. The soak bounds each of its phases; a watchdog
//! here kills it should it hang anyway.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Beyond the workload's minutes: forming the cluster, converging after the faults, the
/// final reads (each bounded by the soak), with room.
const SETUP_AND_CHECK: Duration = Duration::from_secs(600);

#[test]
fn a_one_minute_soak_under_the_nemesis_finds_no_anomaly() {
    let minutes = std::env::var("TESSERA_SOAK_MINUTES").unwrap_or_else(|_| "1".into());
    let minutes_f: f64 = minutes.parse().expect("TESSERA_SOAK_MINUTES is a number");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["soak", "--minutes", &minutes])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("tessera soak starts");
    let mut stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + Duration::from_secs_f64(minutes_f * 60.0) + SETUP_AND_CHECK;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("tessera soak did not finish within {minutes} min + {SETUP_AND_CHECK:?}");
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let summary = reader.join().expect("stdout reader");
    println!("{summary}");
    assert_eq!(
        status.code(),
        Some(0),
        "tessera soak: {status} (1: anomalies found, 3: the soak could not run)"
    );
    assert!(
        summary.contains("verdict: valid: no anomalies"),
        "{summary}"
    );
    // The nemesis did something, and so did the workload.
    assert!(!summary.contains("nemesis: nothing"), "{summary}");
    let deposits = summary
        .lines()
        .find(|l| l.starts_with("deposit "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|ok| ok.parse::<u64>().ok());
    assert!(deposits.is_some_and(|ok| ok > 0), "{summary}");
}
