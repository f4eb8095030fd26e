#!/bin/bash
# bash examples/torchrun_multinode.sh NODE_RANK MASTER_ADDR   (run once on every node)
# FSDP2 over NNODES nodes x NPROC GPUs with torchrun; Lightning detects torchrun (TorchElasticEnvironment)
# and does not spawn processes itself. --trainer.num_nodes and --trainer.devices must match torchrun's.
# Tested on one CPU machine as two "nodes" of one process each:
#   NNODES=2 NPROC=1 EXTRA="--trainer.accelerator=cpu --trainer.precision=32-true" bash examples/torchrun_multinode.sh 0 127.0.0.1 &
#   NNODES=2 NPROC=1 EXTRA="--trainer.accelerator=cpu --trainer.precision=32-true" bash examples/torchrun_multinode.sh 1 127.0.0.1
set -euo pipefail
NODE_RANK=${1:?node rank}
MASTER_ADDR=${2:?address of node 0}
NNODES=${NNODES:-2}
NPROC=${NPROC:-8}
PORT=${PORT:-29500}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
# shellcheck disable=SC2086
torchrun --nnodes "$NNODES" --nproc_per_node "$NPROC" --node_rank "$NODE_RANK" \
  --master_addr "$MASTER_ADDR" --master_port "$PORT" \
  -m lit_prunedpo fit --config configs/fsdp.yaml \
  --trainer.num_nodes="$NNODES" --trainer.devices="$NPROC" ${EXTRA:-}
