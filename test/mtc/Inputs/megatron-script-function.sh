#!/bin/bash
# mtc follows no functions: the layer count comes from one.
pick_layers() {
    LAYERS=12
}
pick_layers
python pretrain_gpt.py --num-layers $LAYERS
