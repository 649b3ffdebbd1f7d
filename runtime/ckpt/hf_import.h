// A Hugging Face transformers model folder as an mt checkpoint
// (`mt-checkpoint from-hf`, docs/checkpoints.md): config.json and
// model.safetensors (or the shards model.safetensors.index.json lists) are
// read, every tensor checked against the plan's spec through the table of
// hf_mapping.h (the export's, read the other way), the vocabulary padded to
// the spec's padded size as Megatron pads it (the last row repeated), and
// the weights saved in the plan's parallel layout at iteration 0 with a
// fresh optimizer state (checkpoint_layout.h, save_initial_checkpoint).
#ifndef MT_RUNTIME_HF_IMPORT_H
#define MT_RUNTIME_HF_IMPORT_H

#include "runtime/ckpt/checkpoint_layout.h"
#include "runtime/ckpt/hf_mapping.h"

#include <map>
#include <string>

namespace mt::rt {

// The folder's weights as mt's whole tensors for `m` as `arch`
// (hf_architecture's): F32, BF16 and F16 read as f32. Returns "" or one
// error line naming the file and the Hugging Face tensor: one missing, one
// of a shape the spec does not make (with the spec keys that make it), one
// the model does not have, a dtype other than the three, a damaged file.
// *vocab_rows gets the rows of Hugging Face's embedding.
std::string read_hf_weights(const std::string &dir, const HfModelSpec &m, const std::string &arch,
                            std::map<std::string, WholeWeight> *out, int64_t *vocab_rows);

// "" when the model config.json describes (`from_config`, read by the
// spec's import) is the spec's (`m`); else one line naming the first spec
// key that differs, both values, and the fix.
std::string compare_hf_models(const HfModelSpec &from_config, const HfModelSpec &m,
                              const std::string &config_path);

// The whole import: reads the folder `dir`, checks it against `m` (the
// plan's spec) and `from_config` (its config.json's model, when given), and
// writes out_dir (which must not exist or be empty) in the layout of `plan`.
// Returns "" or one error line; *summary gets one line on what was written.
std::string import_hf(const std::string &dir, const HfModelSpec &m,
                      const HfModelSpec *from_config, const mt::plan::Plan &plan,
                      const std::string &plan_path, const std::string &out_dir,
                      std::string *summary);

} // namespace mt::rt

#endif // MT_RUNTIME_HF_IMPORT_H
