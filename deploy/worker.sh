#!/usr/bin/env bash
# One worker of a petting run on a cluster: turns the scheduler's task index into
# `petting pipeline run CONFIG --worker I/N`. Every worker runs this same command; they
# coordinate only through the run's store (commit markers), so a worker that dies and
# is started again resumes where the store says.
#
#   Kubernetes Indexed Job: JOB_COMPLETION_INDEX (set by Kubernetes), PETTING_WORKERS
#   Slurm job array (--array=0-(N-1)): SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_COUNT
#
# PETTING_WORKERS overrides the count; PETTING names the binary (default: petting on PATH).
# Extra arguments go to `petting pipeline run` (e.g. --allow-config-change).
set -euo pipefail
config="${1:?usage: worker.sh ITERATION.yaml [petting pipeline run options]}"
shift
index="${JOB_COMPLETION_INDEX:-${SLURM_ARRAY_TASK_ID:-}}"
count="${PETTING_WORKERS:-${SLURM_ARRAY_TASK_COUNT:-}}"
if [[ -z "$index" || -z "$count" ]]; then
    echo "worker.sh: no worker index (JOB_COMPLETION_INDEX or SLURM_ARRAY_TASK_ID) or count" \
        "(PETTING_WORKERS or SLURM_ARRAY_TASK_COUNT) in the environment" >&2
    exit 2
fi
exec "${PETTING:-petting}" pipeline run "$config" --worker "$index/$count" "$@"
