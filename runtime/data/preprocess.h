// `mt-preprocess`: raw text or jsonl -> Megatron indexed dataset, with the
// flags of Megatron-LM's tools/preprocess_data.py.
#ifndef MT_RUNTIME_PREPROCESS_H
#define MT_RUNTIME_PREPROCESS_H

#include <string>
#include <vector>

namespace mt::rt {

// args: everything after the program name. Returns the exit status.
int run_mt_preprocess(const std::vector<std::string> &args);

// Python's repr() of a float (the shortest digits that read back exactly;
// fixed notation for exponents -4 to 15, else d.ddde+XX), as the f-strings
// of Megatron's progress line print its rates.
std::string python_float_repr(double v);

} // namespace mt::rt

#endif // MT_RUNTIME_PREPROCESS_H
