// Megatron-LM's batch-size ramp-up (--rampup-batch-size) and the iteration
// count of sample-based training (--train-samples), shared by the spec's
// checks, the compiler's summary and mtrun's loop so all three agree.
#ifndef MT_RUNTIME_BASE_BATCH_RAMPUP_H
#define MT_RUNTIME_BASE_BATCH_RAMPUP_H

#include <cstdint>
#include <vector>

namespace mt::rt {

// [start, increment, samples] ramping the global batch up to `global`.
// `start == 0` means no ramp-up: every iteration uses `global`.
struct BatchRampup {
  int64_t start = 0, increment = 0, samples = 0;
  int64_t global = 0;
  bool on() const { return start > 0; }
};

// The global batch once `consumed` samples are trained, as Megatron-Core's
// RampupBatchsizeNumMicroBatchesCalculator.update computes it: `global`
// after the ramp-up's samples, else start + increment * int(consumed /
// (samples / num_increments)), the division in doubles as Python's. Needs
// start < global, (global - start) % increment == 0 and samples > 0 (the
// spec checks them).
int64_t rampup_batch_at(const BatchRampup &r, int64_t consumed);

// Where the batch changes over a run: iteration `iteration` (0-based) is the
// first with `batch`.
struct BatchChange {
  int64_t iteration, consumed, batch;
};

// The iterations `train_samples` buy, as Megatron's update_train_iters
// counts them: with no ramp-up train_samples / global; with one, an
// iteration for every batch taken while the samples consumed are at most
// the ramp-up's and at most train_samples, then (train_samples - consumed) /
// global more (a partial last batch is dropped). `changes`, when given,
// receives the first iteration of every batch size the ramp-up reaches.
int64_t rampup_train_iters(const BatchRampup &r, int64_t train_samples,
                           std::vector<BatchChange> *changes = nullptr);

} // namespace mt::rt

#endif // MT_RUNTIME_BASE_BATCH_RAMPUP_H
