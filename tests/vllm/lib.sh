# SPDX-License-Identifier: Apache-2.0
# Shared bash helpers for tests/vllm/*.sh (source it; needs $WORK and $PY set).
# Servers run in their own process group (setsid) so one kill takes the API
# server, EngineCore and the worker together; cleanup runs from an EXIT trap.

ECX_VLLM_HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SERVER_PIDS=()
SERVER_NAMES=()

_T0=$(date +%s%N)
elapsed() { local ms=$(( ($(date +%s%N) - _T0) / 1000000 )); printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)); }
log() { printf '[%s +%ss] %s\n' "$(date +%H:%M:%S)" "$(elapsed)" "$*" >&2; }
fail() { log "FAIL: $*"; exit 1; }

# Environment every server gets.  VLLM_USE_V2_MODEL_RUNNER must not be set on CPU.
vllm_env() {
    unset VLLM_USE_V2_MODEL_RUNNER
    export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
    export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false
    export PYTHONUNBUFFERED=1
    # vLLM leaves files in the temp directory: its engines' IPC sockets and vllm_dist_*
    # init files, ~35 a test run. This run's go in $WORK/tmp, which goes with $WORK,
    # unless that path is too long for a unix socket's (107 bytes, vLLM's names are 36).
    local t="$WORK/tmp"
    if (( ${#t} + 37 <= 107 )) && mkdir -p "$t"; then export TMPDIR="$t"; fi
}

# run CMD... in the background and wait for it: a TERM/INT to the script then runs
# its trap at once instead of after the (possibly minutes long) command.
waitable() { "$@" & local p=$!; wait "$p"; }

free_port() {
    "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# start_server NAME MODEL_DIR PORT [extra vllm args...]  -> log in $WORK/NAME.log
start_server() {
    local name=$1 model=$2 port=$3; shift 3
    setsid "$PY" -m vllm.entrypoints.openai.api_server \
        --model "$model" --served-model-name tiny \
        --host 127.0.0.1 --port "$port" \
        --dtype float32 --enforce-eager \
        --max-model-len "${ECX_VLLM_MAX_MODEL_LEN:-1024}" --max-num-seqs 4 \
        --limit-mm-per-prompt '{"image":1,"video":0}' \
        --seed 0 --disable-log-stats \
        "$@" >"$WORK/$name.log" 2>&1 < /dev/null &
    local pid=$!
    SERVER_PIDS+=("$pid"); SERVER_NAMES+=("$name")
    echo "$pid" >"$WORK/$name.pid"
    log "started $name (pid $pid, port $port, model $(basename "$model"))"
}

# wait_server NAME PORT [TIMEOUT_S]: bounded; dumps the log tail on failure.
wait_server() {
    local name=$1 port=$2 timeout=${3:-${ECX_VLLM_START_TIMEOUT:-420}} pid t
    pid=$(cat "$WORK/$name.pid")
    # not t=$(...): a command substitution would hold off the script's traps
    if ! waitable "$PY" "$ECX_VLLM_HERE/client.py" health "http://127.0.0.1:$port" \
            --timeout "$timeout" --pid "$pid" >"$WORK/$name.health" 2>&1; then
        t=$(cat "$WORK/$name.health")
        log "$name did not come up: $t"
        tail -n 40 "$WORK/$name.log" >&2
        fail "$name failed to start"
    fi
    t=$(cat "$WORK/$name.health")
    log "$name healthy: $t"
}

# group_rss_mb PID: RSS of the server's whole process group, in MiB.
group_rss_mb() {
    ps -o rss= -g "$1" 2>/dev/null | awk '{s+=$1} END {printf "%d", s/1024}'
}

stop_server() {  # stop_server PID: TERM the group, bounded wait, then KILL
    local pid=$1 i
    kill -TERM -- "-$pid" 2>/dev/null || return 0
    for i in $(seq 1 30); do
        kill -0 -- "-$pid" 2>/dev/null || return 0
        sleep 0.5
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
}

stop_all_servers() {
    local p
    for p in "${SERVER_PIDS[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
    for p in "${SERVER_PIDS[@]}"; do stop_server "$p"; done
    SERVER_PIDS=(); SERVER_NAMES=()
}

# chat PORT OUT_JSON [client.py chat args...]
chat() {
    local port=$1 out=$2; shift 2
    waitable "$PY" "$ECX_VLLM_HERE/client.py" chat "http://127.0.0.1:$port" "$@" >"$out" \
        || fail "chat request to port $port failed"
}

token_ids() { "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["token_ids"])' "$1"; }

# ec_params RESULT_JSON: the response's ec_transfer_params as compact JSON ("null" if none)
ec_params() { "$PY" -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["ec_transfer_params"], separators=(",", ":")))' "$1"; }

# ---- /dev/shm left by killed servers ----------------------------------------------------
# A server killed (SIGKILL, or a TERM that timed out) leaves its Python multiprocessing
# shared memory (psm_*, vLLM's engine: ~400 MB a run) and semaphores (sem.mp-*) in
# /dev/shm, with no name of the run's in them. Only this run's are removed, never another
# run's (runs may go side by side):
#   shm_mark DIR   at the start: records in DIR what exists already;
#   shm_claim      while servers run (after they start, before a kill, before stopping
#                  them): records the entries that this run's processes map or hold open;
#                  the run's processes are those in a server's process group
#                  (SERVER_PIDS) or below this script (not its environment: vLLM's
#                  setproctitle overwrites /proc/PID/environ);
#   shm_sweep [--dry-run]  removes (or only lists) the claimed entries that did not exist
#                  at the start and that no live process maps or holds open any more.
ECX_SHM_NAMES='^(psm_|sem\.mp-)'
shm_list() { ls -1 /dev/shm 2>/dev/null | grep -E "$ECX_SHM_NAMES" | LC_ALL=C sort -u; }
shm_held() {  # shm_held PID...: the entries (names) those processes map or hold open
    local p maps=() fds=()
    for p in "$@"; do maps+=("/proc/$p/maps"); fds+=("/proc/$p/fd"); done
    [ ${#maps[@]} -gt 0 ] || return 0
    { cat "${maps[@]}" 2>/dev/null | awk 'NF == 6 && $6 ~ /^\/dev\/shm\// {print $6}'
      find "${fds[@]}" -maxdepth 1 -lname '/dev/shm/*' -printf '%l\n' 2>/dev/null; } |
        sed -n 's#^/dev/shm/##p' | grep -E "$ECX_SHM_NAMES" | grep -v '[ /]' | LC_ALL=C sort -u
}
shm_ours() {  # this run's live processes: in a server's process group, or below $$
    ps -eo pid=,ppid=,pgid= | awk -v top="$$" -v groups="${SERVER_PIDS[*]}" '
        BEGIN { n = split(groups, g, " "); for (i = 1; i <= n; i++) grp[g[i]] = 1 }
        { par[$1] = $2; pg[$1] = $3 }
        END {
            for (p in par) {
                if (pg[p] in grp) { print p; continue }
                for (q = p; q != top && q in par && par[q] != q && q > 1; q = par[q]) {}
                if (q == top) print p
            }
        }'
}
shm_mark() {
    ECX_SHM_STATE=$1
    shm_list >"$ECX_SHM_STATE/shm.before"
    : >"$ECX_SHM_STATE/shm.claimed"
}
shm_claim() {
    [ -n "${ECX_SHM_STATE:-}" ] || return 0
    # shellcheck disable=SC2046
    shm_held $(shm_ours) >>"$ECX_SHM_STATE/shm.claimed"
}
shm_sweep() {
    [ -n "${ECX_SHM_STATE:-}" ] || return 0
    local dry=${1:-} n bytes=0 count=0 s
    # shellcheck disable=SC2046
    shm_held $(ls /proc | grep -E '^[0-9]+$') >"$ECX_SHM_STATE/shm.held"
    LC_ALL=C sort -u "$ECX_SHM_STATE/shm.claimed" | LC_ALL=C comm -23 - "$ECX_SHM_STATE/shm.before" |
        LC_ALL=C comm -23 - "$ECX_SHM_STATE/shm.held" >"$ECX_SHM_STATE/shm.sweep"
    while read -r n; do
        [ -e "/dev/shm/$n" ] || continue
        s=$(stat -c %s "/dev/shm/$n" 2>/dev/null)
        if [ "$dry" = --dry-run ]; then
            echo "would remove /dev/shm/$n"
        else
            rm -f "/dev/shm/$n" || continue
        fi
        bytes=$((bytes + ${s:-0})); count=$((count + 1))
    done <"$ECX_SHM_STATE/shm.sweep"
    [ "$count" -eq 0 ] || log "/dev/shm: $count entries this run's servers left ($((bytes >> 20)) MiB in size): $([ "$dry" = --dry-run ] && echo "to remove (dry run)" || echo removed)"
}
