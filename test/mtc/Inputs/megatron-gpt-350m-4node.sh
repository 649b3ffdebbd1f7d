#!/bin/bash
# Megatron-LM's distributed GPT example (examples/pretrain_gpt_distributed_with_mp.sh)
# on 4 nodes of 8 GPUs, with its variables written out as `set -x` shows them.
export CUDA_DEVICE_MAX_CONNECTIONS=1

torchrun --nproc_per_node 8 --nnodes 4 --node_rank 0 \
    --master_addr node001 --master_port 6000 \
    pretrain_gpt.py \
    --tensor-model-parallel-size 4 \
    --pipeline-model-parallel-size 2 \
    --num-layers 24 \
    --hidden-size 1024 \
    --num-attention-heads 16 \
    --micro-batch-size 4 \
    --global-batch-size 512 \
    --seq-length 1024 \
    --max-position-embeddings 1024 \
    --train-iters 500000 \
    --lr-decay-iters 320000 \
    --save /checkpoints/gpt-350m \
    --load /checkpoints/gpt-350m \
    --data-path /data/my-gpt2_text_document \
    --vocab-file /data/gpt2-vocab.json \
    --merge-file /data/gpt2-merges.txt \
    --split 949,50,1 \
    --distributed-backend nccl \
    --lr 0.00015 \
    --lr-decay-style cosine \
    --min-lr 1.0e-5 \
    --weight-decay 1e-2 \
    --clip-grad 1.0 \
    --lr-warmup-fraction .01 \
    --log-interval 100 \
    --save-interval 10000 \
    --eval-interval 1000 \
    --eval-iters 10 \
    --fp16 2>&1 | tee train.log
