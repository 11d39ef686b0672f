//! Empty: tessera's build-dependencies only pin the host features RocksDB's build script is
//! compiled with (see the table in Cargo.toml), so that every build compiles RocksDB once.

fn main() {}
