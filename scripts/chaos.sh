#!/usr/bin/env bash
# Fault campaign: a real etcd, 3 master candidates and 3 storage nodes on 127.0.0.1, a workload of clients doing
# puts, upserts, gets, removes and rm-alls on a few hundred keys of self-describing values (each operation
# recorded with its times and outcome), while faults are injected at random: kill -9 and SIGSTOP of the leader,
# of a standby and of a node; etcd SIGSTOP, kill -9 and restart on its data directory; etcd NOSPACE (filled with
# junk until the quota alarm, held, then cleared). Every fault is healed before the next. At the end every fault is
# healed, the workload reads every key once more, and `crescent-chaos check` judges the history (torn or foreign
# values, resurrections after acknowledged removals, stale values after acknowledged overwrites, server panics).
#
#   scripts/chaos.sh SECONDS [SEED]
#
# Exits 0 when the checker found no violation, 1 when it found some (the work directory is then kept and named),
# 2 when the campaign could not run. Binaries: $CRESCENT_BIN and $CHAOS_BIN (default target/debug/crescent and
# target/debug/crescent-chaos: `cargo build -p crescent-cli --bins`), etcd from $CRESCENT_ETCD_BIN or PATH.
# Knobs (environment): CHAOS_DIR (work directory; default a new one under /tmp), CHAOS_KEEP=1 (keep it even on
# success), CHAOS_KEYS (300), CHAOS_CLIENTS (8), CHAOS_SEGMENT (node segment size, 24MiB), CHAOS_QUOTA (etcd
# backend quota in bytes, 128 MiB), CHAOS_GAP (most seconds between two faults, 4), CHAOS_FAULTS (the kinds
# drawn from, comma-separated; default all: kill_leader, kill_standby, stop_leader, stop_standby, kill_node,
# stop_node, stop_etcd, restart_etcd, nospace; `none` alone runs the load without faults), CHAOS_AUTH=1 (a cluster
# secret: masters take it, each node proves its own `node:NAME` credential, the workload the admin one, and every
# transfer runs on sealed, term-fenced grants, as a production cluster does).
set -euo pipefail

usage() { echo "usage: $0 SECONDS [SEED]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
RUN_S=$1
[[ "$RUN_S" =~ ^[0-9]+$ ]] && [ "$RUN_S" -ge 5 ] || usage
SEED=${2:-$(( $(date +%s) % 100000 ))}
[[ "$SEED" =~ ^[0-9]+$ ]] || usage
RANDOM=$SEED # the fault schedule follows the seed (its timing still depends on the machine)

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${CRESCENT_BIN:-$ROOT/target/debug/crescent}
CHAOS=${CHAOS_BIN:-$ROOT/target/debug/crescent-chaos}
ETCD=${CRESCENT_ETCD_BIN:-$(command -v etcd || true)}
if [ -z "$ETCD" ] || [ ! -x "$ETCD" ]; then
    echo "chaos: no etcd binary (install Debian's etcd-server, or set CRESCENT_ETCD_BIN)" >&2
    exit 2
fi
for b in "$BIN" "$CHAOS"; do
    [ -x "$b" ] || { echo "chaos: $b missing (cargo build -p crescent-cli --bins)" >&2; exit 2; }
done
command -v curl >/dev/null || { echo "chaos: curl missing" >&2; exit 2; }

KEYS=${CHAOS_KEYS:-300}
CLIENTS=${CHAOS_CLIENTS:-8}
SEGMENT=${CHAOS_SEGMENT:-24MiB}
QUOTA=${CHAOS_QUOTA:-$((128 << 20))}
GAP=${CHAOS_GAP:-4}
CLUSTER=chaos
DIR=${CHAOS_DIR:-$(mktemp -d /tmp/crescent-chaos.XXXXXX)}
mkdir -p "$DIR/logs" "$DIR/snapshots"
LOGS=$DIR/logs # the servers' logs, scanned for panics
T0=$(date +%s)

ETCD_PID=""
WORKLOAD_PID=""
declare -a MPID NPID
ALL_PIDS=() # every process this script started, for the trap

log() { echo "chaos [$(( $(date +%s) - T0 ))s] $*" >&2; }
fault() { echo "$(( $(date +%s) - T0 )) $*" >>"$DIR/faults.log"; log "fault: $*"; }
# A random duration between $1 and $2 tenths of a second, as seconds for sleep.
pause() { local t=$(( $1 + RANDOM % ($2 - $1 + 1) )); sleep "$((t / 10)).$((t % 10))"; }

cleanup() {
    local rc=$?
    exec 3>&2 2>/dev/null # the shell's "Killed" notices of its jobs
    for p in "${ALL_PIDS[@]}"; do sig CONT "$p"; sig KILL "$p"; done
    for p in "${ALL_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    exec 2>&3 3>&-
    if [ "$rc" -eq 0 ] && [ "${CHAOS_KEEP:-0}" != 1 ] && [ -z "${CHAOS_DIR:-}" ]; then
        rm -rf "$DIR"
    else
        echo "chaos: work directory kept: $DIR" >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 2' INT TERM

started() { ALL_PIDS+=("$1"); }
# Whether $1 is still a process of this campaign (its command line names the work directory or the cluster's
# etcd address), so a pid that ended and was reused by an unrelated process is never signalled.
ours() {
    local cmd
    cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline") || return 1
    [[ "$cmd" == *"$DIR"* || "$cmd" == *"etcd://$ETCD_ADDR/"* ]]
}
# Sends signal $1 to each further pid that is still ours.
sig() {
    local s=$1 p
    shift
    for p in "$@"; do
        if [ -n "$p" ] && ours "$p"; then kill "-$s" "$p" 2>/dev/null || true; fi
    done
}
alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null && ours "$1"; }

# --- etcd ---------------------------------------------------------------------------------------------------
EP=$("$CHAOS" free-port)
PEER=$("$CHAOS" free-port)
ETCD_URL=http://127.0.0.1:$EP
ETCD_ADDR=127.0.0.1:$EP
start_etcd() {
    local try i
    for try in 1 2 3 4 5; do
        "$ETCD" --name chaos --data-dir "$DIR/etcd" \
            --listen-client-urls "$ETCD_URL" --advertise-client-urls "$ETCD_URL" \
            --listen-peer-urls "http://127.0.0.1:$PEER" --initial-advertise-peer-urls "http://127.0.0.1:$PEER" \
            --initial-cluster "chaos=http://127.0.0.1:$PEER" --initial-cluster-state new \
            --quota-backend-bytes "$QUOTA" --auto-compaction-mode periodic --auto-compaction-retention 1m \
            >>"$DIR/etcd.log" 2>&1 &
        ETCD_PID=$!
        started "$ETCD_PID"
        for i in $(seq 1 200); do
            curl -s -m 1 "$ETCD_URL/health" 2>/dev/null | grep -q '"health":"true"' && return 0
            alive "$ETCD_PID" || break
            sleep 0.1
        done
        # Exited (a port briefly taken by someone else) or stalled: again, on the same ports and data.
        sig KILL "$ETCD_PID"
        wait "$ETCD_PID" 2>/dev/null || true
        log "etcd did not start (attempt $try); see $DIR/etcd.log"
        sleep 1
    done
    return 1
}

# --- authentication (CHAOS_AUTH=1) ----------------------------------------------------------------------------
MASTER_AUTH=()
if [ "${CHAOS_AUTH:-0}" = 1 ]; then
    (umask 077 && "$BIN" secret >"$DIR/secret")
    MASTER_AUTH=(--secret-file "$DIR/secret")
    for i in 0 1 2; do
        (umask 077 && CRESCENT_SECRET_FILE="$DIR/secret" "$BIN" credential "node:chaos-$i" >"$DIR/node-$i.credential")
    done
    export CRESCENT_SECRET_FILE="$DIR/secret" # the workload's (admin) credential
fi
node_auth() { [ "${CHAOS_AUTH:-0}" = 1 ] && echo "--credential-file=$DIR/node-$1.credential"; }

# --- masters and nodes (each restart appends to the same log; stdout holds the ready line) -------------------
start_master() {
    local i=$1
    "$BIN" master --listen 127.0.0.1:0 --admin 127.0.0.1:0 --etcd "$ETCD_ADDR" --cluster-id "$CLUSTER" \
        --leader-lease-ttl 2 --snapshot-dir "$DIR/snapshots" --snapshot-interval 30s ${MASTER_AUTH[@]+"${MASTER_AUTH[@]}"} \
        >"$DIR/master-$i.out" 2>>"$LOGS/master-$i.log" &
    MPID[i]=$!
    started "${MPID[i]}"
}
start_node() {
    local i=$1
    # shellcheck disable=SC2046 # node_auth prints one word or none
    "$BIN" node --master "etcd://$ETCD_ADDR/$CLUSTER" --listen 127.0.0.1:0 --segment-size "$SEGMENT" $(node_auth "$i") \
        >"$DIR/node-$i.out" 2>>"$LOGS/node-$i.log" &
    NPID[i]=$!
    started "${NPID[i]}"
}
# Waits (bounded) for the ready line in $1.
ready() {
    local i
    for i in $(seq 1 600); do
        [ -s "$1" ] && return 0
        sleep 0.1
    done
    log "no ready line in $1"
    return 1
}
admin_of() { sed -n 's/.*"admin":"\([^"]*\)".*/\1/p' "$DIR/master-$1.out" 2>/dev/null; }
role_of() {
    local a
    a=$(admin_of "$1")
    [ -n "$a" ] || return 0
    curl -s -m 1 "http://$a/health" 2>/dev/null | sed -n 's/.*"role":"\([a-z]*\)".*/\1/p' | head -1
}
# The index of the master that says it leads (waits up to $1 tenths of a second); empty if none.
leader() {
    local end=$(( $(date +%s%N) / 100000000 + ${1:-50} )) i
    while :; do
        for i in 0 1 2; do
            [ "$(role_of "$i")" = leader ] && { echo "$i"; return 0; }
        done
        [ "$(( $(date +%s%N) / 100000000 ))" -lt "$end" ] || return 0
        sleep 0.1
    done
}
# A master other than the leader $1 (any, without a leader).
standby() {
    local l=${1:-9} i=$((RANDOM % 3))
    [ "$i" = "$l" ] && i=$(( (i + 1 + RANDOM % 2) % 3 ))
    echo "$i"
}

# --- faults (each healed before it returns) -----------------------------------------------------------------
kill_master() { # $1 index, $2 role
    fault "kill_$2 master-$1"
    sig KILL "${MPID[$1]}"
    wait "${MPID[$1]}" 2>/dev/null || true
    pause 5 40
    start_master "$1"
}
stop_master() {
    fault "stop_$2 master-$1"
    sig STOP "${MPID[$1]}"
    pause 10 60 # up to three lease TTLs: a stopped leader may or may not lose its lease
    sig CONT "${MPID[$1]}"
}
kill_node() {
    local i=$((RANDOM % 3))
    fault "kill_node node-$i"
    sig KILL "${NPID[i]}"
    wait "${NPID[i]}" 2>/dev/null || true
    pause 5 40
    start_node "$i"
}
stop_node() {
    local i=$((RANDOM % 3))
    fault "stop_node node-$i"
    sig STOP "${NPID[i]}"
    pause 10 60
    sig CONT "${NPID[i]}"
}
stop_etcd() {
    fault "stop_etcd etcd"
    sig STOP "$ETCD_PID"
    pause 10 50
    sig CONT "$ETCD_PID"
}
restart_etcd() {
    fault "restart_etcd etcd"
    sig KILL "$ETCD_PID"
    wait "$ETCD_PID" 2>/dev/null || true
    pause 5 30
    start_etcd
}
nospace() {
    fault "nospace etcd"
    local filled
    if filled=$("$CHAOS" etcd-fill --endpoint "$ETCD_URL" 2>>"$DIR/etcd-faults.log"); then
        log "etcd full after $((filled >> 20)) MiB of junk"
    else
        log "etcd-fill failed (see $DIR/etcd-faults.log)"
    fi
    pause 20 50
    "$CHAOS" etcd-clear --endpoint "$ETCD_URL" 2>>"$DIR/etcd-faults.log" || { log "etcd-clear failed"; return 1; }
}

ALL_FAULTS=(kill_leader kill_standby stop_leader stop_standby kill_node stop_node stop_etcd restart_etcd nospace)
IFS=, read -r -a FAULTS <<<"${CHAOS_FAULTS:-$(IFS=,; echo "${ALL_FAULTS[*]}")}"
for f in "${FAULTS[@]}"; do
    [[ " ${ALL_FAULTS[*]} none " == *" $f "* ]] || { echo "chaos: unknown fault $f (${ALL_FAULTS[*]})" >&2; exit 2; }
done
# A master or node that exited although no fault killed it: recorded (with its exit status) and started again.
reap() {
    local i rc
    for i in 0 1 2; do
        if ! alive "${MPID[i]}"; then
            rc=0; wait "${MPID[i]}" 2>/dev/null || rc=$?
            echo "$(( $(date +%s) - T0 )) master-$i exit $rc" >>"$DIR/exits.log"; log "master-$i exited by itself ($rc)"
            start_master "$i"
        fi
        if ! alive "${NPID[i]}"; then
            rc=0; wait "${NPID[i]}" 2>/dev/null || rc=$?
            echo "$(( $(date +%s) - T0 )) node-$i exit $rc" >>"$DIR/exits.log"; log "node-$i exited by itself ($rc)"
            start_node "$i"
        fi
    done
}
inject() {
    local l
    reap
    case ${FAULTS[RANDOM % ${#FAULTS[@]}]} in
        kill_leader) l=$(leader 20); if [ -n "$l" ]; then kill_master "$l" leader; else fault "kill_leader none (no leader)"; fi ;;
        kill_standby) l=$(leader 20); kill_master "$(standby "$l")" standby ;;
        stop_leader) l=$(leader 20); if [ -n "$l" ]; then stop_master "$l" leader; else fault "stop_leader none (no leader)"; fi ;;
        stop_standby) l=$(leader 20); stop_master "$(standby "$l")" standby ;;
        kill_node) kill_node ;;
        stop_node) stop_node ;;
        stop_etcd) stop_etcd ;;
        restart_etcd) restart_etcd ;;
        nospace) nospace ;;
        none) ;; # a baseline: the same load without faults
    esac
}

# --- the campaign -------------------------------------------------------------------------------------------
log "seed $SEED, $RUN_S s, work directory $DIR, time 0 = unix $T0"
start_etcd || exit 2
for i in 0 1 2; do start_master "$i"; done
for i in 0 1 2; do ready "$DIR/master-$i.out" || exit 2; done
[ -n "$(leader 100)" ] || { log "no master leads"; exit 2; }
for i in 0 1 2; do start_node "$i"; done
for i in 0 1 2; do ready "$DIR/node-$i.out" || exit 2; done
log "cluster up: leader master-$(leader 10)"

"$CHAOS" workload --master "etcd://$ETCD_ADDR/$CLUSTER" --history "$DIR/history.jsonl" --seconds "$RUN_S" \
    --keys "$KEYS" --clients "$CLIENTS" --seed "$SEED" --healed "$DIR/healed" 2>"$DIR/workload.log" &
WORKLOAD_PID=$!
started "$WORKLOAD_PID"
: >"$DIR/faults.log"
: >"$DIR/exits.log"
END=$((T0 + RUN_S))
sleep 2 # let the load start on a healthy cluster
while [ "$(date +%s)" -lt $((END - 3)) ] && alive "$WORKLOAD_PID"; do
    inject || log "a fault's repair failed"
    pause 5 $((GAP * 10))
done

# Heal everything: every process running and awake, etcd without alarms, a leader.
log "healing"
sig CONT "$ETCD_PID"
alive "$ETCD_PID" || start_etcd || true
"$CHAOS" etcd-clear --endpoint "$ETCD_URL" 2>>"$DIR/etcd-faults.log" || log "etcd-clear failed at the end"
for i in 0 1 2; do sig CONT "${MPID[i]}" "${NPID[i]}"; done
reap
HEALED_OK=1
l=$(leader 600)
if [ -z "$l" ]; then
    log "NO LEADER 60 s after every fault was healed"
    HEALED_OK=0
else
    log "leader after healing: master-$l"
fi
touch "$DIR/healed"
# The workload's final sweep is bounded by its own heal timeout (180 s); this bounds the wait for it regardless.
for _ in $(seq 1 3000); do alive "$WORKLOAD_PID" || break; sleep 0.1; done
if alive "$WORKLOAD_PID"; then
    log "the workload did not finish; killing it"
    sig KILL "$WORKLOAD_PID"
fi
WORKLOAD_RC=0
wait "$WORKLOAD_PID" || WORKLOAD_RC=$?
tail -3 "$DIR/workload.log" >&2 || true

echo "campaign: $RUN_S s (total $(( $(date +%s) - T0 )) s), seed $SEED"
echo "servers that exited by themselves: $(wc -l <"$DIR/exits.log")"
set +e
"$CHAOS" check --history "$DIR/history.jsonl" --logs "$LOGS" --faults "$DIR/faults.log" \
    --violations "$DIR/violations.txt"
CHECK_RC=$?
set -e
if [ "$WORKLOAD_RC" -ne 0 ]; then
    echo "chaos: the workload failed (exit $WORKLOAD_RC); see $DIR/workload.log"
    exit 1
fi
if [ "$HEALED_OK" -ne 1 ]; then
    echo "chaos: no master led after the faults were healed"
    exit 1
fi
[ "$CHECK_RC" -eq 0 ] || exit 1
echo "chaos: passed"
