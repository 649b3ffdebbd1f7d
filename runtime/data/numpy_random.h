// numpy's random streams that Megatron-LM's data pipeline draws from,
// reproduced bit for bit so that mt builds the same samples in the same order:
// RandomState (MT19937) with its legacy shuffle, default_rng (SeedSequence +
// PCG64) with Generator.integers, and numpy.sum's pairwise summation.
//
// Facts from numpy's sources (numpy/random/_mt19937.pyx, mtrand.pyx,
// bit_generator.pyx, src/distributions/distributions.c, src/pcg64/pcg64.h,
// core/src/umath/loops_utils.h.src); test/unit/runtime/data/GptDatasetTest.cpp checks
// every stream against numbers numpy printed.
#ifndef MT_RUNTIME_NUMPY_RANDOM_H
#define MT_RUNTIME_NUMPY_RANDOM_H

#include <cstddef>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace mt::rt {

// numpy.random.RandomState(seed) for an integer seed in [0, 2^32): numpy's
// legacy seeding of an integer is MT19937's init_genrand, which is exactly
// how std::mt19937 seeds itself.
class NumpyRandomState {
public:
  explicit NumpyRandomState(uint32_t seed) : mt_(seed) {}

  uint32_t next_uint32() { return static_cast<uint32_t>(mt_()); }
  // Two draws, the first one the high word.
  uint64_t next_uint64() {
    uint64_t hi = next_uint32();
    return hi << 32 | next_uint32();
  }

  // random_interval(max): uniform on [0, max], by masking draws to the
  // smallest all-ones mask covering max and rejecting values above it. Draws
  // are 32-bit while max fits 32 bits, 64-bit beyond.
  uint64_t interval(uint64_t max) {
    if (max == 0)
      return 0;
    uint64_t mask = max;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    uint64_t value;
    if (max <= 0xffffffffULL) {
      while ((value = (next_uint32() & mask)) > max) {
      }
    } else {
      while ((value = (next_uint64() & mask)) > max) {
      }
    }
    return value;
  }

  // RandomState.shuffle of a 1-D array: Fisher-Yates from the last element
  // down, swapping element i with interval(i).
  template <typename T> void shuffle(T *data, uint64_t n) {
    for (uint64_t i = n; i-- > 1;) {
      uint64_t j = interval(i);
      std::swap(data[i], data[j]);
    }
  }

private:
  std::mt19937 mt_;
};

// SeedSequence(entropy).generate_state(n_words) as 32-bit words (numpy's
// uint64 states are consecutive pairs, the low word first).
std::vector<uint32_t> numpy_seed_sequence_state(uint64_t entropy, size_t n_words);

// numpy.random.default_rng(seed): PCG64 (XSL-RR 128/64) seeded from
// SeedSequence(seed).
class NumpyDefaultRng {
public:
  explicit NumpyDefaultRng(uint64_t seed);

  uint64_t next_uint64();
  // Both halves of one 64-bit draw, the low half first.
  uint32_t next_uint32();
  // Generator.integers(low, high, dtype=numpy.int32): uniform on [low, high)
  // by Lemire's multiply-and-reject on 32-bit draws. Needs
  // INT32_MIN <= low < high <= 2^31.
  int32_t integers_int32(int64_t low, int64_t high);

private:
  void step();
  unsigned __int128 state_ = 0, inc_ = 0;
  bool has_uint32_ = false;
  uint32_t uinteger_ = 0;
};

// numpy.sum of a float64 array: pairwise summation in blocks of 128 with
// eight accumulators, as numpy's add.reduce does it; differs from a plain
// left-to-right sum in the last bit for 8 or more values.
double numpy_sum(const double *values, size_t n);

// Megatron's normalize(): w / numpy.sum(w).
std::vector<double> numpy_normalize(const std::vector<double> &weights);

} // namespace mt::rt

#endif // MT_RUNTIME_NUMPY_RANDOM_H
