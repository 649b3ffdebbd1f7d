// `mt-dataset`: inspect and verify Megatron indexed datasets, and print the
// training samples Megatron builds from them.
#ifndef MT_RUNTIME_DATASET_TOOL_H
#define MT_RUNTIME_DATASET_TOOL_H

#include <string>
#include <vector>

namespace mt::rt {

// args: everything after the program name. Returns the exit status.
int run_mt_dataset(const std::vector<std::string> &args);

} // namespace mt::rt

#endif // MT_RUNTIME_DATASET_TOOL_H
