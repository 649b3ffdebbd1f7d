// `mt-checkpoint`: look into a training checkpoint (`info`), export it as a
// Hugging Face transformers folder (`to-hf`), or start one from such a
// folder (`from-hf`); docs/checkpoints.md.
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

// Reads a Hugging Face folder's config.json into the model it describes
// (through the spec's import, `mtc import-hf`). Returns "" or one error line
// naming the file and the key (an unsupported architecture, a key mt cannot
// honour).
using HfConfigReader = std::function<std::string(const std::string &dir, HfModelSpec *model)>;

// args: everything after the program name. Returns the exit status.
int run_mt_checkpoint(const std::vector<std::string> &args, const SpecModelReader &read_spec,
                      const HfConfigReader &read_config);

} // namespace mt::rt

#endif // MT_RUNTIME_CHECKPOINT_TOOL_H
