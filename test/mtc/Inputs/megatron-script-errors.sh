#!/bin/bash
# Values mtc cannot know, each used by the training command only when
# MTX_CASE says so.
CKPT=$1
OUT_DIR=$(git rev-parse --show-toplevel)/runs
if [ -d /opt/cluster ]; then
    LAYERS=8
else
    LAYERS=2
fi
ARGS=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 16)
ARGS+=(--vocab-size 100 --micro-batch-size 1 --train-iters 1 --lr 0.1)
case "$MTX_CASE" in
    positional) ARGS+=(--save "$CKPT") ;;
    unset)      ARGS+=(--load "$MTX_LOAD_DIR") ;;
    substitution) ARGS+=(--save "$OUT_DIR") ;;
    condition)  ARGS+=(--num-layers $LAYERS) ;;
esac
python pretrain_gpt.py "${ARGS[@]}"
