// Megatron-LM's batch-size ramp-up and sample-based iteration count (batch_rampup.h).
#include "runtime/base/batch_rampup.h"

namespace mt::rt {

int64_t rampup_batch_at(const BatchRampup &r, int64_t consumed) {
  if (!r.on() || consumed > r.samples)
    return r.global;
  // megatron/core/num_microbatches_calculator.py: samples_per_increment is
  // a Python float and the step count int() of a float quotient.
  const int64_t increments = (r.global - r.start) / r.increment;
  const double perIncrement = double(r.samples) / double(increments);
  const int64_t steps = int64_t(double(consumed) / perIncrement);
  return r.start + steps * r.increment;
}

int64_t rampup_train_iters(const BatchRampup &r, int64_t train_samples,
                           std::vector<BatchChange> *changes) {
  if (!r.on())
    return r.global > 0 ? train_samples / r.global : 0;
  // megatron/training/training.py, update_train_iters.
  int64_t iterations = 0, consumed = 0, last = 0;
  while (consumed <= r.samples && consumed <= train_samples) {
    const int64_t batch = rampup_batch_at(r, consumed);
    if (changes && batch != last)
      changes->push_back({iterations, consumed, batch});
    last = batch;
    consumed += batch;
    ++iterations;
  }
  if (train_samples > consumed) {
    const int64_t constant = (train_samples - consumed) / r.global;
    // The ramp-up's samples are spent: the rest at the whole global batch.
    if (changes && constant > 0 && last != r.global)
      changes->push_back({iterations, consumed, r.global});
    iterations += constant;
  }
  return iterations;
}

} // namespace mt::rt
