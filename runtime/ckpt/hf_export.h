// A checkpoint as a Hugging Face transformers model folder
// (`mt-checkpoint to-hf`, docs/checkpoints.md): config.json,
// generation_config.json, model.safetensors (or shards with
// model.safetensors.index.json) and the tokenizer's files, written into a staging directory beside
// the target and renamed into place, so nothing half written is left.
//
// The model's architecture comes from the spec (the tool reads it; this
// room reads no TOML). A GPT-2-style model (learned absolute positions,
// LayerNorm, tanh GeLU) becomes GPT2LMHeadModel, a Llama-style one (RoPE,
// RMSNorm, SwiGLU) LlamaForCausalLM; what neither class can express is
// refused with the spec key named. The weights change names and layouts
// by the table of hf_mapping.h (mt keeps Megatron-LM's), which the import
// reads the other way; the padded vocabulary rows are cut to the
// tokenizer's vocabulary unless kept.
#ifndef MT_RUNTIME_HF_EXPORT_H
#define MT_RUNTIME_HF_EXPORT_H

#include "runtime/ckpt/checkpoint_layout.h"
#include "runtime/ckpt/hf_mapping.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mt::rt {

struct HfExportOptions {
  std::string dtype = "fp32";      // fp32, bf16 or fp16
  bool keep_padded_vocab = false;  // keep the embedding's padded rows
  uint64_t max_shard_bytes = 5000000000; // above it, model-0000N-of-0000M.safetensors
};

// The tensors of the Hugging Face model, in its names and layouts, from
// mt's whole weights; f32. Returns "" or one error line (a missing tensor
// or a shape that is not the spec's, named).
struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};
std::string hf_tensors(const HfModelSpec &m, const std::string &arch,
                       const std::map<std::string, WholeWeight> &weights, bool keep_padded_vocab,
                       std::vector<HfTensor> *out);

// The tokenizer's files for the folder (name -> bytes), so that
// AutoTokenizer.from_pretrained loads it too: GPT2BPETokenizer's vocab.json
// and merges.txt, HuggingFaceTokenizer's tokenizer.json (and, from a
// directory, its tokenizer_config.json and special_tokens_map.json), each
// with a tokenizer_config.json when the source has none. Files the spec
// names that are not here, and the tokenizer types not exported, leave
// *files empty with *why saying so (the export goes on without them).
// Returns "" or one error line (a file that is here but cannot be read).
std::string hf_tokenizer_files(const HfModelSpec &m, std::map<std::string, std::string> *files,
                               std::string *why);

// config.json and generation_config.json's text.
std::string hf_config_json(const HfModelSpec &m, const std::string &arch,
                           const HfExportOptions &o);
std::string hf_generation_config_json(const HfModelSpec &m);

// "5GB", "500MB", "10KiB", "1000": bytes (decimal units as transformers
// reads them, KiB/MiB/GiB binary); false when it is none of those or 0.
bool parse_shard_size(const std::string &text, uint64_t *bytes);

// The whole export: reads the checkpoint in load_dir (its iteration, or
// `iteration` when >= 0), converts, writes out_dir atomically (out_dir must
// not exist, or be an empty directory). Returns "" or one error line;
// *summary gets one line on what was written.
std::string export_hf(const std::string &load_dir, int64_t iteration, const HfModelSpec &m,
                      const HfExportOptions &o, const std::string &out_dir,
                      std::string *summary);

} // namespace mt::rt

#endif // MT_RUNTIME_HF_EXPORT_H
