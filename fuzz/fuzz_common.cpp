// fuzz_common.h: the temporary directory and file helpers of the fuzz targets.
#include "fuzz/fuzz_common.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace mt::fuzz {

namespace {

std::string g_temp;

void remove_temp() {
  if (!g_temp.empty())
    remove_tree(g_temp, true);
}

[[noreturn]] void harness_error(const std::string &msg) {
  std::fprintf(stderr, "fuzz harness: error: %s\n", msg.c_str());
  std::abort();
}

} // namespace

const std::string &temp_dir() {
  if (g_temp.empty()) {
    const char *base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/mt-fuzz-XXXXXX";
    if (!::mkdtemp(tmpl.data()))
      harness_error("cannot make a directory " + tmpl + ": " + std::strerror(errno));
    g_temp = tmpl;
    std::atexit(remove_temp);
  }
  return g_temp;
}

void remove_tree(const std::string &dir, bool self) {
  std::error_code ec;
  if (self) {
    std::filesystem::remove_all(dir, ec);
    return;
  }
  for (const auto &e : std::filesystem::directory_iterator(dir, ec))
    std::filesystem::remove_all(e.path(), ec);
}

void write_file(const std::string &path, const void *data, size_t size) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    harness_error("cannot write " + path + ": " + std::strerror(errno));
  const char *p = static_cast<const char *>(data);
  while (size > 0) {
    ssize_t w = ::write(fd, p, size);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      harness_error("cannot write " + path + ": " + std::strerror(errno));
    p += w;
    size -= size_t(w);
  }
  ::close(fd);
}

std::string read_file(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    harness_error("cannot read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string seed_file(const std::string &name) {
  const char *dir = std::getenv("MT_FUZZ_SEEDS");
  if (!dir || !*dir)
    harness_error("MT_FUZZ_SEEDS is not set; run the targets through tools/fuzz.sh, which "
                  "makes the seed folder with fuzz/make_seeds.sh");
  std::string path = std::string(dir) + "/" + name;
  if (::access(path.c_str(), R_OK) != 0)
    harness_error(path + " is missing; run fuzz/make_seeds.sh " + dir);
  return path;
}

void quiet_stdout() {
  std::fflush(stdout);
  int fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::dup2(fd, 1);
    ::close(fd);
  }
}

uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    p[i] = uint8_t(v >> (8 * i));
}

void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    p[i] = uint8_t(v >> (8 * i));
}

} // namespace mt::fuzz
