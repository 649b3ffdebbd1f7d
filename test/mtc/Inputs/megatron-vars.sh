#!/bin/bash
# A launch script's variables: two set here, one from the environment.
GPUS_PER_NODE=8
DATA_PATH=/data/web_text_document
torchrun --nproc_per_node $GPUS_PER_NODE pretrain_gpt.py \
    --num-layers 24 \
    --data-path "$DATA_PATH" \
    --save ${CHECKPOINT_PATH}/run1
