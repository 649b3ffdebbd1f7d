// numpy's random streams and pairwise sum (see numpy_random.h).
#include "runtime/data/numpy_random.h"

namespace mt::rt {

namespace {

// SeedSequence's hashing constants (numpy/random/bit_generator.pyx).
constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875;
constexpr uint32_t kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
constexpr int kXShift = 16;
constexpr size_t kPoolSize = 4;

uint32_t hashmix(uint32_t value, uint32_t *hash_const) {
  value ^= *hash_const;
  *hash_const *= kMultA;
  value *= *hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t result = kMixMultL * x - kMixMultR * y;
  result ^= result >> kXShift;
  return result;
}

// PCG64's 128-bit LCG multiplier.
constexpr unsigned __int128 kPcgMultiplier =
    (static_cast<unsigned __int128>(2549297995355413924ULL) << 64) | 4865540595714422341ULL;

} // namespace

std::vector<uint32_t> numpy_seed_sequence_state(uint64_t entropy, size_t n_words) {
  // An integer's entropy is its 32-bit words, least significant first; 0 is [0].
  std::vector<uint32_t> words;
  do {
    words.push_back(static_cast<uint32_t>(entropy));
    entropy >>= 32;
  } while (entropy);

  uint32_t pool[kPoolSize];
  uint32_t hash_const = kInitA;
  for (size_t i = 0; i < kPoolSize; ++i)
    pool[i] = hashmix(i < words.size() ? words[i] : 0, &hash_const);
  for (size_t src = 0; src < kPoolSize; ++src)
    for (size_t dst = 0; dst < kPoolSize; ++dst)
      if (src != dst)
        pool[dst] = mix(pool[dst], hashmix(pool[src], &hash_const));
  for (size_t src = kPoolSize; src < words.size(); ++src)
    for (size_t dst = 0; dst < kPoolSize; ++dst)
      pool[dst] = mix(pool[dst], hashmix(words[src], &hash_const));

  std::vector<uint32_t> out(n_words);
  uint32_t h = kInitB;
  for (size_t i = 0; i < n_words; ++i) {
    uint32_t v = pool[i % kPoolSize];
    v ^= h;
    h *= kMultB;
    v *= h;
    v ^= v >> kXShift;
    out[i] = v;
  }
  return out;
}

NumpyDefaultRng::NumpyDefaultRng(uint64_t seed) {
  // PCG64 takes generate_state(4, uint64): state from words 0-1 (high 64 bits
  // first), the stream from words 2-3.
  std::vector<uint32_t> w = numpy_seed_sequence_state(seed, 8);
  auto u64 = [&](int k) { return static_cast<uint64_t>(w[2 * k]) | uint64_t(w[2 * k + 1]) << 32; };
  unsigned __int128 initstate = static_cast<unsigned __int128>(u64(0)) << 64 | u64(1);
  unsigned __int128 initseq = static_cast<unsigned __int128>(u64(2)) << 64 | u64(3);
  state_ = 0;
  inc_ = initseq << 1 | 1;
  step();
  state_ += initstate;
  step();
}

void NumpyDefaultRng::step() { state_ = state_ * kPcgMultiplier + inc_; }

uint64_t NumpyDefaultRng::next_uint64() {
  step();
  uint64_t folded = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
  unsigned rot = static_cast<unsigned>(state_ >> 122);
  return (folded >> rot) | (folded << ((64 - rot) & 63));
}

uint32_t NumpyDefaultRng::next_uint32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return uinteger_;
  }
  uint64_t next = next_uint64();
  has_uint32_ = true;
  uinteger_ = static_cast<uint32_t>(next >> 32);
  return static_cast<uint32_t>(next);
}

int32_t NumpyDefaultRng::integers_int32(int64_t low, int64_t high) {
  const uint32_t rng = static_cast<uint32_t>(high - 1 - low);
  const uint32_t off = static_cast<uint32_t>(low);
  if (rng == 0)
    return static_cast<int32_t>(low); // numpy draws nothing for a one-value range
  if (rng == 0xffffffffU)
    return static_cast<int32_t>(off + next_uint32());
  const uint32_t rng_excl = rng + 1;
  uint64_t m = static_cast<uint64_t>(next_uint32()) * rng_excl;
  uint32_t leftover = static_cast<uint32_t>(m);
  if (leftover < rng_excl) {
    const uint32_t threshold = (0xffffffffU - rng) % rng_excl;
    while (leftover < threshold) {
      m = static_cast<uint64_t>(next_uint32()) * rng_excl;
      leftover = static_cast<uint32_t>(m);
    }
  }
  return static_cast<int32_t>(off + static_cast<uint32_t>(m >> 32));
}

double numpy_sum(const double *v, size_t n) {
  if (n < 8) {
    double res = 0.0;
    for (size_t i = 0; i < n; ++i)
      res += v[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j)
      r[j] = v[j];
    size_t i = 8;
    for (; i < n - n % 8; i += 8)
      for (int j = 0; j < 8; ++j)
        r[j] += v[i + j];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i)
      res += v[i];
    return res;
  }
  size_t half = n / 2;
  half -= half % 8;
  return numpy_sum(v, half) + numpy_sum(v + half, n - half);
}

std::vector<double> numpy_normalize(const std::vector<double> &weights) {
  double sum = numpy_sum(weights.data(), weights.size());
  std::vector<double> out(weights.size());
  for (size_t i = 0; i < weights.size(); ++i)
    out[i] = weights[i] / sum;
  return out;
}

} // namespace mt::rt
