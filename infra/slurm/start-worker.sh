#!/usr/bin/env bash
# Start the Prefect process worker for Slurm trials on a login node (keep it running: tmux,
# systemd --user, or a long CPU-only allocation). Run from the ATTUNE checkout on shared storage.
set -euo pipefail
cd "$(dirname "$0")/../.."
source .venv/bin/activate
: "${PREFECT_API_URL:?point PREFECT_API_URL at the Prefect server of the campaigns}"
exec prefect worker start --pool "${ATTUNE_SLURM_POOL:-attune-gpu-slurm}" --type process
