// TensorBoard event files written by hand (format in tensorboard.h).
#include "runtime/train/tensorboard.h"

#include "runtime/base/crc32c.h"

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <system_error>

#include <unistd.h>

namespace mt::rt {
namespace {

// TFRecord stores CRCs masked, so that a CRC of data holding CRCs stays
// well distributed.
uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

void putLittle(std::string &out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out.push_back(char((v >> (8 * i)) & 0xff));
}

// Protocol buffers' wire format, the three kinds an Event needs.
void putVarint(std::string &out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}
void putKey(std::string &out, int field, int wireType) {
  putVarint(out, uint64_t(field) << 3 | uint64_t(wireType));
}
void putBytes(std::string &out, int field, const std::string &bytes) {
  putKey(out, field, 2);
  putVarint(out, bytes.size());
  out += bytes;
}

std::string eventHead(double wall_time, int64_t step) {
  std::string e;
  uint64_t bits;
  std::memcpy(&bits, &wall_time, 8);
  putKey(e, 1, 1); // wall_time: 64-bit
  putLittle(e, bits, 8);
  putKey(e, 2, 0); // step: varint
  putVarint(e, uint64_t(step));
  return e;
}

double now() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

} // namespace

std::string tfrecord(const std::string &data) {
  std::string r;
  putLittle(r, data.size(), 8);
  putLittle(r, masked(crc32c(r.data(), 8)), 4);
  r += data;
  putLittle(r, masked(crc32c(data.data(), data.size())), 4);
  return r;
}

std::string scalar_event(double wall_time, int64_t step, const std::string &tag, float value) {
  std::string v;
  putBytes(v, 1, tag);
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  putKey(v, 2, 5); // simple_value: 32-bit
  putLittle(v, bits, 4);
  std::string summary;
  putBytes(summary, 1, v);
  std::string e = eventHead(wall_time, step);
  putBytes(e, 5, summary);
  return e;
}

std::unique_ptr<TensorBoardWriter> TensorBoardWriter::open(const std::string &dir,
                                                           std::string *error) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    *error = "cannot create the TensorBoard directory " + dir + ": " + ec.message() +
             "; give --tensorboard-dir a directory this process can write";
    return nullptr;
  }
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  // TensorBoard reads every events file of a directory and orders their
  // records by step: a resumed run adds a file beside the first one's.
  const std::string stem = dir + "/events.out.tfevents." + std::to_string(long(std::time(nullptr))) +
                           "." + host + "." + std::to_string(getpid()) + ".";
  std::FILE *f = nullptr;
  std::string path;
  for (int n = 0; !f && n < 1000; ++n) {
    path = stem + std::to_string(n);
    f = std::fopen(path.c_str(), "wbx"); // never another writer's file
    if (!f && errno != EEXIST)
      break;
  }
  if (!f) {
    *error = "cannot create a TensorBoard event file in " + dir + " (" + path +
             "): " + std::strerror(errno) +
             "; give --tensorboard-dir a directory this process can write";
    return nullptr;
  }
  std::unique_ptr<TensorBoardWriter> w(new TensorBoardWriter(f, path));
  std::string version = eventHead(now(), 0);
  putBytes(version, 3, "brain.Event:2");
  if (std::string e = w->append(version); !e.empty()) {
    *error = e;
    return nullptr;
  }
  return w;
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_)
    std::fclose(file_);
}

std::string TensorBoardWriter::add_scalar(const std::string &tag, double value, int64_t step) {
  return append(scalar_event(now(), step, tag, float(value)));
}

std::string TensorBoardWriter::append(const std::string &event) {
  const std::string r = tfrecord(event);
  if (std::fwrite(r.data(), 1, r.size(), file_) != r.size() || std::fflush(file_) != 0)
    return "cannot write the TensorBoard event file " + path_ + ": " + std::strerror(errno) +
           "; check the disk has space, or run without --tensorboard-dir";
  return "";
}

} // namespace mt::rt
