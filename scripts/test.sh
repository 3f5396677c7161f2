#!/usr/bin/env bash
# Installs what the tests need (when missing) and runs every check: fmt, clippy, docs, all tests.
# This is the README's test command and exactly what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client) # the HA guide's recovery commands (docs/ha.md)
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
command -v curl >/dev/null 2>&1 || need+=(curl) # the README quick-start test runs its curl line
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv) # the Python package's tests
if ((${#need[@]})); then
    echo "installing: ${need[*]}" >&2
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
# Fail loudly, never skip, if a prerequisite is still missing.
command -v etcd >/dev/null
command -v etcdctl >/dev/null
command -v protoc >/dev/null
command -v curl >/dev/null
python3 -c 'import venv, ensurepip'

# A virtual environment under the target directory for what the tests take from PyPI: maturin, pytest, NumPy and
# requests (the Python package, below) and moto's S3 server (the snapshot store's S3 tests start `moto_server` on loopback and
# find it through CRESCENT_MOTO_SERVER; they fail, never skip, without it).
mkdir -p "${CARGO_TARGET_DIR:-target}"
target="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)"
venv="$target/py-venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
[ -x "$venv/bin/maturin" ] || "$venv/bin/python" -m pip install -q "maturin>=1.9.4,<2"
[ -x "$venv/bin/pytest" ] || "$venv/bin/python" -m pip install -q "pytest>=7"
# NumPy: the Python package's tensor calls use it (an optional dependency of the package, needed by its tests);
# the engine replays (crates/python/tests/test_engine_*.py) hold their buffers in NumPy arrays and read the
# master's HTTP API with requests, as the engines do.
"$venv/bin/python" -c 'import numpy, requests' 2>/dev/null || "$venv/bin/python" -m pip install -q "numpy>=1.24" "requests>=2"
# pyzmq and msgpack: the KV event stream's test reads it as the original's consumers do (crates/python/tests/test_kv_events.py).
"$venv/bin/python" -c 'import zmq, msgpack' 2>/dev/null || "$venv/bin/python" -m pip install -q "pyzmq>=25" "msgpack>=1"
[ -x "$venv/bin/moto_server" ] || "$venv/bin/python" -m pip install -q "moto[server]>=5,<6"
export CRESCENT_MOTO_SERVER="$venv/bin/moto_server"
[ -x "$CRESCENT_MOTO_SERVER" ]

cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# Doc comments are checked too (intra-doc links resolve, no rustdoc warnings).
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --locked --no-fail-fast
else
    cargo test --workspace --locked --no-fail-fast
fi

# The Python package (crates/python): built into the virtual environment made above and tested against a
# `crescent master` process (the debug binary the tests built).
cargo build -p crescent-cli --locked
(cd crates/python && VIRTUAL_ENV="$venv" "$venv/bin/maturin" develop --locked -q)
CRESCENT_BIN="$target/debug/crescent" "$venv/bin/python" -m pytest -q -p no:cacheprovider crates/python/tests \
    --ignore=crates/python/tests/upstream
# The original's own store tests (crates/python/tests/upstream: copied unmodified, see its README), each file in a
# pytest process of its own (they keep stores in class state and read their environment at import), each against
# a master of its own. A file whose tests are all in the conftest's NOT_YET table collects none (pytest's exit 5);
# such files run first, so the last summary printed is of tests that ran.
upstream=(
    test_batch_replica_clear.py
    test_dummy_client.py
    test_distributed_object_store.py
    test_replicated_distributed_object_store.py
    test_offload_on_eviction.py
    test_promotion_on_hit.py
    test_ssd_offload_in_evict.py
)
# Every vendored file runs: the list must name exactly the files there.
if [ "$(printf '%s\n' "${upstream[@]}" | sort)" != "$(cd crates/python/tests/upstream && ls test_*.py | sort)" ]; then
    echo "scripts/test.sh: the upstream list differs from crates/python/tests/upstream/test_*.py" >&2
    exit 1
fi
for f in "${upstream[@]}"; do
    rc=0
    CRESCENT_BIN="$target/debug/crescent" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
        "crates/python/tests/upstream/$f" || rc=$?
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
        echo "scripts/test.sh: crates/python/tests/upstream/$f failed (pytest exit $rc)" >&2
        exit "$rc"
    fi
done
