// `mt-checkpoint`: look into a training checkpoint (`info`) and export it as
// a Hugging Face transformers folder (`to-hf`); docs/checkpoints.md.
#ifndef MT_RUNTIME_CHECKPOINT_TOOL_H
#define MT_RUNTIME_CHECKPOINT_TOOL_H

#include "runtime/ckpt/hf_export.h"

#include <functional>
#include <string>
#include <vector>

namespace mt::rt {

// Reads the model of a checkpoint's spec (its TOML, as the checkpoint
// stores it; `source` names it in errors). Returns "" or one error line.
// The tool's main supplies it (the spec's parser is not part of the runtime).
using SpecModelReader = std::function<std::string(
    const std::string &toml, const std::string &source, HfModelSpec *model)>;

// args: everything after the program name. Returns the exit status.
int run_mt_checkpoint(const std::vector<std::string> &args, const SpecModelReader &read_spec);

} // namespace mt::rt

#endif // MT_RUNTIME_CHECKPOINT_TOOL_H
