// TensorBoard event files: the scalars Megatron-LM's training_log and
// evaluation write through torch's SummaryWriter, with the same tags, written
// without TensorFlow or protobuf.
//
// Format (what TensorBoard's reader expects): a file named
// events.out.tfevents.<seconds>.<host>.<pid>.<n> holding TFRecords, each
//   uint64 length | uint32 masked CRC-32C of the length | data |
//   uint32 masked CRC-32C of the data
// (little-endian; masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8), whose
// data is a serialized tensorflow.Event: wall_time (field 1, double), step
// (field 2, int64), then file_version (field 3, "brain.Event:2") in the first
// record and summary (field 5) in the others; a Summary holds one Value (field
// 1) of tag (field 1, string) and simple_value (field 2, float).
#ifndef MT_RUNTIME_TENSORBOARD_H
#define MT_RUNTIME_TENSORBOARD_H

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

namespace mt::rt {

// One TFRecord around `data`.
std::string tfrecord(const std::string &data);

// A serialized tensorflow.Event with one scalar.
std::string scalar_event(double wall_time, int64_t step, const std::string &tag, float value);

class TensorBoardWriter {
public:
  // Creates `dir` (and its parents) if needed and a new event file in it,
  // starting with the file-version record. Null with *error one line naming
  // the path when that fails.
  static std::unique_ptr<TensorBoardWriter> open(const std::string &dir, std::string *error);
  ~TensorBoardWriter();

  // Appends one scalar and flushes it to the file, so TensorBoard sees it at
  // once and a killed run loses at most a record in progress (which
  // TensorBoard's reader skips). "" or one error line.
  std::string add_scalar(const std::string &tag, double value, int64_t step);
  const std::string &path() const { return path_; }

private:
  TensorBoardWriter(std::FILE *f, std::string path) : file_(f), path_(std::move(path)) {}
  std::string append(const std::string &event);
  std::FILE *file_;
  std::string path_;
};

} // namespace mt::rt

#endif // MT_RUNTIME_TENSORBOARD_H
