#!/usr/bin/env bash
# Runs a jaxrubric command as one JAX process that drives all the GPUs of this machine; with
# --num-processes N, as process I of N machines that meet at a coordinator. The coordinator
# settings are exported as JAXRUBRIC_* variables, which `jaxrubric.distributed` passes to
# `jax.distributed.initialize`. Run with -h for the options.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch/gpu_local.sh [options] -- COMMAND [ARG...]

One process per machine, seeing every local GPU (or those of --gpus), e.g. one machine:

  launch/gpu_local.sh -- jaxrubric train --config configs/qwen3_8b_dynamic_rubric.py \
    --workdir runs/r1

Two machines (run on each, with its own --process-id; the coordinator is process 0's host):

  launch/gpu_local.sh --num-processes 2 --process-id 0 --coordinator 10.0.0.1:12345 -- \
    jaxrubric train ...                                       # on 10.0.0.1
  launch/gpu_local.sh --num-processes 2 --process-id 1 --coordinator 10.0.0.1:12345 -- \
    jaxrubric train ...                                       # on the other machine

Options:
  --num-processes N        machines in the job (default 1: no coordinator)
  --process-id I           this machine's index, 0 .. N-1 (needed when N > 1)
  --coordinator HOST:PORT  process 0's address, reachable from every machine (needed when N > 1)
                           -> exported as JAXRUBRIC_NUM_PROCESSES, JAXRUBRIC_PROCESS_ID,
                              JAXRUBRIC_COORDINATOR_ADDRESS
  --gpus LIST              CUDA_VISIBLE_DEVICES, e.g. 0,1,2,3 (default: the current value, or all)
  --mem-fraction F         XLA_PYTHON_CLIENT_MEM_FRACTION, the share of GPU memory JAX
                           preallocates (default: the current value, or 0.90)
  --dry-run                print the environment and the command, run nothing
  -h, --help               this text

Also exported: XLA_FLAGS gets --xla_gpu_enable_latency_hiding_scheduler=true (overlaps
collectives with compute) unless XLA_FLAGS already sets that flag; JAX_PLATFORMS=cuda unless
set, so a machine where JAX cannot use the GPUs fails instead of training on the CPU.
EOF
}

die() {
  echo "gpu_local.sh: error: $*" >&2
  echo "(launch/gpu_local.sh -h for help)" >&2
  exit 2
}

NUM_PROCESSES=1
PROCESS_ID=
COORDINATOR=
GPUS=${CUDA_VISIBLE_DEVICES-}
MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.90}
DRY_RUN=0

while (($#)); do
  if [[ $1 == --*=* ]]; then  # --flag=value -> --flag value
    set -- "${1%%=*}" "${1#*=}" "${@:2}"
  fi
  case $1 in
    -h | --help) usage; exit 0 ;;
    --dry-run) DRY_RUN=1; shift; continue ;;
    --) shift; break ;;
    --num-processes | --process-id | --coordinator | --gpus | --mem-fraction)
      (($# >= 2)) || die "$1 needs a value" ;;
    *) die "unknown option $1 (the command goes after --)" ;;
  esac
  case $1 in
    --num-processes) NUM_PROCESSES=$2 ;;
    --process-id) PROCESS_ID=$2 ;;
    --coordinator) COORDINATOR=$2 ;;
    --gpus) GPUS=$2 ;;
    --mem-fraction) MEM_FRACTION=$2 ;;
  esac
  shift 2
done
COMMAND=("$@")

((${#COMMAND[@]})) || die "missing the command to run, after --"
[[ $NUM_PROCESSES =~ ^[1-9][0-9]*$ ]] || die "--num-processes must be >= 1, got '$NUM_PROCESSES'"
if ((NUM_PROCESSES > 1)); then
  [[ -n $PROCESS_ID ]] ||
    die "--num-processes $NUM_PROCESSES needs --process-id (0 .. $((NUM_PROCESSES - 1)))"
  [[ -n $COORDINATOR ]] || die "--num-processes $NUM_PROCESSES needs --coordinator HOST:PORT"
  [[ $PROCESS_ID =~ ^(0|[1-9][0-9]*)$ ]] && ((PROCESS_ID < NUM_PROCESSES)) ||
    die "--process-id must be in 0 .. $((NUM_PROCESSES - 1)), got '$PROCESS_ID'"
  [[ $COORDINATOR =~ ^[^:]+:[0-9]+$ || $COORDINATOR =~ ^\[[0-9A-Fa-f:]+\]:[0-9]+$ ]] ||
    die "--coordinator must be HOST:PORT (or [IPv6]:PORT), got '$COORDINATOR'"
elif [[ -n $PROCESS_ID || -n $COORDINATOR ]]; then
  die "--process-id and --coordinator need --num-processes N > 1"
fi
[[ $GPUS =~ ^[0-9A-Za-z,-]*$ ]] ||
  die "--gpus takes a comma-separated list like 0,1,2,3, got '$GPUS'"
[[ $MEM_FRACTION =~ ^(0?\.[0-9]*[1-9][0-9]*|1(\.0*)?)$ ]] ||
  die "--mem-fraction must be in (0, 1], got '$MEM_FRACTION'"

ENV_NAMES=()
set_env() {  # set_env NAME VALUE: exported for COMMAND and shown
  export "$1=$2"
  ENV_NAMES+=("$1")
}

[[ -z $GPUS ]] || set_env CUDA_VISIBLE_DEVICES "$GPUS"
set_env XLA_PYTHON_CLIENT_MEM_FRACTION "$MEM_FRACTION"
flags=${XLA_FLAGS-}
[[ $flags == *--xla_gpu_enable_latency_hiding_scheduler* ]] ||
  flags="${flags:+$flags }--xla_gpu_enable_latency_hiding_scheduler=true"
set_env XLA_FLAGS "$flags"
set_env JAX_PLATFORMS "${JAX_PLATFORMS:-cuda}"
if ((NUM_PROCESSES > 1)); then
  set_env JAXRUBRIC_COORDINATOR_ADDRESS "$COORDINATOR"
  set_env JAXRUBRIC_NUM_PROCESSES "$NUM_PROCESSES"
  set_env JAXRUBRIC_PROCESS_ID "$PROCESS_ID"
fi

# Shown as lines a shell can replay (`export NAME=VALUE`, then `+ COMMAND`), each word
# single-quoted unless plain: on stdout with --dry-run (and nothing runs), on stderr otherwise.
quote() {
  case $1 in
    '' | *[!A-Za-z0-9_./:=@%+,-]*) printf "'%s'" "${1//\'/\'\\\'\'}" ;;
    *) printf %s "$1" ;;
  esac
}

{
  for name in "${ENV_NAMES[@]}"; do
    echo "export $name=$(quote "${!name}")"
  done
  line="+"
  for word in "${COMMAND[@]}"; do
    line+=" $(quote "$word")"
  done
  echo "$line"
} >&$((DRY_RUN ? 1 : 2))
((DRY_RUN)) || exec "${COMMAND[@]}"
