// Checkpoints of a whole parallel layout (see checkpoint_layout.h).
#include "runtime/ckpt/checkpoint_layout.h"

#include "runtime/ckpt/checkpoint_format.h"
#include "runtime/ckpt/hf_mapping.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <sys/stat.h>

namespace mt::rt {

namespace pl = mt::plan;

namespace {

std::string str(const flatbuffers::String *s) { return plan_string(s); }

std::vector<int64_t> shape_of(const pl::Param *p) { return param_shape(*p); }

int64_t numel(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

std::string shape_text(const std::vector<int64_t> &shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? "x" : "") + std::to_string(shape[i]);
  return s.empty() ? "scalar" : s;
}

std::string value_of(const CheckpointMeta &m, const char *key, const std::string &dflt) {
  auto it = m.values.find(key);
  return it == m.values.end() ? dflt : it->second;
}

// A layout size of the metadata (tensor_parallel, data_parallel): dflt when
// absent, -1 when it is not a decimal number in [1, 2^16].
int int_value(const CheckpointMeta &m, const char *key, int dflt) {
  auto it = m.values.find(key);
  if (it == m.values.end())
    return dflt;
  int64_t n = 0;
  return ckpt_detail::parse_int(it->second, 1, 1 << 16, &n) ? int(n) : -1;
}

std::string layout_text(int tp, int pp, int dp, int ep = 1, int etp = 1) {
  return "tensor " + std::to_string(tp) + " x pipeline " + std::to_string(pp) + " x data " +
         std::to_string(dp) + (ep > 1 ? ", expert-parallel " + std::to_string(ep) : std::string()) +
         (etp > 1 ? ", expert-tensor-parallel " + std::to_string(etp) : std::string());
}

// One parameter of a rank file, as param_layout records it.
struct SavedParam {
  std::string name;
  int tp_dim = -1, tp_blocks = 1;
  int64_t flat_offset = -1;
  std::vector<int64_t> shape; // the shard
  int ep_dim = -1;            // an expert-parallel shard's dim (the file's ep rank's slice)
  bool etp = false;           // tp_dim is a shard over the expert-tensor-parallel ranks
};

bool parse_param_layout(const std::string &text, std::vector<SavedParam> *out) {
  std::stringstream all(text);
  std::string item;
  while (std::getline(all, item, ';')) {
    if (item.empty())
      continue;
    std::istringstream in(item);
    SavedParam p;
    std::string shape, ep_dim;
    if (!(in >> p.name >> p.tp_dim >> p.tp_blocks >> p.flat_offset >> shape) || p.tp_blocks < 1)
      return false;
    if (in >> ep_dim) {
      // "EP_DIM" (0..), or "EP_DIM etp" with EP_DIM -1 when ep is 1.
      int64_t v = 0;
      std::string mark, rest;
      const bool etp = bool(in >> mark);
      if (etp && mark != "etp")
        return false;
      if (ep_dim == "-1" && etp)
        v = -1;
      else if (!ckpt_detail::parse_int(ep_dim, 0, 64, &v))
        return false;
      if (in >> rest)
        return false;
      p.ep_dim = int(v);
      p.etp = etp;
    }
    if (shape != "scalar") {
      std::stringstream dims(shape);
      std::string d;
      while (std::getline(dims, d, 'x')) {
        int64_t v = 0;
        if (!ckpt_detail::parse_int(d, 0, INT64_MAX, &v))
          return false;
        p.shape.push_back(v);
      }
    }
    uint64_t bytes = 0;
    if (p.tp_dim < -1 || p.tp_dim >= int(p.shape.size()) || p.flat_offset < -1 ||
        p.ep_dim >= int(p.shape.size()) || (p.ep_dim >= 0 && p.ep_dim == p.tp_dim) ||
        (p.etp && p.tp_dim < 0) ||
        !ckpt_detail::shape_bytes(p.shape, 4, &bytes) ||
        (p.tp_dim >= 0 && p.shape[size_t(p.tp_dim)] % p.tp_blocks != 0))
      return false;
    out->push_back(std::move(p));
  }
  return true;
}

// The distributed optimizer's shard layout of a rank (plan.fbs, Bucket):
// bucket [begin, end) of a group of G ranks (dp, or edp for expert buckets),
// n = (end - begin) / G: group rank r's shard holds the flat elements
// [begin + r n, begin + (r + 1) n) at element `offset` of its shard state.
struct ShardBucket {
  int64_t begin, end;
  bool expert;
  int64_t offset;
};
struct ShardLayout {
  int dp = 1, edp = 1;
  int64_t flat = 0, shard = 0;
  std::vector<ShardBucket> buckets; // in the backward's order
  int group(bool expert) const { return expert ? edp : dp; }
  int64_t n(const ShardBucket &b) const { return (b.end - b.begin) / group(b.expert); }
  // The group's buckets in shard-state order, each with its place in the
  // packed vector (dp_rank_RR / edp_rank_RR).
  std::vector<std::pair<const ShardBucket *, int64_t>> packed(bool expert) const {
    std::vector<const ShardBucket *> bs;
    for (const ShardBucket &b : buckets)
      if (b.expert == expert)
        bs.push_back(&b);
    std::sort(bs.begin(), bs.end(),
              [](const ShardBucket *x, const ShardBucket *y) { return x->offset < y->offset; });
    std::vector<std::pair<const ShardBucket *, int64_t>> out;
    int64_t at = 0;
    for (const ShardBucket *b : bs) {
      out.push_back({b, at});
      at += n(*b);
    }
    return out;
  }
  int64_t elements(bool expert) const {
    int64_t total = 0;
    for (const ShardBucket &b : buckets)
      if (b.expert == expert)
        total += n(b);
    return total;
  }
  bool has(bool expert) const {
    return std::any_of(buckets.begin(), buckets.end(),
                       [&](const ShardBucket &b) { return b.expert == expert; });
  }
  // Every bucket a dp bucket at begin / dp: the text without groups.
  bool plain() const {
    return std::all_of(buckets.begin(), buckets.end(), [&](const ShardBucket &b) {
      return !b.expert && b.offset == b.begin / dp;
    });
  }
};

ShardLayout layout_of(const pl::Plan &plan, const pl::Rank &r) {
  ShardLayout l;
  l.dp = int(std::max(1, plan.data_parallel()));
  l.edp = int(expert_data_parallel(plan));
  l.flat = r.flat_elements();
  l.shard = r.shard_elements();
  for (uint32_t b = 0; r.buckets() && b < r.buckets()->size(); ++b) {
    const pl::Bucket *bk = r.buckets()->Get(b);
    l.buckets.push_back(
        {bk->begin(), bk->end(), bk->group() == 6, bucket_shard_state_offset(plan, *bk)});
  }
  return l;
}

std::string layout_string(const ShardLayout &l) {
  const bool plain = l.plain();
  std::string s = "dp " + std::to_string(l.dp) +
                  (plain ? "" : ", edp " + std::to_string(l.edp)) + ", flat " +
                  std::to_string(l.flat) +
                  (plain ? "" : ", shard " + std::to_string(l.shard)) + ", buckets";
  for (const ShardBucket &b : l.buckets)
    s += " [" + std::to_string(b.begin) + ", " + std::to_string(b.end) + ")" +
         (plain ? "" : std::string(b.expert ? " edp@" : " dp@") + std::to_string(b.offset));
  return s;
}

// Reads layout_string's text (either form). The buckets cover [0, flat)
// without overlap, each a multiple of its group long; the shards lie in
// [0, shard) without overlap.
bool parse_shard_layout(const std::string &text, ShardLayout *out) {
  const char *p = text.data(), *end = p + text.size();
  auto lit = [&](const char *s) {
    size_t n = std::strlen(s);
    if (size_t(end - p) < n || std::memcmp(p, s, n) != 0)
      return false;
    p += n;
    return true;
  };
  auto num = [&](int64_t *v) {
    auto r = std::from_chars(p, end, *v, 10);
    if (r.ec != std::errc() || r.ptr == p || *v < 0)
      return false;
    p = r.ptr;
    return true;
  };
  ShardLayout l;
  int64_t d = 0, e = 1, f = 0, sh = -1;
  if (!lit("dp ") || !num(&d) || d < 1 || d > (1 << 16))
    return false;
  const bool grouped = lit(", edp ");
  if (grouped && (!num(&e) || e < 1 || e > (1 << 16)))
    return false;
  if (!lit(", flat ") || !num(&f))
    return false;
  if (grouped && (!lit(", shard ") || !num(&sh)))
    return false;
  if (!lit(", buckets"))
    return false;
  l.dp = int(d);
  l.edp = int(e);
  l.flat = f;
  while (p != end) {
    ShardBucket b{0, 0, false, 0};
    if (!lit(" [") || !num(&b.begin) || !lit(", ") || !num(&b.end) || !lit(")"))
      return false;
    if (grouped) {
      if (lit(" edp@"))
        b.expert = true;
      else if (!lit(" dp@"))
        return false;
      if (!num(&b.offset))
        return false;
    }
    if (b.end < b.begin || b.end > f || (b.end - b.begin) % l.group(b.expert) != 0)
      return false;
    if (!grouped)
      b.offset = b.begin / l.dp;
    l.buckets.push_back(b);
  }
  l.shard = grouped ? sh : f / l.dp;
  // In the backward's order; together exactly [0, flat); shards disjoint.
  std::vector<ShardBucket> sorted = l.buckets;
  std::sort(sorted.begin(), sorted.end(),
            [](const ShardBucket &x, const ShardBucket &y) { return x.begin < y.begin; });
  int64_t at = 0;
  for (const ShardBucket &bk : sorted) {
    if (bk.begin != at)
      return false;
    at = bk.end;
  }
  if (at != f)
    return false;
  std::sort(sorted.begin(), sorted.end(),
            [](const ShardBucket &x, const ShardBucket &y) { return x.offset < y.offset; });
  at = 0;
  for (const ShardBucket &bk : sorted) {
    if (bk.offset < at || bk.offset > l.shard || l.n(bk) > l.shard - bk.offset)
      return false;
    at = bk.offset + l.n(bk);
  }
  *out = std::move(l);
  return true;
}

// Copies between a whole tensor and rank r's shard of `ranks`: dim `dim`
// of the whole is viewed as [blocks, ranks, n] and the shard is [:, r, :]
// (plan.fbs, Param.tp_dim; an ep_dim shard is the same with one block).
void copy_shard(float *whole, float *shard, const std::vector<int64_t> &shard_shape, int dim,
                int blocks, int tp, int r, bool to_shard) {
  if (dim < 0) {
    int64_t n = numel(shard_shape);
    if (to_shard)
      std::memcpy(shard, whole, size_t(n) * 4);
    else
      std::memcpy(whole, shard, size_t(n) * 4);
    return;
  }
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i)
    outer *= shard_shape[size_t(i)];
  for (size_t i = size_t(dim) + 1; i < shard_shape.size(); ++i)
    inner *= shard_shape[i];
  const int64_t n = shard_shape[size_t(dim)] / blocks; // rows per block
  const int64_t shard_rows = shard_shape[size_t(dim)], whole_rows = shard_rows * tp;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t b = 0; b < blocks; ++b) {
      float *w = whole + (o * whole_rows + (b * tp + r) * n) * inner;
      float *s = shard + (o * shard_rows + b * n) * inner;
      if (to_shard)
        std::memcpy(s, w, size_t(n * inner) * 4);
      else
        std::memcpy(w, s, size_t(n * inner) * 4);
    }
}

// A group's packed shards (one per group rank) and the flat buffer.
void packed_to_flat(const ShardLayout &l, bool expert, const std::vector<const float *> &packed,
                    float *flat) {
  for (const auto &[b, at] : l.packed(expert)) {
    const int64_t n = l.n(*b);
    for (size_t r = 0; r < packed.size(); ++r)
      std::memcpy(flat + b->begin + int64_t(r) * n, packed[r] + at, size_t(n) * 4);
  }
}
void flat_to_packed(const ShardLayout &l, bool expert, const float *flat,
                    const std::vector<float *> &packed) {
  for (const auto &[b, at] : l.packed(expert)) {
    const int64_t n = l.n(*b);
    for (size_t r = 0; r < packed.size(); ++r)
      std::memcpy(packed[r] + at, flat + b->begin + int64_t(r) * n, size_t(n) * 4);
  }
}

// The checkpoint's ranks: a file per writer (checkpoint_role) of each
// stage. A stage's rank i = tp_rank + tp dp_rank = etp_rank + etp (ep_rank
// + ep edp_rank) writes when dp_rank is 0 (i < tp, the dense parameters) or
// edp_rank is 0 (i < etp ep, the experts); its file is named by
// (i mod max(tp, etp), ep_rank): the tp rank, as Megatron names it, unless
// etp > tp, when it is the etp rank (which the tp rank would not tell
// apart). No two writers share a name.
struct FileCoords {
  int tp_rank, ep_rank; // the name's
  int etp_rank = 0;     // the expert-tensor-parallel rank of its experts
  bool operator<(const FileCoords &o) const {
    return tp_rank != o.tp_rank ? tp_rank < o.tp_rank : ep_rank < o.ep_rank;
  }
};
std::vector<FileCoords> stage_files(int tp, int ep, int etp) {
  std::vector<FileCoords> files;
  const int m = std::max(tp, etp);
  for (int i = 0; i < std::max(tp, etp * ep); ++i)
    files.push_back({i % m, (i / etp) % ep, i % etp});
  std::sort(files.begin(), files.end());
  return files;
}

// How a saved parameter's shard sits in the whole tensor: split over the ep
// ranks on ep_dim (one block), then within that over the etp ranks (an
// expert's tp_dim, etp) or the tp ranks (a dense tp_dim) on tp_dim.
struct Split {
  int dim = -1, blocks = 1, ranks = 1, slot = 0;
};
struct Placement {
  Split outer, inner; // outer: ep; inner: tp or etp
  int slots() const { return outer.ranks * inner.ranks; }
  int slot() const { return outer.slot * inner.ranks + inner.slot; }
  std::vector<int64_t> whole(const std::vector<int64_t> &shard) const {
    std::vector<int64_t> w = shard;
    for (const Split *s : {&inner, &outer})
      if (s->dim >= 0)
        w[size_t(s->dim)] =
            w[size_t(s->dim)] > INT64_MAX / s->ranks ? -1 : w[size_t(s->dim)] * s->ranks;
    return w;
  }
};
Placement placement(int tp_dim, int tp_blocks, int ep_dim, bool etp_shard, int tp, int ep,
                    int etp, int tp_rank, int ep_rank, int etp_rank) {
  Placement pl;
  if (ep_dim >= 0)
    pl.outer = {ep_dim, 1, ep, ep_rank};
  if (tp_dim >= 0)
    pl.inner = etp_shard ? Split{tp_dim, tp_blocks, etp, etp_rank}
                         : Split{tp_dim, tp_blocks, tp, tp_rank};
  return pl;
}

// Copies between a whole tensor and the shard `pl` places (both splits).
void place_shard(const Placement &pl, float *whole, float *shard,
                 const std::vector<int64_t> &shard_shape, bool to_shard) {
  if (pl.outer.dim < 0 || pl.inner.dim < 0) {
    const Split &s = pl.outer.dim >= 0 ? pl.outer : pl.inner;
    copy_shard(whole, shard, shard_shape, s.dim, s.blocks, s.ranks, s.slot, to_shard);
    return;
  }
  // The ep slice of the whole, then the tp/etp shard within it.
  std::vector<int64_t> mid_shape = shard_shape;
  mid_shape[size_t(pl.inner.dim)] *= pl.inner.ranks;
  std::vector<float> mid(size_t(numel(mid_shape)));
  copy_shard(whole, mid.data(), mid_shape, pl.outer.dim, 1, pl.outer.ranks, pl.outer.slot, true);
  copy_shard(mid.data(), shard, shard_shape, pl.inner.dim, pl.inner.blocks, pl.inner.ranks,
             pl.inner.slot, to_shard);
  if (!to_shard)
    copy_shard(whole, mid.data(), mid_shape, pl.outer.dim, 1, pl.outer.ranks, pl.outer.slot,
               false);
}

} // namespace

std::string shard_layout(const pl::Plan &plan, const pl::Rank &r) {
  return layout_string(layout_of(plan, r));
}

std::vector<std::pair<int, int>> checkpoint_stage_files(int tp, int ep, int etp) {
  std::vector<std::pair<int, int>> out;
  for (const FileCoords &f : stage_files(std::max(1, tp), std::max(1, ep), std::max(1, etp)))
    out.push_back({f.tp_rank, f.ep_rank});
  return out;
}

std::string shard_tensor_name(bool experts, int group_rank, const std::string &kind) {
  char name[64];
  std::snprintf(name, sizeof name, "%s_rank_%02d.%s", experts ? "edp" : "dp", group_rank,
                kind.c_str());
  return name;
}

int64_t packed_shard_elements(const pl::Plan &plan, const pl::Rank &rank, bool experts) {
  return layout_of(plan, rank).elements(experts);
}

void pack_shard(const pl::Plan &plan, const pl::Rank &rank, bool experts, const float *shard,
                float *packed) {
  const ShardLayout l = layout_of(plan, rank);
  for (const auto &[b, at] : l.packed(experts))
    std::memcpy(packed + at, shard + b->offset, size_t(l.n(*b)) * 4);
}

void unpack_shard(const pl::Plan &plan, const pl::Rank &rank, bool experts, const float *packed,
                  float *shard) {
  const ShardLayout l = layout_of(plan, rank);
  for (const auto &[b, at] : l.packed(experts))
    std::memcpy(shard + b->offset, packed + at, size_t(l.n(*b)) * 4);
}

CheckpointRole checkpoint_role(const pl::Plan &plan, const pl::Rank &rank) {
  CheckpointRole role;
  role.dense = rank.dp_rank() == 0;
  role.experts = expert_coords(plan, rank).edp_rank == 0;
  return role;
}

int checkpoint_name_rank(const pl::Plan &plan, const pl::Rank &rank) {
  const int tp = std::max(1, plan.tensor_parallel());
  const int m = std::max<int>(tp, int(std::max<int64_t>(1, plan.expert_tensor_parallel())));
  return int((rank.tp_rank() + int64_t(tp) * rank.dp_rank()) % m);
}

std::string rank_checkpoint_file(const pl::Plan &plan, const pl::Rank &rank, bool distrib_optim) {
  return checkpoint_file_name(checkpoint_name_rank(plan, rank), rank.pp_rank(), std::max(1, plan.pipeline_parallel()),
                              distrib_optim, int(expert_coords(plan, rank).ep_rank),
                              std::max(1, plan.expert_model_parallel()));
}

const pl::Rank *checkpoint_writer(const pl::Plan &plan, const pl::Rank &rank, bool experts) {
  const int tp = std::max(1, plan.tensor_parallel());
  int tp_rank = rank.tp_rank(), dp_rank = 0;
  if (experts) { // expert-dp rank 0 of the same etp and ep ranks: stage index etp_rank + etp ep_rank
    const ExpertCoords c = expert_coords(plan, rank);
    const int64_t i = c.etp_rank + c.ep_rank * std::max(1, plan.expert_tensor_parallel());
    tp_rank = int(i % tp);
    dp_rank = int(i / tp);
  }
  for (uint32_t k = 0; plan.ranks() && k < plan.ranks()->size(); ++k) {
    const pl::Rank *r = plan.ranks()->Get(k);
    if (r->pp_rank() == rank.pp_rank() && r->tp_rank() == tp_rank && r->dp_rank() == dp_rank)
      return r;
  }
  return nullptr;
}

namespace {

// An expert's tp_dim is a shard over the etp ranks (plan.fbs, Param):
// marked "EP_DIM etp" (EP_DIM -1 without ep), so it is not read as a tp one.
std::string param_entry(const pl::Param *p) {
  const bool etp = p->expert() && p->tp_dim() >= 0;
  return str(p->name()) + " " + std::to_string(p->tp_dim()) + " " +
         std::to_string(p->tp_blocks()) + " " + std::to_string(p->flat_offset()) + " " +
         shape_text(shape_of(p)) +
         (p->ep_dim() >= 0 || etp ? " " + std::to_string(p->ep_dim()) : "") +
         (etp ? " etp" : "");
}

} // namespace

std::string param_layout(const pl::Rank &rank) {
  std::string s;
  for (uint32_t i = 0; rank.params() && i < rank.params()->size(); ++i)
    s += (i ? ";" : "") + param_entry(rank.params()->Get(i));
  return s;
}

std::string param_layout(const pl::Plan &plan, const pl::Rank &rank) {
  const CheckpointRole role = checkpoint_role(plan, rank);
  std::string s;
  for (uint32_t i = 0; rank.params() && i < rank.params()->size(); ++i) {
    const pl::Param *p = rank.params()->Get(i);
    if (p->expert() ? role.experts : role.dense)
      s += (s.empty() ? "" : ";") + param_entry(p);
  }
  return s;
}

void add_layout_values(const pl::Plan &plan, const pl::Rank &rank, CheckpointMeta *meta) {
  meta->values["tensor_parallel"] = std::to_string(std::max(1, plan.tensor_parallel()));
  meta->values["pipeline_parallel"] = std::to_string(std::max(1, plan.pipeline_parallel()));
  meta->values["data_parallel"] = std::to_string(std::max(1, plan.data_parallel()));
  if (plan.expert_model_parallel() > 1)
    meta->values["expert_model_parallel"] = std::to_string(plan.expert_model_parallel());
  else
    meta->values.erase("expert_model_parallel");
  if (plan.expert_tensor_parallel() > 1)
    meta->values["expert_tensor_parallel"] = std::to_string(plan.expert_tensor_parallel());
  else
    meta->values.erase("expert_tensor_parallel");
  if (rank.distributed_optimizer() && rank.shard_elements() > 0 &&
      !meta->values.count("no_save_optim"))
    meta->values["distributed_optimizer"] = shard_layout(plan, rank);
  else
    meta->values.erase("distributed_optimizer");
  meta->values["param_layout"] = param_layout(plan, rank);
}

namespace {

// Whether `rank` writes a distributed-optimizer file: shards of a group
// whose parameters it writes.
bool writes_distrib_optim(const pl::Plan &plan, const pl::Rank &rank) {
  if (!rank.distributed_optimizer() || rank.shard_elements() <= 0)
    return false;
  const CheckpointRole role = checkpoint_role(plan, rank);
  const ShardLayout l = layout_of(plan, rank);
  return (role.dense && l.has(false)) || (role.experts && l.has(true));
}

} // namespace

std::vector<std::string> checkpoint_files_of(const pl::Plan &plan, bool with_optimizer) {
  std::vector<std::string> files;
  for (uint32_t i = 0; plan.ranks() && i < plan.ranks()->size(); ++i) {
    const pl::Rank *r = plan.ranks()->Get(i);
    if (!checkpoint_role(plan, *r).writes())
      continue;
    files.push_back(rank_checkpoint_file(plan, *r, false));
    if (with_optimizer && writes_distrib_optim(plan, *r))
      files.push_back(rank_checkpoint_file(plan, *r, true));
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string check_saved_layout(const CheckpointReader &first, const std::string &load_dir,
                               const pl::Plan &plan, const std::string &plan_path) {
  const CheckpointMeta &m = first.meta();
  const int tp = int_value(m, "tensor_parallel", 1), pp = first.pp_size();
  const int dp = int_value(m, "data_parallel", 1), ep = int_value(m, "expert_model_parallel", 1);
  const int etp = int_value(m, "expert_tensor_parallel", 1);
  const int want_tp = std::max(1, plan.tensor_parallel()),
            want_pp = std::max(1, plan.pipeline_parallel()),
            want_dp = std::max(1, plan.data_parallel()),
            want_ep = std::max(1, plan.expert_model_parallel()),
            want_etp = std::max(1, plan.expert_tensor_parallel());
  if (tp < 1 || dp < 1 || ep < 1 || etp < 1)
    return first.path() + ": error: the metadata value '" +
           (tp < 1   ? "tensor_parallel"
            : dp < 1 ? "data_parallel"
            : ep < 1 ? "expert_model_parallel"
                     : "expert_tensor_parallel") +
           "' is not an integer in [1, 65536]; the file is damaged: load an earlier iteration "
           "instead, or start from scratch";
  if (ep != first.ep_size())
    return first.path() + ": error: its name and header give expert-parallel size " +
           std::to_string(first.ep_size()) + " but its metadata expert_model_parallel " +
           std::to_string(ep) + "; the file is damaged: load an earlier iteration instead";
  if (tp == want_tp && pp == want_pp && ep == want_ep && etp == want_etp)
    return "";
  std::string keyText;
  if (ep != want_ep)
    keyText += "expert_model_parallel_size " + std::to_string(ep) + " in the checkpoint, " +
               std::to_string(want_ep) + " in the plan";
  if (etp != want_etp)
    keyText += std::string(keyText.empty() ? "" : "; ") + "expert_tensor_parallel_size " +
               std::to_string(etp) + " in the checkpoint, " + std::to_string(want_etp) +
               " in the plan";
  return "checkpoint " + first.path() + " was saved by " + layout_text(tp, pp, dp, ep, etp) +
         " ranks but " + plan_path + " is " +
         layout_text(want_tp, want_pp, want_dp, want_ep, want_etp) +
         (keyText.empty() ? "" : " (" + keyText + ")") + "; convert it with 'mtc reshard --load " + load_dir + " --plan " + plan_path +
         " --save NEW_DIR' and load NEW_DIR, or load it with a plan of the layout it was "
         "saved with";
}

std::string check_rank_params(const CheckpointReader &reader, const pl::Plan &plan,
                              const pl::Rank &writer, const std::string &load_dir,
                              const std::string &plan_path) {
  auto it = reader.meta().values.find("param_layout");
  if (it == reader.meta().values.end())
    return ""; // saved before layouts were recorded: one rank, checked tensor by tensor
  const std::string want = param_layout(plan, writer);
  if (it->second == want)
    return "";
  std::vector<SavedParam> have;
  parse_param_layout(it->second, &have);
  const CheckpointRole role = checkpoint_role(plan, writer);
  std::string diff;
  for (uint32_t i = 0; i < writer.params()->size() && diff.empty(); ++i) {
    const pl::Param *p = writer.params()->Get(i);
    std::string name = str(p->name());
    if ((p->expert() ? role.experts : role.dense) &&
        std::none_of(have.begin(), have.end(), [&](const SavedParam &s) { return s.name == name; }))
      diff = "it lacks " + name;
  }
  if (diff.empty())
    diff = "its parameters are sharded or laid out differently";
  return "checkpoint " + reader.path() + " does not hold the parameters of " + plan_path +
         "'s pipeline stage " + std::to_string(writer.pp_rank()) + " (" + diff +
         "): the layers are split over the stages differently; convert it with 'mtc reshard "
         "--load " +
         load_dir + " --plan " + plan_path + " --save NEW_DIR', or compile with the stage split "
         "it was saved with";
}

// ---------------------------------------------------------------------------
// The collective save
// ---------------------------------------------------------------------------

namespace {

// All ranks learn whether any failed: the highest failing world rank + 1, or 0.
std::string agree(Communicator *world, int world_rank, bool failed, int *failed_rank) {
  float flag = failed ? float(world_rank + 1) : 0.0f;
  if (world)
    if (std::string err = world->all_reduce(&flag, 1, ReduceOp::Max); !err.empty())
      return err;
  *failed_rank = int(flag) - 1;
  return "";
}

} // namespace

std::string save_checkpoint_collective(Communicator *world, int world_rank,
                                       const std::string &save_dir, const CheckpointMeta &meta,
                                       const std::vector<std::string> &files, bool writes,
                                       const std::vector<CheckpointTensor> &tensors, int tp_rank,
                                       int pp_rank, int pp_size,
                                       const std::vector<CheckpointTensor> *distrib_optim,
                                       int ep_rank, int ep_size) {
  const std::string nothing = "; nothing was saved, the previous checkpoint stays the latest";
  auto other = [&](int r, const char *what) {
    return save_dir + ": error: rank " + std::to_string(r) + " could not " + what +
           " for iteration " + std::to_string(meta.iteration) + " (its error says why)" + nothing;
  };
  // 1. Rank 0 makes the staging directory and tells the others its name
  // (as bytes in floats: every byte value is exact in a float).
  std::string staging, err;
  constexpr size_t kMaxName = 4096;
  std::vector<float> name(kMaxName + 1, 0.0f);
  if (world_rank == 0) {
    err = begin_checkpoint_save(save_dir, meta.iteration, &staging);
    if (err.empty() && staging.size() > kMaxName) {
      abort_checkpoint_save(staging);
      err = save_dir + ": error: the path is longer than " + std::to_string(kMaxName) +
            " bytes; save to a shorter path";
    }
    name[0] = err.empty() ? float(staging.size()) : -1.0f;
    for (size_t i = 0; err.empty() && i < staging.size(); ++i)
      name[i + 1] = float(static_cast<unsigned char>(staging[i]));
  }
  if (world) {
    if (std::string e = world->broadcast(name.data(), name.size(), 0); !e.empty())
      return e;
    if (name[0] < 0)
      return world_rank == 0 ? err : other(0, "create the staging directory");
    staging.resize(size_t(name[0]));
    for (size_t i = 0; i < staging.size(); ++i)
      staging[i] = char(static_cast<unsigned char>(name[i + 1]));
  } else if (!err.empty()) {
    return err;
  }

  // 2. The writers write; everyone agrees on the outcome.
  if (writes)
    err = write_checkpoint_files(staging, meta, tensors, tp_rank, pp_rank, pp_size,
                                 distrib_optim, ep_rank, ep_size);
  int failed = -1;
  if (std::string e = agree(world, world_rank, !err.empty(), &failed); !e.empty())
    return e;
  if (failed >= 0) {
    if (world_rank == 0)
      abort_checkpoint_save(staging);
    return !err.empty() ? err + nothing : other(failed, "write its checkpoint files");
  }

  // 3. Rank 0 puts the whole iteration in place; everyone agrees again, so
  // no rank goes on (or exits after a SIGTERM) before the save is durable.
  if (world_rank == 0)
    err = commit_checkpoint_save(save_dir, meta.iteration, staging, files);
  if (std::string e = agree(world, world_rank, !err.empty(), &failed); !e.empty())
    return e;
  if (failed >= 0)
    return !err.empty() ? err : other(failed, "rename the checkpoint into place");
  return "";
}

// ---------------------------------------------------------------------------
// Reshard
// ---------------------------------------------------------------------------

namespace {

// A whole tensor, assembled from its shards.
struct Whole {
  std::vector<int64_t> shape;
  std::vector<float> weight, master;
  std::map<std::string, std::vector<float>> state; // the optimizer's, by kind
  bool has_master = false;
  std::string split;      // over which ranks its source shards split ("tensor-parallel")
  std::vector<bool> have; // which shards arrived (ep_rank * etp + etp_rank for experts)
  std::string from;       // the first rank file that held it
  // A fresh start (from-hf): the weight is the f32 value, the master copy
  // (where the plan keeps one) is it, the weight is rounded to the plan's
  // dtype, the optimizer state is zero.
  bool fresh = false;
};

// bf16 and f16 weights are kept as f32 holding values of that precision.
void round_to_dtype(float *x, int64_t n, pl::DType dtype) {
  if (dtype != pl::DType::BF16 && dtype != pl::DType::F16)
    return;
  for (int64_t i = 0; i < n; ++i)
    x[i] = dtype == pl::DType::BF16 ? bf16_to_f32(f32_to_bf16(x[i]))
                                    : f16_to_f32(f32_to_f16(x[i]));
}

// Saves whole tensors in the layout of `plan` into save_dir at `iteration`:
// every model-parallel rank's slice of each, with its optimizer state (the
// distributed optimizer's as dp shards), m0's counters, the plan's spec and
// layout. `source_kind` ("checkpoint") and `source` ("the checkpoint DIR") name
// where the tensors came from in errors. *files
// gets the number of rank files written.
std::string save_in_layout(const std::map<std::string, Whole> &wholes,
                           const std::vector<std::string> &kinds, const std::string &src_dtype,
                           const CheckpointMeta &m0, const pl::Plan &plan,
                           const std::string &plan_path, const std::string &source_kind,
                           const std::string &source, const std::string &save_dir,
                           int64_t iteration, size_t *files) {
  // A checkpoint saved without the optimizer's state stays so: the weights
  // alone (`kinds` is then empty).
  const bool with_optimizer = !m0.values.count("no_save_optim");
  // The target: every parameter of every model-parallel rank, sliced.
  const int tp = std::max(1, plan.tensor_parallel()), pp = std::max(1, plan.pipeline_parallel());
  const int ep = std::max(1, plan.expert_model_parallel());
  const int etp = std::max(1, plan.expert_tensor_parallel());
  std::map<std::string, bool> used;
  struct Out {
    const pl::Rank *rank;
    int ep_rank = 0, etp_rank = 0;
    std::vector<std::vector<float>> data; // owns the tensors' bytes
    std::vector<CheckpointTensor> tensors, distrib;
    CheckpointMeta meta;
  };
  std::vector<std::unique_ptr<Out>> outs;
  const std::string other_model = "; compile the target plan from the same model as the " +
                                  source_kind + " (only [parallel] may differ)";
  for (uint32_t i = 0; i < plan.ranks()->size(); ++i) {
    const pl::Rank *rank = plan.ranks()->Get(i);
    const CheckpointRole role = checkpoint_role(plan, *rank);
    if (!role.writes())
      continue;
    auto out = std::make_unique<Out>();
    out->rank = rank;
    out->ep_rank = int(expert_coords(plan, *rank).ep_rank);
    out->etp_rank = int(expert_coords(plan, *rank).etp_rank);
    const ShardLayout layout = layout_of(plan, *rank);
    out->data.reserve(rank->params()->size() * 4 + 3 * size_t(layout.dp + layout.edp));
    const bool distopt =
        with_optimizer && rank->distributed_optimizer() && rank->shard_elements() > 0;
    std::map<std::string, std::vector<float>> flat;
    if (distopt) {
      for (const std::string &k : kinds)
        flat[k].assign(size_t(rank->flat_elements()), 0.0f);
      if (rank->shard_master_offset() >= 0)
        flat["master"].assign(size_t(rank->flat_elements()), 0.0f);
    }
    for (uint32_t k = 0; k < rank->params()->size(); ++k) {
      const pl::Param *p = rank->params()->Get(k);
      const std::string name = str(p->name());
      if (!(p->expert() ? role.experts : role.dense)) {
        used[name] = true; // another rank's file holds it
        continue;
      }
      const Placement at =
          placement(p->tp_dim(), p->tp_blocks(), p->ep_dim(), p->expert() && p->tp_dim() >= 0,
                    tp, ep, etp, rank->tp_rank(), out->ep_rank, out->etp_rank);
      std::vector<int64_t> shard = shape_of(p), whole = at.whole(shard);
      auto it = wholes.find(name);
      if (it == wholes.end())
        return plan_path + ": error: parameter " + name + " is not in " + source + other_model;
      const Whole &w = it->second;
      if (w.shape != whole)
        return plan_path + ": error: parameter " + name + " is " + shape_text(whole) +
               " but the " + source_kind + "'s is " + shape_text(w.shape) + other_model;
      if (!src_dtype.empty() && src_dtype != dtype_label(p->dtype()))
        return plan_path + ": error: trains " + dtype_label(p->dtype()) +
               " weights but the checkpoint was saved from " + src_dtype +
               " ones; compile the target plan with the checkpoint's training.precision";
      const bool want_master = !with_optimizer ? false
                               : distopt       ? rank->shard_master_offset() >= 0
                                               : p->master_offset() >= 0;
      if (want_master != w.has_master && !w.fresh)
        return plan_path + ": error: " +
               (want_master ? "keeps f32 master copies but the checkpoint has none"
                            : "keeps no master copies but the checkpoint has them") +
               " (for " + name + "); compile the target plan with the checkpoint's "
                                  "training.precision";
      used[name] = true;
      const int64_t n = numel(shard);
      auto slice = [&](const std::vector<float> &src) {
        out->data.emplace_back(size_t(n));
        place_shard(at, const_cast<float *>(src.data()), out->data.back().data(), shard, true);
        return out->data.back().data();
      };
      float *weight = slice(w.weight);
      if (w.fresh) // the master is the value; the weight, what the forward computes with
        round_to_dtype(weight, n, p->dtype());
      out->tensors.push_back({name, "f32", shard, weight, size_t(n) * 4});
      struct Part {
        std::string suffix, kind;
        const std::vector<float> *src;
      };
      std::vector<Part> parts;
      if (want_master)
        parts.push_back({".master", "master", w.fresh ? &w.weight : &w.master});
      for (const std::string &k : kinds)
        parts.push_back({"." + k, k, &w.state.at(k)});
      for (const Part &part : parts) {
        float *s = slice(*part.src);
        if (distopt) {
          std::memcpy(flat[part.kind].data() + p->flat_offset(), s, size_t(n) * 4);
          out->data.pop_back();
        } else {
          out->tensors.push_back({name + part.suffix, "f32", shard, s, size_t(n) * 4});
        }
      }
    }
    if (distopt) {
      std::vector<std::string> shard_kinds = {"master"};
      shard_kinds.insert(shard_kinds.end(), kinds.begin(), kinds.end());
      for (bool experts : {false, true}) {
        if (!(experts ? role.experts : role.dense) || !layout.has(experts))
          continue;
        const int group = layout.group(experts);
        const int64_t packed_n = layout.elements(experts);
        for (const std::string &kind : shard_kinds) {
          if (!flat.count(kind))
            continue;
          std::vector<float *> ptrs;
          size_t at = out->data.size();
          for (int d = 0; d < group; ++d)
            out->data.emplace_back(size_t(packed_n), 0.0f);
          for (int d = 0; d < group; ++d)
            ptrs.push_back(out->data[at + size_t(d)].data());
          flat_to_packed(layout, experts, flat[kind].data(), ptrs);
          for (int d = 0; d < group; ++d)
            out->distrib.push_back({shard_tensor_name(experts, d, kind), "f32", {packed_n},
                                    ptrs[size_t(d)], size_t(packed_n) * 4});
        }
      }
    }
    CheckpointMeta &m = out->meta;
    m = m0;
    m.spec_toml = str(plan.spec_toml());
    m.model_fingerprint = str(plan.model_fingerprint());
    if (rank->params()->size() > 0)
      m.values["weights_dtype_in_plan"] = dtype_label(rank->params()->Get(0)->dtype());
    add_layout_values(plan, *rank, &m);
    outs.push_back(std::move(out));
  }
  for (const auto &[name, w] : wholes)
    if (!used.count(name))
      return plan_path + ": error: has no parameter " + name + ", which " + source + " holds" +
             other_model;

  std::string staging;
  if (std::string e = begin_checkpoint_save(save_dir, iteration, &staging); !e.empty())
    return e;
  for (const auto &out : outs) {
    const bool distopt = !out->distrib.empty();
    if (std::string e = write_checkpoint_files(staging, out->meta, out->tensors,
                                               checkpoint_name_rank(plan, *out->rank),
                                               out->rank->pp_rank(), pp,
                                               distopt ? &out->distrib : nullptr, out->ep_rank,
                                               ep);
        !e.empty()) {
      abort_checkpoint_save(staging);
      return e;
    }
  }
  if (std::string e = commit_checkpoint_save(save_dir, iteration, staging,
                                             checkpoint_files_of(plan, with_optimizer));
      !e.empty())
    return e;
  *files = outs.size();
  return "";
}

} // namespace

std::string reshard_checkpoint(const std::string &load_dir, int64_t iteration,
                               const pl::Plan &plan, const std::string &plan_path,
                               const std::string &save_dir, std::string *summary) {
  std::string err;
  struct stat a {}, b {};
  if (::stat(load_dir.c_str(), &a) == 0 && ::stat(save_dir.c_str(), &b) == 0 &&
      a.st_dev == b.st_dev && a.st_ino == b.st_ino)
    return save_dir + ": error: --save names the --load directory; save the converted "
                      "checkpoint to another directory";
  auto first = CheckpointReader::open_first(load_dir, iteration, &err);
  if (!first)
    return err;
  const CheckpointMeta &m0 = first->meta();
  iteration = m0.iteration;
  const int src_tp = int_value(m0, "tensor_parallel", 1), src_pp = first->pp_size();
  const int src_ep = int_value(m0, "expert_model_parallel", 1);
  const int src_etp = int_value(m0, "expert_tensor_parallel", 1);
  // The optimizer's state kinds (torch's names): Adam's two moments or SGD's
  // momentum buffer. Checkpoints without the record predate SGD.
  // A checkpoint saved without the optimizer's state has the weights alone.
  const bool with_optimizer = !m0.values.count("no_save_optim");
  const std::string optimizer = value_of(m0, "optimizer", "adam");
  const std::string target_optimizer =
      plan.training() && plan.training()->optimizer() && plan.training()->optimizer()->size()
          ? plan.training()->optimizer()->str()
          : "adam";
  if (with_optimizer && optimizer != target_optimizer)
    return plan_path + ": error: trains with " + target_optimizer +
           " but the checkpoint holds the optimizer state of " + optimizer +
           "; compile the target plan with the checkpoint's training.optimizer";
  const std::vector<std::string> kinds =
      !with_optimizer      ? std::vector<std::string>{}
      : optimizer == "sgd" ? std::vector<std::string>{"momentum_buffer"}
                           : std::vector<std::string>{"exp_avg", "exp_avg_sq"};
  if (src_tp < 1 || src_ep < 1 || src_etp < 1 || int64_t(src_etp) * src_ep > (1 << 16))
    return first->path() + ": error: the metadata value '" +
           (src_tp < 1   ? "tensor_parallel"
            : src_ep < 1 ? "expert_model_parallel"
                         : "expert_tensor_parallel") +
           "' is not an integer in [1, 65536]; the file is damaged: convert an earlier "
           "iteration instead";
  if (src_ep != first->ep_size())
    return first->path() + ": error: its name and header give expert-parallel size " +
           std::to_string(first->ep_size()) + " but its metadata expert_model_parallel " +
           std::to_string(src_ep) + "; the file is damaged: convert an earlier iteration";
  const std::vector<FileCoords> files = stage_files(src_tp, src_ep, src_etp);

  // Every source rank file is there before anything is assembled.
  for (int s = 0; s < src_pp; ++s)
    for (const FileCoords &f : files) {
      const std::string dir = load_dir + "/" + ckpt_detail::iter_name(iteration);
      if (!ckpt_detail::exists(dir + "/" + checkpoint_file_name(f.tp_rank, s, src_pp, false,
                                                                f.ep_rank, src_ep)) &&
          !CheckpointReader::open(load_dir, iteration, f.tp_rank, s, src_pp, &err, false,
                                  f.ep_rank, src_ep))
        return err; // names the missing file and what the directory holds
    }
  // Every whole tensor, from every source rank file.
  std::map<std::string, Whole> wholes;
  std::string src_dtype = value_of(m0, "weights_dtype_in_plan", "");
  for (int s = 0; s < src_pp; ++s)
    for (const FileCoords &f : files) {
      const int r = f.tp_rank;
      auto reader =
          CheckpointReader::open(load_dir, iteration, r, s, src_pp, &err, false, f.ep_rank, src_ep);
      if (!reader)
        return err;
      const CheckpointMeta &m = reader->meta();
      const std::string &path = reader->path();
      if (m.model_fingerprint != m0.model_fingerprint ||
          int_value(m, "tensor_parallel", 1) != src_tp ||
          int_value(m, "expert_model_parallel", 1) != src_ep ||
          int_value(m, "expert_tensor_parallel", 1) != src_etp ||
          m.values.count("no_save_optim") != m0.values.count("no_save_optim"))
        return path + ": error: belongs to another save than " + first->path() +
               " (another model or layout); the iteration directory mixes files of several "
               "runs: convert another iteration";
      std::vector<SavedParam> params;
      auto pl_it = m.values.find("param_layout");
      if (pl_it != m.values.end()) {
        if (!parse_param_layout(pl_it->second, &params))
          return path + ": error: the metadata's param_layout is malformed; the file is "
                        "damaged: convert an earlier iteration";
      } else if (src_tp == 1 && src_ep == 1 && !m.values.count("distributed_optimizer")) {
        // Saved before layouts were recorded: one rank, whole tensors.
        for (const std::string &n : reader->tensor_names()) {
          if (n.find(".exp_avg") != std::string::npos ||
              n.find(".momentum_buffer") != std::string::npos ||
              (n.size() > 7 && n.compare(n.size() - 7, 7, ".master") == 0))
            continue;
          params.push_back({n, -1, 1, -1, reader->shape(n)});
        }
      } else {
        return path + ": error: the metadata lacks param_layout, so its tensor-parallel shards "
                      "cannot be told apart; convert a checkpoint saved by this mt";
      }

      // The distributed optimizer's state as flat buffers of this rank:
      // the groups whose shards the file holds (dp_rank_RR, edp_rank_RR).
      const bool distopt = m.values.count("distributed_optimizer") > 0;
      std::map<std::string, std::vector<float>> flat;
      if (distopt) {
        ShardLayout layout;
        if (!parse_shard_layout(m.values.at("distributed_optimizer"), &layout))
          return path + ": error: the metadata's distributed_optimizer layout '" +
                 m.values.at("distributed_optimizer") +
                 "' is malformed; the file is damaged: convert an earlier iteration";
        std::vector<std::string> shard_kinds = {"master"};
        shard_kinds.insert(shard_kinds.end(), kinds.begin(), kinds.end());
        std::unique_ptr<CheckpointReader> optim;
        for (bool experts : {false, true}) {
          if (!layout.has(experts))
            continue;
          // The groups whose parameters the file holds.
          const bool holds = std::any_of(params.begin(), params.end(), [&](const SavedParam &p) {
            return std::any_of(layout.buckets.begin(), layout.buckets.end(),
                               [&](const ShardBucket &bk) {
                                 return bk.expert == experts && p.flat_offset >= bk.begin &&
                                        p.flat_offset < bk.end;
                               });
          });
          if (!holds)
            continue;
          if (!optim && !(optim = CheckpointReader::open(load_dir, iteration, r, s, src_pp, &err,
                                                         true, f.ep_rank, src_ep)))
            return err;
          const int group = layout.group(experts);
          const int64_t packed_n = layout.elements(experts);
          for (const std::string &kind : shard_kinds) {
            if (!optim->has(shard_tensor_name(experts, 0, kind)))
              continue;
            // The file's own shapes bound what is allocated.
            for (int d = 0; d < group; ++d)
              if (optim->shape(shard_tensor_name(experts, d, kind)) !=
                  std::vector<int64_t>{packed_n})
                return optim->path() + ": error: has no " + shard_tensor_name(experts, d, kind) +
                       " of [" + std::to_string(packed_n) +
                       "] f32 as its metadata's distributed_optimizer layout says; the file is "
                       "damaged: convert an earlier iteration";
            std::vector<std::vector<float>> shards(static_cast<size_t>(group));
            std::vector<const float *> ptrs;
            for (int d = 0; d < group; ++d) {
              shards[size_t(d)].resize(size_t(packed_n));
              if (std::string e = optim->read(shard_tensor_name(experts, d, kind), "f32",
                                              {packed_n}, shards[size_t(d)].data(),
                                              size_t(packed_n) * 4);
                  !e.empty())
                return e;
              ptrs.push_back(shards[size_t(d)].data());
            }
            std::vector<float> &fl = flat[kind];
            if (fl.empty())
              fl.assign(size_t(layout.flat), 0.0f);
            packed_to_flat(layout, experts, ptrs, fl.data());
          }
        }
      }

      for (const SavedParam &p : params) {
        const std::vector<int64_t> &shard = p.shape;
        // The file's own tensor bounds what is allocated for it.
        if (!reader->has(p.name) || reader->shape(p.name) != shard)
          return path + ": error: the metadata's param_layout gives " + p.name + " as " +
                 shape_text(shard) + " but the file holds " +
                 (reader->has(p.name) ? shape_text(reader->shape(p.name)) : "no such tensor") +
                 "; the file is damaged: convert an earlier iteration";
        if (p.etp && src_etp < 2)
          return path + ": error: the metadata's param_layout gives " + p.name +
                 " as a shard over expert-tensor-parallel ranks but its "
                 "expert_tensor_parallel is 1; the file is damaged: convert an earlier iteration";
        // Sharded over tp ranks, over ep ranks and within them over etp
        // ranks, or whole.
        const Placement at = placement(p.tp_dim, p.tp_blocks, p.ep_dim, p.etp, src_tp, src_ep,
                                       src_etp, r, f.ep_rank, f.etp_rank);
        const int ranks = at.slots(), slot = at.slot();
        std::vector<int64_t> whole_shape = at.whole(shard);
        uint64_t whole_bytes = 0;
        if (!ckpt_detail::shape_bytes(whole_shape, 4, &whole_bytes))
          return path + ": error: the metadata's param_layout makes " + p.name +
                 " too large to assemble; the file is damaged: convert an earlier iteration";
        Whole &w = wholes[p.name];
        if (w.have.empty()) {
          w.shape = whole_shape;
          w.split = p.ep_dim >= 0 && p.tp_dim >= 0 ? "expert- and expert-tensor-parallel"
                    : p.ep_dim >= 0                ? "expert-parallel"
                    : p.etp                        ? "expert-tensor-parallel"
                                                   : "tensor-parallel";
          w.have.assign(size_t(ranks), false);
          w.from = path;
          size_t n = size_t(numel(whole_shape));
          w.weight.resize(n);
          for (const std::string &k : kinds)
            w.state[k].resize(n);
          w.has_master = !with_optimizer ? false
                         : distopt         ? flat.count("master") > 0
                                           : reader->has(p.name + ".master");
          if (w.has_master)
            w.master.resize(n);
        } else if (w.shape != whole_shape || w.have.size() != size_t(ranks)) {
          return path + ": error: holds " + p.name + " as a shard of " + shape_text(whole_shape) +
                 " but " + w.from + " of " + shape_text(w.shape) +
                 "; the files are of different models: convert another iteration";
        }
        // A replica, or the pipeline's tied copy: once is enough.
        if (w.have[size_t(slot)])
          continue;
        w.have[size_t(slot)] = true;
        const size_t bytes = size_t(numel(shard)) * 4;
        std::vector<float> buf(size_t(numel(shard)));
        auto place = [&](std::vector<float> &dst) {
          place_shard(at, dst.data(), buf.data(), shard, false);
        };
        struct Part {
          std::string suffix, kind;
          std::vector<float> *dst;
        };
        std::vector<Part> parts = {{"", "", &w.weight}};
        for (const std::string &k : kinds)
          parts.push_back({"." + k, k, &w.state[k]});
        if (w.has_master)
          parts.push_back({".master", "master", &w.master});
        for (const Part &part : parts) {
          if (distopt && !part.kind.empty()) {
            auto fl = flat.find(part.kind);
            if (fl == flat.end() || p.flat_offset < 0 ||
                p.flat_offset > int64_t(fl->second.size()) ||
                int64_t(buf.size()) > int64_t(fl->second.size()) - p.flat_offset)
              return path + ": error: the distributed optimizer's state has no " + part.kind +
                     " for " + p.name + "; the file is damaged: convert an earlier iteration";
            std::memcpy(buf.data(), fl->second.data() + p.flat_offset, bytes);
          } else if (std::string e = reader->read(p.name + part.suffix, "f32", shard, buf.data(),
                                                  bytes);
                     !e.empty()) {
            return e;
          }
          place(*part.dst);
        }
      }
    }
  for (const auto &[name, w] : wholes)
    for (size_t r = 0; r < w.have.size(); ++r)
      if (!w.have[r])
        return load_dir + ": error: no rank file holds " + w.split + " shard " + std::to_string(r) +
               " of " + name + "; the checkpoint is incomplete: convert another iteration";

  size_t written = 0;
  if (std::string e = save_in_layout(wholes, kinds, src_dtype, m0, plan, plan_path, "checkpoint",
                                     "the checkpoint " + load_dir, save_dir, iteration, &written);
      !e.empty())
    return e;
  const int tp = std::max(1, plan.tensor_parallel()), pp = std::max(1, plan.pipeline_parallel());
  const int dp = std::max(1, plan.data_parallel()), ep = std::max(1, plan.expert_model_parallel());
  const int etp = std::max(1, plan.expert_tensor_parallel());
  *summary = "resharded iteration " + std::to_string(iteration) + " of " + load_dir + " (" +
             layout_text(src_tp, src_pp, int_value(m0, "data_parallel", 1), src_ep, src_etp) +
             ", " + std::to_string(wholes.size()) + " tensors) to " + save_dir + " (" +
             layout_text(tp, pp, dp, ep, etp) + ", " + std::to_string(written) + " rank file" +
             (written == 1 ? "" : "s") + ")" +
             (with_optimizer ? "" : "; the checkpoint has no optimizer state (no_save_optim)");
  return "";
}

// ---------------------------------------------------------------------------
// A fresh start from whole weights (mt-checkpoint from-hf)
// ---------------------------------------------------------------------------

std::string save_initial_checkpoint(const std::map<std::string, WholeWeight> &weights,
                                    const pl::Plan &plan, const std::string &plan_path,
                                    const std::string &source,
                                    const std::map<std::string, std::string> &values,
                                    const std::string &save_dir, size_t *files) {
  const pl::Training *t = plan.training();
  const std::string optimizer =
      t && t->optimizer() && t->optimizer()->size() ? t->optimizer()->str() : "adam";
  const std::vector<std::string> kinds =
      optimizer == "sgd" ? std::vector<std::string>{"momentum_buffer"}
                         : std::vector<std::string>{"exp_avg", "exp_avg_sq"};
  std::map<std::string, Whole> wholes;
  for (const auto &[name, w] : weights) {
    Whole &x = wholes[name];
    x.shape = w.shape;
    x.weight = w.data;
    for (const std::string &k : kinds)
      x.state[k].assign(w.data.size(), 0.0f);
    x.fresh = true;
  }
  // Iteration 0, nothing consumed, no step taken: what mtrun's own start
  // holds, with these weights.
  CheckpointMeta m0;
  const bool fp16 = t && t->precision() && t->precision()->str() == "fp16";
  m0.loss_scale = fp16 ? t->initial_loss_scale() : 1.0;
  m0.loss_scale_hysteresis_tracker = t ? t->hysteresis() : 0;
  m0.values = values;
  m0.values["optimizer"] = optimizer;
  m0.values["optimizer_steps"] = "0";
  m0.values["skipped_iterations"] = "0";
  return save_in_layout(wholes, kinds, "", m0, plan, plan_path, "folder", source, save_dir, 0,
                        files);
}

// ---------------------------------------------------------------------------
// Whole weights (mt-checkpoint's export)
// ---------------------------------------------------------------------------

std::string read_whole_weights(const std::string &load_dir, int64_t iteration,
                               CheckpointMeta *meta, std::map<std::string, WholeWeight> *out) {
  std::string err;
  auto first = CheckpointReader::open_first(load_dir, iteration, &err);
  if (!first)
    return err;
  *meta = first->meta();
  iteration = meta->iteration;
  const int tp = int_value(*meta, "tensor_parallel", 1), pp = first->pp_size();
  const int ep = int_value(*meta, "expert_model_parallel", 1);
  const int etp = int_value(*meta, "expert_tensor_parallel", 1);
  if (tp < 1 || ep < 1 || etp < 1 || int64_t(etp) * ep > (1 << 16))
    return first->path() + ": error: the metadata value '" +
           (tp < 1   ? "tensor_parallel"
            : ep < 1 ? "expert_model_parallel"
                     : "expert_tensor_parallel") +
           "' is not an integer in [1, 65536]; the file is damaged: use an earlier iteration "
           "instead";
  if (ep != first->ep_size())
    return first->path() + ": error: its name and header give expert-parallel size " +
           std::to_string(first->ep_size()) + " but its metadata expert_model_parallel " +
           std::to_string(ep) + "; the file is damaged: use an earlier iteration instead";
  std::map<std::string, std::vector<bool>> have; // shards that arrived
  std::map<std::string, std::string> from;
  std::map<std::string, std::string> split; // "tensor-parallel", "expert-parallel" or ""
  for (int s = 0; s < pp; ++s)
    for (const FileCoords &f : stage_files(tp, ep, etp)) {
      const int r = f.tp_rank;
      auto reader = CheckpointReader::open(load_dir, iteration, r, s, pp, &err, false, f.ep_rank, ep);
      if (!reader)
        return err;
      const CheckpointMeta &m = reader->meta();
      const std::string &path = reader->path();
      if (m.model_fingerprint != meta->model_fingerprint ||
          int_value(m, "tensor_parallel", 1) != tp || int_value(m, "expert_model_parallel", 1) != ep ||
          int_value(m, "expert_tensor_parallel", 1) != etp)
        return path + ": error: belongs to another save than " + first->path() +
               " (another model or layout); the iteration directory mixes files of several "
               "runs: use another iteration";
      std::vector<SavedParam> params;
      auto pl_it = m.values.find("param_layout");
      if (pl_it != m.values.end()) {
        if (!parse_param_layout(pl_it->second, &params))
          return path + ": error: the metadata's param_layout is malformed; the file is "
                        "damaged: use an earlier iteration";
      } else if (tp == 1 && ep == 1 && !m.values.count("distributed_optimizer")) {
        for (const std::string &n : reader->tensor_names()) // one rank, whole tensors
          if (n.find(".exp_avg") == std::string::npos &&
              n.find(".momentum_buffer") == std::string::npos &&
              !(n.size() > 7 && n.compare(n.size() - 7, 7, ".master") == 0))
            params.push_back({n, -1, 1, -1, reader->shape(n)});
      } else {
        return path + ": error: the metadata lacks param_layout, so its tensor-parallel shards "
                      "cannot be told apart; use a checkpoint saved by this mt";
      }
      for (const SavedParam &p : params) {
        if (!reader->has(p.name) || reader->shape(p.name) != p.shape)
          return path + ": error: the metadata's param_layout gives " + p.name + " as " +
                 shape_text(p.shape) + " but the file holds " +
                 (reader->has(p.name) ? shape_text(reader->shape(p.name)) : "no such tensor") +
                 "; the file is damaged: use an earlier iteration";
        if (p.etp && etp < 2)
          return path + ": error: the metadata's param_layout gives " + p.name +
                 " as a shard over expert-tensor-parallel ranks but its "
                 "expert_tensor_parallel is 1; the file is damaged: use an earlier iteration";
        const Placement at =
            placement(p.tp_dim, p.tp_blocks, p.ep_dim, p.etp, tp, ep, etp, r, f.ep_rank,
                      f.etp_rank);
        const int ranks = at.slots(), slot = at.slot();
        std::vector<int64_t> whole = at.whole(p.shape);
        uint64_t whole_bytes = 0;
        if (!ckpt_detail::shape_bytes(whole, 4, &whole_bytes))
          return path + ": error: the metadata's param_layout makes " + p.name +
                 " too large to assemble; the file is damaged: use an earlier iteration";
        WholeWeight &w = (*out)[p.name];
        std::vector<bool> &got = have[p.name];
        if (got.empty()) {
          w.shape = whole;
          w.data.assign(size_t(numel(whole)), 0.0f);
          got.assign(size_t(ranks), false);
          from[p.name] = path;
          split[p.name] = p.ep_dim >= 0 && p.tp_dim >= 0 ? "expert- and expert-tensor-parallel"
                          : p.ep_dim >= 0                ? "expert-parallel"
                          : p.etp                        ? "expert-tensor-parallel"
                                                         : "tensor-parallel";
        } else if (w.shape != whole || got.size() != size_t(ranks)) {
          return path + ": error: holds " + p.name + " as a shard of " + shape_text(whole) +
                 " but " + from[p.name] + " of " + shape_text(w.shape) +
                 "; the files are of different models: use another iteration";
        }
        if (got[size_t(slot)])
          continue; // a replica, or the pipeline's tied copy
        got[size_t(slot)] = true;
        std::vector<float> buf(size_t(numel(p.shape)));
        if (std::string e = reader->read(p.name, "f32", p.shape, buf.data(), buf.size() * 4);
            !e.empty())
          return e;
        place_shard(at, w.data.data(), buf.data(), p.shape, false);
      }
    }
  for (const auto &[name, got] : have)
    for (size_t r = 0; r < got.size(); ++r)
      if (!got[r])
        return load_dir + ": error: no rank file holds " + split[name] + " shard " +
               std::to_string(r) + " of " + name +
               "; the checkpoint is incomplete: use another iteration";
  return "";
}

} // namespace mt::rt
