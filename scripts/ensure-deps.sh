#!/usr/bin/env bash
# Installs what building tessera needs beyond rustup, when it is missing:
#   - a C/C++ toolchain and libclang (the rocksdb crate compiles RocksDB and runs bindgen).
#   - PostgreSQL's server (the exactly-once projection tests start servers of their own).
#   - Debian's chromium and chromium-driver for the dashboard's browser test (optional: where
#     they cannot be installed this only says so, and the test skips).
# The power-loss test (tests/power_loss.rs) needs no package: its FUSE filesystem mounts as
# root with mount(2) on /dev/fuse (no libfuse, no fusermount); elsewhere it says why it skips.
# Sourced by scripts/demo and scripts/test. Prints the exact command to run where it cannot
# install by itself (not root and no password-less sudo, or no apt-get).
set -euo pipefail

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tessera-target}"

if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    echo "error: cargo not found. Install Rust with rustup first:" >&2
    echo "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y" >&2
    exit 1
  fi
fi

have_libclang() {
  # bindgen loads libclang.so or libclang-<version>.so (package libclang1-N), not
  # libclang-cpp; each directory is tried on its own, since ls fails when any one is absent.
  local dir
  # clang-sys also takes LIBCLANG_PATH naming the library file itself.
  if [ -n "${LIBCLANG_PATH:-}" ] && [ -f "$LIBCLANG_PATH" ]; then
    return 0
  fi
  for dir in "${LIBCLANG_PATH:-/nonexistent}" /usr/lib/llvm-*/lib /usr/lib/x86_64-linux-gnu \
             /usr/lib/aarch64-linux-gnu /usr/lib64; do
    if compgen -G "$dir/libclang.so*" >/dev/null || compgen -G "$dir/libclang-[0-9]*.so*" >/dev/null; then
      return 0
    fi
  done
  return 1
}

missing=()
have_libclang || missing+=(libclang-dev)
command -v clang >/dev/null 2>&1 || missing+=(clang)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
command -v make >/dev/null 2>&1 || missing+=(make)

if [ ${#missing[@]} -gt 0 ]; then
  install_cmd="apt-get update && apt-get install -y ${missing[*]}"
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "error: missing build dependencies (${missing[*]}) and no apt-get on this machine." >&2
    echo "Install libclang, clang, a C++ compiler and make with your package manager, then rerun." >&2
    exit 1
  fi
  echo "tessera: installing missing build dependencies: ${missing[*]}" >&2
  if [ "$(id -u)" -eq 0 ]; then
    sh -c "$install_cmd" >&2
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo sh -c "$install_cmd" >&2
  else
    echo "error: cannot install as a regular user without password-less sudo. Run:" >&2
    echo "  sudo sh -c '$install_cmd'" >&2
    exit 1
  fi
fi

# Debian's Chromium and ChromeDriver, for the dashboard's browser test
# (tests/dashboard_browser.rs). Not needed to build: where they cannot be installed the test
# says why and skips, so a failure here only warns.
browser_missing=()
command -v chromium >/dev/null 2>&1 || browser_missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || browser_missing+=(chromium-driver)

if [ ${#browser_missing[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
  browser_cmd="apt-get update && apt-get install -y ${browser_missing[*]}"
  if [ "$(id -u)" -eq 0 ]; then
    echo "tessera: installing the browser test's dependencies: ${browser_missing[*]}" >&2
    sh -c "$browser_cmd" >&2 || echo "warning: could not install ${browser_missing[*]}; the browser test will skip" >&2
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    echo "tessera: installing the browser test's dependencies: ${browser_missing[*]}" >&2
    sudo sh -c "$browser_cmd" >&2 || echo "warning: could not install ${browser_missing[*]}; the browser test will skip" >&2
  else
    echo "note: the dashboard's browser test skips without ${browser_missing[*]}; to run it:" >&2
    echo "  sudo sh -c '$browser_cmd'" >&2
  fi
fi

# iproute2's `ip` and `tc`, for what partitions nodes in network namespaces
# (tests/partition_process.rs, and `tessera soak` with tests/soak_process.rs). Namespaces need
# root, so only root needs them; without them the partition test skips and the soak runs
# without partitions, each saying why, so a failure here only warns.
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1 \
   && { ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; }; then
  echo "tessera: installing iproute2 (ip, tc) for the partition tests" >&2
  sh -c "apt-get update && apt-get install -y iproute2" >&2 \
    || echo "warning: could not install iproute2; partitions will be skipped" >&2
fi

# PostgreSQL's server programs (initdb, postgres, pg_ctl), for the exactly-once projection
# tests and the demo's read model: each test starts a server of its own on a free loopback
# port (tools/harness/src/postgres.rs). Those tests need it, so a failure here is an error.
have_postgres() {
  if [ -n "${TESSERA_POSTGRES_BIN:-}" ] && [ -x "$TESSERA_POSTGRES_BIN/initdb" ]; then
    return 0
  fi
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null 2>&1
}
if ! have_postgres; then
  pg_cmd="apt-get update && apt-get install -y postgresql"
  echo "tessera: installing PostgreSQL for the exactly-once projection tests" >&2
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    sh -c "$pg_cmd" >&2
  elif command -v apt-get >/dev/null 2>&1 && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo sh -c "$pg_cmd" >&2
  else
    echo "error: PostgreSQL is missing and cannot be installed here. Run:" >&2
    echo "  sudo sh -c '$pg_cmd'" >&2
    echo "or set TESSERA_POSTGRES_BIN to the directory of initdb and postgres." >&2
    exit 1
  fi
fi

# mdBook, for the book's build in the suite (tests/readme_examples.rs): not needed to build
# tessera, so a failure here only warns and that test skips. Installed with cargo into
# ~/.cargo/bin, built in a target directory of its own.
if ! command -v mdbook >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/mdbook" ]; then
  echo "tessera: installing mdBook for the book" >&2
  CARGO_TARGET_DIR="$HOME/.cache/mdbook-target" cargo install mdbook --locked --version 0.5.4 >&2 \
    || echo "warning: could not install mdBook; the book's build test will skip" >&2
fi
if [ -x "$HOME/.cargo/bin/mdbook" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
