#!/usr/bin/env bash
# Rebuilds data/docs_text_document.{bin,idx}, the small real-text dataset the
# tiny preset trains on: this repository's own documentation, one paragraph
# per document, tokenized with GPT-2's BPE (vocab.json and merges.txt from
# https://huggingface.co/gpt2, passed as arguments) by mt-preprocess.
#   data/make_docs_dataset.sh VOCAB_JSON MERGES_TXT
set -euo pipefail
cd "$(dirname "$0")/.."
vocab=${1:?usage: data/make_docs_dataset.sh VOCAB_JSON MERGES_TXT}
merges=${2:?usage: data/make_docs_dataset.sh VOCAB_JSON MERGES_TXT}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp/docs.jsonl" README.md docs/architecture.md docs/data.md docs/memory.md \
    docs/spec.md docs/building.md <<'PY'
import json, sys
out = open(sys.argv[1], "w")
for path in sys.argv[2:]:
    for para in open(path, encoding="utf-8").read().split("\n\n"):
        para = para.strip()
        if para:
            out.write(json.dumps({"text": para}) + "\n")
PY
build/bin/mt-preprocess --input "$tmp/docs.jsonl" --output-prefix data/docs \
    --tokenizer-type GPT2BPETokenizer --vocab-file "$vocab" --merge-file "$merges" \
    --append-eod --workers 2
build/bin/mt-dataset inspect data/docs_text_document | head -4
