// safetensors: bytes written by the reference implementation
// (huggingface/safetensors 0.8, `safetensors.torch.save`) read back exactly
// and written again byte for byte; the header's alignment; every dtype's
// size; one clear error per kind of damage.
#include "runtime/ckpt/safetensors.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

using mt::rt::SafetensorsReader;
using mt::rt::SafetensorsTensor;

namespace {

// safetensors.torch.save({"layer.weight": f32 [[1, -2, 0.5], [3.25, 0, -0.125]],
//   "emb": bf16 [1, -1.5, 2], "half": f16 [[0.5], [-4]], "ids": i64 [7, -1],
//   "scalar": f32 2.5}, metadata={"format": "pt"})
const char kHeaderJson[] =
    R"({"__metadata__":{"format":"pt"},"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
    R"("layer.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[16,40]},)"
    R"("scalar":{"dtype":"F32","shape":[],"data_offsets":[40,44]},)"
    R"("emb":{"dtype":"BF16","shape":[3],"data_offsets":[44,50]},)"
    R"("half":{"dtype":"F16","shape":[2,1],"data_offsets":[50,54]}}   )";
const unsigned char kData[] = {
    0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0, 0x00, 0x00, 0x00, 0x3f,
    0x00, 0x00, 0x50, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xbe, 0x00, 0x00,
    0x20, 0x40, 0x80, 0x3f, 0xc0, 0xbf, 0x00, 0x40, 0x00, 0x38, 0x00, 0xc4};

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i)
    s[size_t(i)] = char((v >> (8 * i)) & 0xff);
  return s;
}

std::string reference_file() {
  std::string h = kHeaderJson;
  return le64(h.size()) + h + std::string(reinterpret_cast<const char *>(kData), sizeof kData);
}

std::string file_with(const std::string &json, size_t data_bytes) {
  return le64(json.size()) + json + std::string(data_bytes, '\0');
}

std::string error_of(const std::string &bytes) {
  std::string err;
  auto r = SafetensorsReader::parse(bytes, "x.safetensors", &err);
  EXPECT_EQ(r, nullptr);
  return err;
}

bool contains(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

} // namespace

TEST(Safetensors, ReadsTheReferenceWritersFile) {
  std::string err;
  auto r = SafetensorsReader::parse(reference_file(), "ref.safetensors", &err);
  ASSERT_NE(r, nullptr) << err;
  EXPECT_EQ(r->header_size() % 8, 0u);
  EXPECT_EQ(r->metadata().at("format"), "pt");
  ASSERT_EQ(r->tensors().size(), 5u);
  const auto *w = r->find("layer.weight");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, "F32");
  EXPECT_EQ(w->shape, (std::vector<int64_t>{2, 3}));
  float f[6];
  std::memcpy(f, r->data(*w), sizeof f);
  EXPECT_EQ(std::vector<float>(f, f + 6), (std::vector<float>{1, -2, 0.5f, 3.25f, 0, -0.125f}));
  const auto *ids = r->find("ids");
  int64_t i[2];
  std::memcpy(i, r->data(*ids), sizeof i);
  EXPECT_EQ(i[0], 7);
  EXPECT_EQ(i[1], -1);
  const auto *s = r->find("scalar");
  EXPECT_TRUE(s->shape.empty());
  float sv;
  std::memcpy(&sv, r->data(*s), 4);
  EXPECT_EQ(sv, 2.5f);
  const auto *emb = r->find("emb");
  uint16_t b[3];
  std::memcpy(b, r->data(*emb), sizeof b);
  EXPECT_EQ(b[0], 0x3f80); // bf16 1.0
  EXPECT_EQ(b[1], 0xbfc0); // -1.5
  EXPECT_EQ(b[2], 0x4000); // 2.0
  const auto *half = r->find("half");
  std::memcpy(b, r->data(*half), 4);
  EXPECT_EQ(b[0], 0x3800); // f16 0.5
  EXPECT_EQ(b[1], 0xc400); // -4.0
  EXPECT_EQ(r->find("missing"), nullptr);
}

TEST(Safetensors, WritesWhatTheReferenceWrites) {
  // The same tensors in another order: the writer orders them as the
  // reference does (larger elements first, then by name) and pads alike.
  const unsigned char *d = kData;
  std::vector<SafetensorsTensor> t = {
      {"half", "F16", {2, 1}, d + 50, 4},       {"emb", "BF16", {3}, d + 44, 6},
      {"scalar", "F32", {}, d + 40, 4},         {"layer.weight", "F32", {2, 3}, d + 16, 24},
      {"ids", "I64", {2}, d, 16},
  };
  char dir[] = "/tmp/mt-safetensors-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/m.safetensors";
  ASSERT_EQ(mt::rt::write_safetensors(path, t, {{"format", "pt"}}), "");
  std::ifstream f(path, std::ios::binary);
  std::string got((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(got, reference_file());
  std::string err;
  EXPECT_NE(SafetensorsReader::open(path, &err), nullptr) << err;
  ::unlink(path.c_str());
  ::rmdir(dir);
}

TEST(Safetensors, HeaderIsPaddedToEightBytes) {
  float x = 1.0f;
  for (size_t len = 1; len <= 9; ++len) {
    std::string header;
    std::vector<size_t> order;
    ASSERT_EQ(mt::rt::safetensors_header({{std::string(len, 'a'), "F32", {1}, &x, 4}}, {},
                                         &header, &order),
              "");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i)
      n = (n << 8) | static_cast<unsigned char>(header[size_t(i)]);
    EXPECT_EQ(n, header.size() - 8);
    EXPECT_EQ(n % 8, 0u) << len;
    EXPECT_EQ(header.back() == ' ' || header.back() == '}', true);
    std::string err;
    EXPECT_NE(SafetensorsReader::parse(header + std::string(4, '\0'), "p", &err), nullptr) << err;
  }
  // No tensors at all: "{}" and six spaces.
  std::string header;
  std::vector<size_t> order;
  ASSERT_EQ(mt::rt::safetensors_header({}, {}, &header, &order), "");
  EXPECT_EQ(header, le64(8) + "{}      ");
}

TEST(Safetensors, DtypeSizes) {
  EXPECT_EQ(mt::rt::safetensors_dtype_size("F64"), 8u);
  EXPECT_EQ(mt::rt::safetensors_dtype_size("I64"), 8u);
  EXPECT_EQ(mt::rt::safetensors_dtype_size("U64"), 8u);
  EXPECT_EQ(mt::rt::safetensors_dtype_size("F32"), 4u);
  EXPECT_EQ(mt::rt::safetensors_dtype_size("I32"), 4u);
  EXPECT_EQ(mt::rt::safetensors_dtype_size("BF16"), 2u);
  EXPECT_EQ(mt::rt::safetensors_dtype_size("F16"), 2u);
  EXPECT_EQ(mt::rt::safetensors_dtype_size("I16"), 2u);
  EXPECT_EQ(mt::rt::safetensors_dtype_size("U8"), 1u);
  EXPECT_EQ(mt::rt::safetensors_dtype_size("BOOL"), 1u);
  EXPECT_EQ(mt::rt::safetensors_dtype_size("F8_E4M3"), 1u);
  EXPECT_EQ(mt::rt::safetensors_dtype_size("f32"), 0u);
  EXPECT_EQ(mt::rt::safetensors_dtype_size("F128"), 0u);
}

TEST(Safetensors, WriterRefusesBadTensors) {
  float x[2] = {1, 2};
  std::string h;
  std::vector<size_t> o;
  EXPECT_TRUE(contains(mt::rt::safetensors_header({{"a", "F32", {3}, x, 8}}, {}, &h, &o),
                       "tensor a has 8 bytes but F32 [3] needs 12"));
  EXPECT_TRUE(contains(mt::rt::safetensors_header({{"a", "f32", {2}, x, 8}}, {}, &h, &o),
                       "tensor a has dtype 'f32'"));
  EXPECT_TRUE(contains(
      mt::rt::safetensors_header({{"a", "F32", {2}, x, 8}, {"a", "F32", {2}, x, 8}}, {}, &h, &o),
      "two tensors are named a"));
  EXPECT_TRUE(contains(mt::rt::safetensors_header({{"__metadata__", "F32", {2}, x, 8}}, {}, &h, &o),
                       "cannot be written"));
}

TEST(Safetensors, TruncatedFilesAreNamedTruncated) {
  const std::string whole = reference_file();
  EXPECT_TRUE(contains(error_of(whole.substr(0, 5)),
                       "x.safetensors: error: is truncated: 5 bytes, shorter than the 8-byte"));
  EXPECT_TRUE(contains(error_of(whole.substr(0, 100)),
                       "is truncated: the header length says 336 bytes of header but only 92"));
  // The data cut short: the first tensor past the end is named.
  EXPECT_TRUE(contains(error_of(whole.substr(0, whole.size() - 5)),
                       "is truncated: tensor half ends at data byte 54 but the file holds 49"));
}

TEST(Safetensors, OneErrorPerKindOfDamage) {
  const std::string t = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  EXPECT_TRUE(contains(error_of(le64(200000000) + "{}"), "more than the format's limit"));
  EXPECT_TRUE(contains(error_of(file_with("[1,2,3] ", 0)), "does not start with '{'"));
  EXPECT_TRUE(contains(error_of(file_with("{\"t\":{]}", 0)), "the header is not valid JSON"));
  EXPECT_TRUE(contains(error_of(file_with("{" + t + "," + t + "}", 8)), "names t twice"));
  EXPECT_TRUE(contains(
      error_of(file_with(R"({"t":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8)),
      "tensor t: dtype 'F33' is none of"));
  EXPECT_TRUE(contains(
      error_of(file_with(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)),
      "tensor t: shape has an entry that is not a non-negative integer"));
  EXPECT_TRUE(contains(error_of(file_with(R"({"t":{"dtype":"F32","shape":[2]}})", 8)),
                       "tensor t: has no data_offsets"));
  EXPECT_TRUE(contains(error_of(file_with(R"({"t":{"shape":[2],"data_offsets":[0,8]}})", 8)),
                       "tensor t: has no dtype"));
  EXPECT_TRUE(contains(
      error_of(file_with(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)),
      "tensor t: data_offsets [0, 8] hold 8 bytes but F32 [3] needs 12"));
  EXPECT_TRUE(contains(
      error_of(file_with(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8)),
      "end before they begin"));
  // A gap, an overlap, bytes after the last tensor.
  EXPECT_TRUE(contains(
      error_of(file_with(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12)),
      "tensor t: data_offsets begin at 4 but the previous tensor ends at 0"));
  EXPECT_TRUE(contains(
      error_of(file_with(
          "{" + t + R"(,"u":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)),
      "begin at 4 but the previous tensor (t) ends at 8"));
  EXPECT_TRUE(contains(error_of(file_with("{" + t + "}", 12)),
                       "has 4 bytes after the last tensor's data"));
  EXPECT_TRUE(contains(error_of(file_with(R"({"__metadata__":{"a":1}})", 0)),
                       "__metadata__ entry 'a' is not a string"));
  std::string err;
  EXPECT_EQ(SafetensorsReader::open("/nonexistent/m.safetensors", &err), nullptr);
  EXPECT_TRUE(contains(err, "/nonexistent/m.safetensors: error: cannot open"));
}
