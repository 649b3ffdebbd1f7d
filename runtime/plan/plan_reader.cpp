// plan.bin reader: header, checksum, FlatBuffers verification, then the
// semantic checks of plan_verifier.cpp; and the plan's shared helpers.
#include "runtime/plan/plan_reader.h"
#include "runtime/plan/plan_verifier.h"

#include "runtime/base/byte_order.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utility>
#include <vector>

namespace mt::rt {

namespace pl = mt::plan;
using detail::grouped;
using detail::vsize;

namespace {

constexpr char kMagic[8] = {'M', 'T', 'P', 'L', 'A', 'N', '\0', '\0'};
constexpr uint64_t kFnvOffsetBasis = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

} // namespace

uint64_t plan_checksum(const uint8_t *data, size_t size) {
  uint64_t h = kFnvOffsetBasis;
  for (size_t i = 0; i < size; ++i) {
    h ^= data[i];
    h *= kFnvPrime;
  }
  return h;
}

std::string plan_header(const uint8_t *payload, size_t size) {
  std::string out;
  out.append(kMagic, sizeof(kMagic));
  put_le<uint32_t>(out, kPlanFormatVersion);
  put_le<uint32_t>(out, 0);
  put_le<uint64_t>(out, size);
  put_le<uint64_t>(out, plan_checksum(payload, size));
  return out;
}

std::string wrap_plan_payload(const uint8_t *payload, size_t size) {
  std::string out = plan_header(payload, size);
  out.append(reinterpret_cast<const char *>(payload), size);
  return out;
}

size_t element_bytes(pl::DType dtype) {
  switch (dtype) {
  case pl::DType::F32:
  case pl::DType::I32: return 4;
  case pl::DType::BF16:
  case pl::DType::F16: return 2;
  case pl::DType::I64:
  case pl::DType::F64: return 8;
  }
  return 0;
}

bool is_float_dtype(pl::DType dtype) {
  return dtype == pl::DType::F32 || dtype == pl::DType::BF16 || dtype == pl::DType::F16;
}

int64_t element_count(const flatbuffers::Vector<int64_t> *shape) {
  int64_t n = 1;
  for (size_t i = 0; i < vsize(shape); ++i)
    n *= shape->Get(uint32_t(i));
  return n;
}

uint64_t plan_bytes(const pl::Value &v) {
  return uint64_t(element_count(v)) * element_bytes(v.dtype());
}

std::string value_label(const pl::Value *v, uint32_t index) {
  std::string name = v && v->name() ? v->name()->str() : "";
  if (name.empty())
    return "%" + std::to_string(index);
  if (name[0] == '%' || name[0] == '@')
    return name;
  return "%" + name;
}

std::string instruction_label(const pl::Instruction &ins, size_t index) {
  return "#" + std::to_string(index) + " (" + (ins.where() ? ins.where()->str() : "") + ") " +
         opcode_name(ins.op());
}

std::string opcode_name(pl::Opcode op) {
  if (op > pl::Opcode::MAX)
    return "opcode " + std::to_string(unsigned(op));
  return pl::EnumNameOpcode(op);
}

std::string plan_string(const flatbuffers::String *s) { return s ? s->str() : std::string(); }

std::vector<int64_t> param_shape(const pl::Param &p) {
  std::vector<int64_t> s;
  if (p.shape())
    for (int64_t d : *p.shape())
      s.push_back(d);
  return s;
}

const char *dtype_label(pl::DType d) {
  switch (d) {
  case pl::DType::F32: return "f32";
  case pl::DType::BF16: return "bf16";
  case pl::DType::F16: return "f16";
  case pl::DType::I32: return "i32";
  case pl::DType::I64: return "i64";
  case pl::DType::F64: return "f64";
  }
  return "unknown-dtype";
}

const pl::Rank *find_rank(const pl::Plan &plan, int rank) {
  for (size_t i = 0; i < vsize(plan.ranks()); ++i)
    if (plan.ranks()->Get(uint32_t(i))->rank() == rank)
      return plan.ranks()->Get(uint32_t(i));
  return nullptr;
}

int64_t expert_data_parallel(const pl::Plan &plan) {
  const int64_t stage = int64_t(plan.tensor_parallel()) * plan.data_parallel();
  const int64_t experts = int64_t(plan.expert_model_parallel()) * plan.expert_tensor_parallel();
  if (stage < 1 || experts < 1 || stage % experts != 0)
    return 1;
  return stage / experts;
}

int64_t bucket_group_size(const pl::Plan &plan, const pl::Bucket &bucket) {
  return bucket.group() == 6 ? expert_data_parallel(plan)
                             : std::max<int64_t>(1, plan.data_parallel());
}

int64_t bucket_shard_state_offset(const pl::Plan &plan, const pl::Bucket &bucket) {
  if (bucket.shard_offset() >= 0)
    return bucket.shard_offset();
  return bucket.begin() / std::max<int64_t>(1, plan.data_parallel());
}

ExpertCoords expert_coords(const pl::Plan &plan, const pl::Rank &rank) {
  return expert_coords(std::max(1, plan.tensor_parallel()), plan.expert_model_parallel(),
                       plan.expert_tensor_parallel(), rank.tp_rank(), rank.dp_rank());
}

ExpertCoords expert_coords(int64_t tp, int64_t ep, int64_t etp, int64_t tp_rank,
                           int64_t dp_rank) {
  etp = std::max<int64_t>(1, etp);
  ep = std::max<int64_t>(1, ep);
  const int64_t i = tp_rank + std::max<int64_t>(1, tp) * dp_rank;
  ExpertCoords c;
  c.etp_rank = i % etp;
  c.ep_rank = (i / etp) % ep;
  c.edp_rank = i / (etp * ep);
  return c;
}

int64_t bucket_group_rank(const pl::Plan &plan, const pl::Rank &rank, const pl::Bucket &bucket) {
  return bucket.group() == 6 ? expert_coords(plan, rank).edp_rank : rank.dp_rank();
}

bool plan_has_experts(const pl::Plan &plan) {
  for (size_t r = 0; r < vsize(plan.ranks()); ++r)
    if (const auto *params = plan.ranks()->Get(uint32_t(r))->params())
      for (const pl::Param *p : *params)
        if (p->expert())
          return true;
  return false;
}

uint64_t gpu_micro_batch_slots(const pl::Rank &rank) {
  int64_t slots = 0;
  for (size_t p = 0; p < vsize(rank.programs()); ++p) {
    const pl::Program &prog = *rank.programs()->Get(uint32_t(p));
    // A compact train_step's instructions run once per micro-batch.
    if (prog.pipeline())
      slots = std::max<int64_t>(slots, prog.pipeline()->micro_batches());
    for (size_t i = 0; i < vsize(prog.instructions()); ++i)
      slots = std::max<int64_t>(slots, prog.instructions()->Get(uint32_t(i))->micro_batch() + 1);
  }
  return uint64_t(slots);
}

uint64_t gpu_scalar_bytes(uint64_t micro_batch_slots) {
  const uint64_t bytes = kGpuScalarSlotBytes * (3 + micro_batch_slots);
  return (bytes + 255) / 256 * 256;
}

uint64_t gpu_scalar_bytes(const pl::Rank &rank) {
  return gpu_scalar_bytes(gpu_micro_batch_slots(rank));
}

uint64_t gpu_executor_workspace_bytes(uint64_t kernel_workspace_bytes, uint64_t micro_batch_slots) {
  return (kernel_workspace_bytes + 255) / 256 * 256 + gpu_scalar_bytes(micro_batch_slots);
}

std::unique_ptr<PlanFile> PlanFile::open(const std::string &path, std::string *error) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = path + ": error: cannot open: " + std::strerror(errno) +
             "; check the path given to mtrun";
    return nullptr;
  }
  std::string bytes;
  struct stat st;
  if (::fstat(fd, &st) == 0 && st.st_size > 0)
    bytes.reserve(size_t(st.st_size));
  char buf[1 << 16];
  for (;;) {
    ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      *error = path + ": error: cannot read: " + std::strerror(errno);
      ::close(fd);
      return nullptr;
    }
    if (r == 0)
      break;
    bytes.append(buf, size_t(r));
  }
  ::close(fd);
  return from_bytes(std::move(bytes), path, error);
}

std::unique_ptr<PlanFile> PlanFile::from_bytes(std::string bytes, const std::string &name,
                                               std::string *error) {
  const std::string recompile = "recompile it with `mtc compile`";
  auto fail = [&](const std::string &msg) {
    *error = name + ": error: " + msg;
    return nullptr;
  };
  const auto *p = reinterpret_cast<const unsigned char *>(bytes.data());
  if (bytes.empty())
    return fail("is empty; pass the file written by `mtc compile -o`");
  // A short file that starts like the magic is a cut-off plan, not another format.
  if (std::memcmp(p, kMagic, std::min(bytes.size(), sizeof(kMagic))) != 0)
    return fail("not an mt plan (the file does not start with MTPLAN); pass the file "
                "written by `mtc compile -o`");
  if (bytes.size() < kPlanHeaderSize)
    return fail("is truncated: the file has " + grouped(bytes.size()) +
                " bytes, fewer than the " + std::to_string(kPlanHeaderSize) +
                "-byte header; " + recompile);
  // The version comes first: a different version may lay out the rest of the
  // header differently.
  const uint32_t version = get_le<uint32_t>(p + 8);
  if (version != kPlanFormatVersion)
    return fail("was written by plan format version " + std::to_string(version) +
                "; this mtrun reads version " + std::to_string(kPlanFormatVersion) +
                "; recompile it with the mtc that matches this mtrun");
  const uint32_t flags = get_le<uint32_t>(p + 12);
  if (flags != 0) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "0x%x", flags);
    return fail(std::string("has header flags ") + hex +
                ", but plan format version 1 defines none; " + recompile);
  }
  const uint64_t payload = get_le<uint64_t>(p + 16);
  const uint64_t have = bytes.size() - kPlanHeaderSize;
  if (payload > have)
    return fail("is truncated: header says " + grouped(payload) + " payload bytes, file has " +
                grouped(have) + "; " + recompile);
  if (payload < have)
    return fail("is corrupt: header says " + grouped(payload) + " payload bytes, but " +
                grouped(have - payload) + " more bytes follow them; " + recompile);
  const unsigned char *body = p + kPlanHeaderSize;
  if (plan_checksum(body, payload) != get_le<uint64_t>(p + 24))
    return fail("is corrupt: checksum mismatch; " + recompile);
  if (payload >= FLATBUFFERS_MAX_BUFFER_SIZE)
    return fail("has a payload of " + grouped(payload) + " bytes, more than FlatBuffers " +
                "can address; recompile with fewer kernels or ranks per plan");
  if (payload < 8 || !pl::PlanBufferHasIdentifier(body))
    return fail("the payload is not an mt plan FlatBuffer (file identifier is not MTPL); " +
                recompile);
  flatbuffers::Verifier::Options opts;
  opts.max_tables = 0xffffffffu; // large models have millions of values
  flatbuffers::Verifier verifier(body, size_t(payload), opts);
  if (!pl::VerifyPlanBuffer(verifier))
    return fail("the payload fails FlatBuffers verification (a table or vector points "
                "outside it); " + recompile);
  const pl::Plan *plan = pl::GetPlan(body);
  if (std::string e = detail::verify_plan(*plan); !e.empty())
    return fail(e + "; " + recompile + " (if the same mtc wrote it, report an mtc bug)");

  std::unique_ptr<PlanFile> file(new PlanFile());
  file->bytes_ = std::move(bytes);
  file->name_ = name;
  // Moving a std::string keeps its heap buffer, but re-derive the root anyway.
  file->plan_ = pl::GetPlan(reinterpret_cast<const uint8_t *>(file->bytes_.data()) +
                            kPlanHeaderSize);
  return file;
}

} // namespace mt::rt
