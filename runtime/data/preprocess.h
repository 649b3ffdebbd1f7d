// `mt-preprocess`: raw text or jsonl -> Megatron indexed dataset, with the
// flags of Megatron-LM's tools/preprocess_data.py.
#ifndef MT_RUNTIME_PREPROCESS_H
#define MT_RUNTIME_PREPROCESS_H

#include <string>
#include <vector>

namespace mt::rt {

// args: everything after the program name. Returns the exit status.
int run_mt_preprocess(const std::vector<std::string> &args);

} // namespace mt::rt

#endif // MT_RUNTIME_PREPROCESS_H
