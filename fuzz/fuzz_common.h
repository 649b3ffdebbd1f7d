// What every fuzz target shares: a private temporary directory (the only
// place a target writes), whole-file writes, the seed directory, and the
// checksums a target recomputes so that mutated inputs reach the checks
// behind them instead of stopping at the first checksum.
#ifndef MT_FUZZ_FUZZ_COMMON_H
#define MT_FUZZ_FUZZ_COMMON_H

#include <cstddef>
#include <cstdint>
#include <string>

namespace mt::fuzz {

// A directory made for this process under $TMPDIR (or /tmp), removed at exit.
const std::string &temp_dir();
// Removes everything under `dir` (kept itself), or `dir` too with `self`.
void remove_tree(const std::string &dir, bool self = false);
// Writes `size` bytes to `path` (created or truncated); aborts on failure,
// which is the harness's fault, not the input's.
void write_file(const std::string &path, const void *data, size_t size);
std::string read_file(const std::string &path);
// $MT_FUZZ_SEEDS: the folder fuzz/make_seeds.sh filled (a plan, a dataset,
// ...), for targets that need a real file beside the input. Aborts with a
// message when it is not set or lacks `name`.
std::string seed_file(const std::string &name);
// Sends the library's own messages (progress lines on stdout) to /dev/null,
// so that fuzzing output stays readable and fast; libFuzzer reports on stderr.
void quiet_stdout();

// Little-endian fields.
uint64_t get_u64(const uint8_t *p);
void put_u32(uint8_t *p, uint32_t v);
void put_u64(uint8_t *p, uint64_t v);

} // namespace mt::fuzz

#endif // MT_FUZZ_FUZZ_COMMON_H
