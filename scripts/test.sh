#!/usr/bin/env bash
# Installs what the tests need (when missing) and runs every check: fmt, clippy, docs, all tests.
# This is the README's test command and exactly what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
command -v curl >/dev/null 2>&1 || need+=(curl) # the README quick-start test runs its curl line
if ((${#need[@]})); then
    echo "installing: ${need[*]}" >&2
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
# Fail loudly, never skip, if a prerequisite is still missing.
command -v etcd >/dev/null
command -v protoc >/dev/null
command -v curl >/dev/null

cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# Doc comments are checked too (intra-doc links resolve, no rustdoc warnings).
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --locked --no-fail-fast
else
    cargo test --workspace --locked --no-fail-fast
fi
