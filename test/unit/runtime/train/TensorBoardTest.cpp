// TensorBoard event files: an Event's bytes against the protobuf wire format
// worked out by hand, and a file's records framed as TFRecord (CRC-32C is
// checked in CheckpointTest.cpp). (test/mtrun/tensorboard.test reads a
// whole run's file with a separate decoder, and with TensorBoard's own
// reader where it is installed.)
#include "runtime/train/tensorboard.h"

#include "runtime/base/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

using mt::rt::crc32c;

TEST(TensorBoard, ScalarEventBytes) {
  // wall_time 1.5 (field 1, 64-bit), step 3 (field 2, varint), summary
  // (field 5) { value (field 1) { tag "a" (field 1), simple_value 2.0f
  // (field 2, 32-bit) } }.
  const std::vector<uint8_t> want = {0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F, // 1.5
                                     0x10, 0x03,                         // step
                                     0x2A, 0x0A,                         // summary, 10 bytes
                                     0x0A, 0x08,                         // value, 8 bytes
                                     0x0A, 0x01, 'a',                    // tag
                                     0x15, 0, 0, 0, 0x40};               // 2.0f
  const std::string got = mt::rt::scalar_event(1.5, 3, "a", 2.0f);
  EXPECT_EQ(std::vector<uint8_t>(got.begin(), got.end()), want);
  // A step past 127 takes more varint bytes: 300 is AC 02.
  const std::string big = mt::rt::scalar_event(1.5, 300, "a", 2.0f);
  ASSERT_GE(big.size(), 12u);
  EXPECT_EQ(uint8_t(big[9]), 0x10);
  EXPECT_EQ(uint8_t(big[10]), 0xAC);
  EXPECT_EQ(uint8_t(big[11]), 0x02);
}

uint32_t unmask(uint32_t m) {
  const uint32_t r = m - 0xa282ead8u;
  return (r >> 17) | (r << 15);
}

uint64_t little(const std::string &s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i)
    v = v << 8 | uint8_t(s[at + size_t(i)]);
  return v;
}

TEST(TensorBoard, FileIsFramedRecords) {
  const std::string dir = testing::TempDir() + "/mt-tensorboard-test/run";
  std::filesystem::remove_all(dir);
  std::string error;
  auto w = mt::rt::TensorBoardWriter::open(dir, &error);
  ASSERT_TRUE(w) << error;
  EXPECT_NE(w->path().find("/events.out.tfevents."), std::string::npos) << w->path();
  ASSERT_EQ(w->add_scalar("lm loss", 5.25, 1), "");
  ASSERT_EQ(w->add_scalar("lm loss", 4.5, 2), "");
  std::ifstream in(w->path(), std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  for (size_t at = 0; at < file.size();) {
    ASSERT_LE(at + 12, file.size());
    const uint64_t n = little(file, at, 8);
    EXPECT_EQ(unmask(uint32_t(little(file, at + 8, 4))), crc32c(file.data() + at, 8));
    ASSERT_LE(at + 12 + n + 4, file.size());
    const std::string data = file.substr(at + 12, n);
    EXPECT_EQ(unmask(uint32_t(little(file, at + 12 + n, 4))), crc32c(data.data(), data.size()));
    records.push_back(data);
    at += 12 + n + 4;
  }
  ASSERT_EQ(records.size(), 3u);
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  // The scalars are the events scalar_event makes, but for the wall time.
  for (size_t k = 1; k < 3; ++k) {
    const std::string want = mt::rt::scalar_event(0, int64_t(k), "lm loss", k == 1 ? 5.25f : 4.5f);
    EXPECT_EQ(records[k].substr(9), want.substr(9)) << "record " << k;
  }
  // A second writer in the same directory gets a file of its own.
  auto second = mt::rt::TensorBoardWriter::open(dir, &error);
  ASSERT_TRUE(second) << error;
  EXPECT_NE(second->path(), w->path());
}

TEST(TensorBoard, UnwritableDirectoryIsNamed) {
  const std::string file = testing::TempDir() + "/mt-tensorboard-not-a-dir";
  std::ofstream(file) << "x";
  std::string error;
  EXPECT_FALSE(mt::rt::TensorBoardWriter::open(file + "/run", &error));
  EXPECT_NE(error.find("cannot create the TensorBoard directory " + file + "/run"),
            std::string::npos)
      << error;
}

} // namespace
