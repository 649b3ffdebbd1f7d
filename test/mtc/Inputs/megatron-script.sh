#!/bin/bash
# A launch script in the shape of Megatron-LM's examples, written for the
# import-megatron tests: env-var defaults, positional arguments, arrays built
# up with +=, quoted values, arithmetic, a condition over known values, and
# commands mtc skips because the training command needs nothing from them.

export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}

SAVE_DIR=${1:-"ckpt/tiny-run"}
DATA=${2:-"MOCK"}

mkdir -p "$(dirname "$SAVE_DIR")"
STARTED=$(date +%s)

PER_NODE=4
NODES=${MTX_NODES:-2}
WORLD=$(($PER_NODE*$NODES))
TP=${MTX_TP:-2}

LAUNCHER=(
    --nproc_per_node $PER_NODE
    --nnodes $NODES
    --master_addr ${MTX_MASTER:-localhost}   # the first node
    --master_port 29500
)

MODEL=(
    --num-layers 4
    --hidden-size 128
    --num-attention-heads 8
    --seq-length 256 --max-position-embeddings 256
)

TRAIN=(
    --micro-batch-size 2
    --global-batch-size $(( WORLD / TP * 2 * 4 ))
    --train-iters 50
    --lr 3.0e-4
    --bf16
)

PARALLEL=(--tensor-model-parallel-size $TP)
if [ "$TP" -gt 1 ] || [ -n "$MTX_SEQ_PARALLEL" ]; then
    PARALLEL+=(--sequence-parallel)
fi

DATA_ARGS=()
if [[ "$DATA" == "MOCK" ]]; then
    DATA_ARGS+=(
        "--mock-data"
        "--tokenizer-type NullTokenizer"
        "--vocab-size 1000"
        "--split '98,2,0'"
    )
else
    DATA_ARGS+=("--data-path $DATA" "--vocab-size 1000")
fi

if [ ! -f pretrain_gpt.py ]; then
    echo "run this from the Megatron-LM checkout"
    exit 1
fi

torchrun "${LAUNCHER[@]}" pretrain_gpt.py \
    ${MODEL[@]} \
    "${TRAIN[@]}" \
    ${PARALLEL[@]} \
    ${DATA_ARGS[@]} \
    --save "$SAVE_DIR" \
    --log-interval 10 2>&1 | tee "log-$STARTED.txt"
