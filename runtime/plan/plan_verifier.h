// plan.bin's semantic verification (plan_verifier.cpp), internal to
// runtime/plan: the reader runs it; everyone else opens plans through
// PlanFile (plan_reader.h), which never returns an unverified plan.
#ifndef MT_RUNTIME_PLAN_VERIFIER_H
#define MT_RUNTIME_PLAN_VERIFIER_H

#include "plan_generated.h"

#include <cstddef>
#include <cstdint>
#include <string>

namespace mt::rt::detail {

// "" when the plan passes every semantic check; otherwise the part of the
// error line after the file name (the reader adds the name and the remedy).
std::string verify_plan(const mt::plan::Plan &plan);

// plan_training_check.cpp: the plan's text (valid UTF-8), its parallel
// sizes and buffer sizes, and the training table's scalars in their ranges;
// run first.
std::string verify_training(const mt::plan::Plan &plan);
// The named inputs and outputs of the programs the training loop runs,
// present with the shapes and dtypes it assumes; run last (it follows
// value indices the other checks have verified).
std::string verify_loop_io(const mt::plan::Plan &plan);

// Digits in groups of three (1,234,567), for the messages of both.
std::string grouped(uint64_t v);

// A FlatBuffers vector's length, 0 for an absent one.
template <class T> size_t vsize(const flatbuffers::Vector<T> *v) { return v ? v->size() : 0; }

} // namespace mt::rt::detail

#endif // MT_RUNTIME_PLAN_VERIFIER_H
