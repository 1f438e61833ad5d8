#!/usr/bin/env bash
# Runs a jaxrubric command on every worker of a Cloud TPU VM slice: JAX multi-controller SPMD,
# one process per worker, all started together over `gcloud ... ssh --worker=all`. On a TPU VM
# `jax.distributed.initialize()` finds the slice's coordinator itself (from the metadata server);
# the launcher asks for that with JAXRUBRIC_COORDINATOR_ADDRESS=auto (read by
# `jaxrubric.distributed`), so the command needs no coordinator flags. Run with -h for options.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch/tpu_pod.sh --name NAME --zone ZONE [options] -- COMMAND [ARG...]

Runs COMMAND on every worker of the Cloud TPU VM slice NAME (JAX multi-controller SPMD), e.g.

  launch/tpu_pod.sh --name rubric-v5p --zone us-east5-a --accelerator-type v5p-32 --create \
    -- jaxrubric train --config configs/qwen3_8b_dynamic_rubric.py --workdir gs://BUCKET/run1

Steps: check the slice exists (gcloud compute tpus tpu-vm describe) or create it (--create);
install jaxrubric on every worker (--install); run COMMAND on all workers at once; relaunch it
when it ends early (below). COMMAND runs
in DIR (--remote-dir, relative to the worker's home) under the worker's login shell (bash on
TPU VM images), with JAXRUBRIC_COORDINATOR_ADDRESS=auto (jax finds the slice's coordinator
itself) and PYTHONUNBUFFERED=1. Every worker appends its output to DIR/logs/worker-<i>.log;
worker 0's output is also streamed here. Another worker's log:
  gcloud compute tpus tpu-vm ssh NAME --zone ZONE --worker=1 \
    --command 'tail -f DIR/logs/worker-1.log'

Slice:
  --name NAME              TPU VM name                           (env JAXRUBRIC_TPU_NAME)
  --zone ZONE              zone, e.g. us-east5-a                 (env JAXRUBRIC_TPU_ZONE)
  --project PROJECT        GCP project (default: gcloud's)       (env JAXRUBRIC_TPU_PROJECT)
  --accelerator-type TYPE  e.g. v4-32, v5p-8, v5litepod-16, v6e-8 (env JAXRUBRIC_TPU_TYPE);
                           needed with --create
  --runtime-version V      TPU software version (env JAXRUBRIC_TPU_RUNTIME); default from TYPE:
                           v6e v2-alpha-tpuv6e, v5p v2-alpha-tpuv5, v5litepod/v5e
                           v2-alpha-tpuv5-lite, v4 and older tpu-ubuntu2204-base
  --create                 create the slice if it does not exist (else reuse it; without
                           --create a missing slice is an error)
  --create-arg ARG         extra argument for `tpu-vm create`, repeatable (e.g. --spot)

Install (on every worker):
  --install copy           default: this checkout (without .git, .venv, caches) as a tarball,
                           `gcloud ... scp --worker=all`, unpacked in DIR, pip install -e '.[tpu]'
  --install pip            pip install 'jaxrubric[tpu] @ git+URL' (--repo), and this checkout's
                           configs/ copied to DIR so config paths in COMMAND resolve
  --install none           nothing: jaxrubric is already installed (COMMAND still runs in DIR)
  --repo URL               git URL for --install pip, optionally URL@REF   (env JAXRUBRIC_REPO)
  --remote-dir DIR         run folder on the workers (default: jaxrubric)

Run:
  --attempts N             start COMMAND at most N times (default 3; 1: never relaunch)
                                                                 (env JAXRUBRIC_TPU_ATTEMPTS)
  --ready-timeout S        before a relaunch, wait up to S seconds for the slice to be READY
                           again (default 1800)
  --env KEY=VALUE          exported for COMMAND on every worker, repeatable
  --ssh-arg ARG            extra argument for every `tpu-vm ssh`/`scp`, repeatable
                           (e.g. --internal-ip, --tunnel-through-iap)
  --dry-run                print every command (prefixed "+ ") and run nothing; the describe
                           check is printed, and the slice taken to exist unless --create is
                           given, so --create shows the create command
  --assume-exists          with --dry-run --create: take the slice to exist (show the reuse path)
  -h, --help               this text

Relaunching: when COMMAND ends with a non-zero status (a lost worker exits 75, a lost ssh
connection 255, a preempted slice anything) or says it was stopped by SIGTERM (a preemption
notice: the round is saved and the run exits 0), the slice is described until it is READY, any
process left of the run is stopped on every worker (pkill -f '[j]axrubric'), and COMMAND is
started again on every worker, with the same arguments and so the same workdir: the run resumes
from its last checkpoint. One line says why. There is no relaunch after exit 2 (jaxrubric's
usage, config and data errors, a locked workdir: they would fail again), after the same failure
twice in a row (the same status and last line of worker 0's output, each within 10 minutes of
its start), or once N attempts are spent.

Ctrl-C stops the local ssh and worker 0; stop the job on every worker with
  gcloud compute tpus tpu-vm ssh NAME --zone ZONE --worker=all --command "pkill -f '[j]axrubric'"
EOF
}

die() {
  echo "tpu_pod.sh: error: $*" >&2
  echo "(launch/tpu_pod.sh -h for help)" >&2
  exit 2
}

NAME=${JAXRUBRIC_TPU_NAME:-}
ZONE=${JAXRUBRIC_TPU_ZONE:-}
PROJECT=${JAXRUBRIC_TPU_PROJECT:-}
TYPE=${JAXRUBRIC_TPU_TYPE:-}
RUNTIME=${JAXRUBRIC_TPU_RUNTIME:-}
REPO=${JAXRUBRIC_REPO:-}
INSTALL=copy
REMOTE_DIR=jaxrubric
CREATE=0
ASSUME_EXISTS=0
DRY_RUN=0
ATTEMPTS=${JAXRUBRIC_TPU_ATTEMPTS:-3}
READY_TIMEOUT=1800
POLL_S=${JAXRUBRIC_TPU_POLL_S:-30}  # between describes while waiting for READY
QUICK_S=600  # a failure this soon after its start, twice alike, is not retried
CREATE_ARGS=()
SSH_ARGS=()
ENVS=()

default_runtime() {
  case $1 in
    v6e-*) echo v2-alpha-tpuv6e ;;
    v5p-*) echo v2-alpha-tpuv5 ;;
    v5litepod-* | v5e-*) echo v2-alpha-tpuv5-lite ;;
    v4-* | v3-* | v2-*) echo tpu-ubuntu2204-base ;;
    *) return 1 ;;
  esac
}

while (($#)); do
  if [[ $1 == --*=* ]]; then  # --flag=value -> --flag value
    set -- "${1%%=*}" "${1#*=}" "${@:2}"
  fi
  case $1 in
    -h | --help) usage; exit 0 ;;
    --create) CREATE=1; shift; continue ;;
    --assume-exists) ASSUME_EXISTS=1; shift; continue ;;
    --dry-run) DRY_RUN=1; shift; continue ;;
    --) shift; break ;;
    --name | --zone | --project | --accelerator-type | --runtime-version | --install | --repo | \
      --remote-dir | --create-arg | --ssh-arg | --env | --attempts | --ready-timeout)
      (($# >= 2)) || die "$1 needs a value" ;;
    *) die "unknown option $1 (the command goes after --)" ;;
  esac
  case $1 in
    --name) NAME=$2 ;;
    --zone) ZONE=$2 ;;
    --project) PROJECT=$2 ;;
    --accelerator-type) TYPE=$2 ;;
    --runtime-version) RUNTIME=$2 ;;
    --install) INSTALL=$2 ;;
    --repo) REPO=$2 ;;
    --remote-dir) REMOTE_DIR=$2 ;;
    --create-arg) CREATE_ARGS+=("$2") ;;
    --ssh-arg) SSH_ARGS+=("$2") ;;
    --env) ENVS+=("$2") ;;
    --attempts) ATTEMPTS=$2 ;;
    --ready-timeout) READY_TIMEOUT=$2 ;;
  esac
  shift 2
done
COMMAND=("$@")

[[ -n $NAME ]] || die "missing --name (the TPU VM name)"
[[ -n $ZONE ]] || die "missing --zone"
((${#COMMAND[@]})) || die "missing the command to run, after --"
case $INSTALL in
  copy | none) ;;
  pip) [[ -n $REPO ]] || die "--install pip needs --repo URL (a git URL, optionally URL@REF)" ;;
  *) die "--install must be copy, pip or none, got '$INSTALL'" ;;
esac
for kv in "${ENVS[@]+"${ENVS[@]}"}"; do
  [[ $kv =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env takes KEY=VALUE, got '$kv'"
done
[[ $ATTEMPTS =~ ^[1-9][0-9]*$ ]] || die "--attempts must be a positive integer, got '$ATTEMPTS'"
[[ $READY_TIMEOUT =~ ^[0-9]+$ ]] || die "--ready-timeout must be seconds, got '$READY_TIMEOUT'"
if ((CREATE)); then
  [[ -n $TYPE ]] || die "--create needs --accelerator-type (e.g. v5p-8, v5litepod-16)"
  if [[ -z $RUNTIME ]]; then
    RUNTIME=$(default_runtime "$TYPE") ||
      die "no default runtime version for accelerator type '$TYPE'; give --runtime-version"
  fi
fi
if ((ASSUME_EXISTS && !DRY_RUN)); then
  die "--assume-exists only applies to --dry-run"
fi

SOURCE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)  # the checkout this script is in
LOCATION=(--zone "$ZONE")
[[ -z $PROJECT ]] || LOCATION+=(--project "$PROJECT")

# Every command is traced, one shell word per argument (single-quoted unless plain), so a traced
# line can be pasted back into a shell: on stdout with --dry-run (and then not run), on stderr
# otherwise, like `set -x`.
quote() {
  case $1 in
    '' | *[!A-Za-z0-9_./:=@%+,-]*) printf "'%s'" "${1//\'/\'\\\'\'}" ;;
    *) printf %s "$1" ;;
  esac
}

trace() {
  local line="+" word
  for word in "$@"; do
    line+=" $(quote "$word")"
  done
  if ((DRY_RUN)); then
    echo "$line"
  else
    echo "$line" >&2
  fi
}

run() {
  trace "$@"
  ((DRY_RUN)) || "$@"
}

on_all_workers() {  # on_all_workers SHELL_COMMAND
  run gcloud compute tpus tpu-vm ssh "$NAME" "${LOCATION[@]}" --worker=all \
    "${SSH_ARGS[@]+"${SSH_ARGS[@]}"}" --command "$1"
}

# 1. The slice: reuse it if it exists (and is READY), else create it (--create) or stop.
describe=(gcloud compute tpus tpu-vm describe "$NAME" "${LOCATION[@]}" "--format=value(state)")
trace "${describe[@]}"
if ((DRY_RUN)); then
  if ((ASSUME_EXISTS || !CREATE)); then state=READY; else state=; fi
else
  state=$("${describe[@]}" 2>/dev/null) || state=
fi
if [[ -n $state ]]; then
  [[ $state == READY ]] || die "TPU VM $NAME in $ZONE is $state, not READY; wait, or delete it" \
    "(gcloud compute tpus tpu-vm delete $NAME --zone $ZONE) and rerun with --create"
  echo "# TPU VM $NAME in $ZONE exists: reusing it" >&2
elif ((CREATE)); then
  echo "# TPU VM $NAME not found in $ZONE: creating a $TYPE slice" >&2
  run gcloud compute tpus tpu-vm create "$NAME" "${LOCATION[@]}" --accelerator-type "$TYPE" \
    --version "$RUNTIME" "${CREATE_ARGS[@]+"${CREATE_ARGS[@]}"}"
else
  die "TPU VM $NAME not found in zone $ZONE (or gcloud cannot describe it); pass --create" \
    "--accelerator-type TYPE to create it"
fi

# 2. jaxrubric on every worker.
dir=$(printf %q "$REMOTE_DIR")
case $INSTALL in
  copy)
    archive=${TMPDIR:-/tmp}/jaxrubric-$NAME.tar.gz
    run tar -czf "$archive" --exclude=./.git --exclude=./.venv --exclude=./.ci-venv \
      --exclude=./build --exclude=./dist --exclude='./workdir*' --exclude=./.pytest_cache \
      --exclude=./.hypothesis --exclude=__pycache__ --exclude='*.egg-info' -C "$SOURCE" .
    run gcloud compute tpus tpu-vm scp "$archive" "$NAME:jaxrubric.tar.gz" "${LOCATION[@]}" \
      --worker=all "${SSH_ARGS[@]+"${SSH_ARGS[@]}"}"
    on_all_workers "mkdir -p $dir && tar -xzf jaxrubric.tar.gz -C $dir && cd $dir &&\
 python3 -m pip install -q -e $(printf %q '.[tpu]')"
    ;;
  pip)
    on_all_workers "mkdir -p $dir && python3 -m pip install -q\
 $(printf %q "jaxrubric[tpu] @ git+$REPO")"
    run gcloud compute tpus tpu-vm scp --recurse "$SOURCE/configs" "$NAME:$REMOTE_DIR/" \
      "${LOCATION[@]}" --worker=all "${SSH_ARGS[@]+"${SSH_ARGS[@]}"}"
    ;;
  none) ;;
esac

# 3. The command on all workers at once. Each worker learns its index from the metadata server
# (what JAX's TPU cluster detection reads too); worker 0 tees its output back to this terminal.
# pip puts the `jaxrubric` script in ~/.local/bin, which a non-login ssh shell lacks on PATH.
# JAXRUBRIC_COORDINATOR_ADDRESS=auto: `jaxrubric.distributed` lets jax detect the pod, which it
# does not do unasked (the detection queries the metadata server); --env may override it.
metadata=http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number
script="set -o pipefail; mkdir -p $dir/logs && cd $dir || exit 1; "
script+="W=\$(curl -sf -H Metadata-Flavor:Google $metadata) || "
script+="{ echo \"cannot read agent-worker-number from the metadata server\" >&2; exit 1; }; "
script+="export PATH=\"\$HOME/.local/bin:\$PATH\" PYTHONUNBUFFERED=1 "
script+="JAXRUBRIC_COORDINATOR_ADDRESS=auto; "
for kv in "${ENVS[@]+"${ENVS[@]}"}"; do
  script+="export $(printf %q "$kv"); "
done
command=$(printf ' %q' "${COMMAND[@]}")
script+="if [ \"\$W\" = 0 ]; then${command} 2>&1 | tee -a logs/worker-0.log; "
script+="else${command} >>logs/worker-\$W.log 2>&1; fi"
echo "# worker logs: $REMOTE_DIR/logs/worker-<i>.log on each worker; streaming worker 0's" >&2
if ((DRY_RUN)); then
  on_all_workers "$script"
  exit 0
fi

wait_until_ready() {  # the slice READY again within READY_TIMEOUT seconds, or stop
  local waited=0 now
  while now=$("${describe[@]}" 2>/dev/null) || now=; [[ $now != READY ]]; do
    ((waited < READY_TIMEOUT)) || die "TPU VM $NAME is ${now:-not found} after waiting" \
      "${READY_TIMEOUT} s for it to be READY; not relaunching"
    sleep "$POLL_S"
    waited=$((waited + POLL_S))
  done
}

# 4. Run, and relaunch what ends early (see -h).
output=$(mktemp "${TMPDIR:-/tmp}/tpu_pod.XXXXXX")
trap 'rm -f "$output"' EXIT
attempt=1 last_failure=
while :; do
  started=$SECONDS
  status=0
  on_all_workers "$script" | tee "$output" || status=$?
  seconds=$((SECONDS - started))
  last_line=$(grep -v '^[[:space:]]*$' "$output" | tail -n 1 | tr -d '\r') || last_line=
  preempted=0
  grep -q "stopped by SIGTERM after round" "$output" && preempted=1
  ((status == 0 && !preempted)) && exit 0
  if ((preempted && status == 0)); then
    what="stopped by a preemption notice after ${seconds} s"
  else
    what="ended with exit $status after ${seconds} s"
  fi
  said="# tpu_pod.sh: attempt $attempt of $ATTEMPTS $what"
  failure="$status $last_line"
  if ((status == 2)); then
    echo "$said (a usage, config or data error, or a locked workdir): not relaunching" >&2
    exit 2
  elif ((seconds < QUICK_S)) && [[ $failure == "$last_failure" ]]; then
    echo "$said, the same quick failure as attempt $((attempt - 1)): not relaunching" >&2
    exit $((status ? status : 75))
  elif ((attempt >= ATTEMPTS)); then
    echo "$said; no attempts left (--attempts $ATTEMPTS)" >&2
    exit $((status ? status : 75))
  fi
  last_failure=
  ((seconds < QUICK_S)) && last_failure=$failure
  wait_until_ready
  echo "$said; TPU VM $NAME is READY: relaunching every worker with the same command and" \
    "workdir (attempt $((attempt + 1)))" >&2
  on_all_workers "pkill -f '[j]axrubric'; true" || true
  attempt=$((attempt + 1))
done
