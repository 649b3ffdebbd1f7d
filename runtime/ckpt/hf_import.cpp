// A Hugging Face model folder as an mt checkpoint (see hf_import.h).
#include "runtime/ckpt/hf_import.h"

#include "runtime/ckpt/checkpoint_format.h"
#include "runtime/ckpt/safetensors.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>
#include <set>
#include <simdjson.h>
#include <unistd.h>

namespace mt::rt {

using ckpt_detail::shape_str;

namespace {

// Buffers transformers keeps beside the weights in some files (GPT-2's
// causal masks, older Llamas' RoPE frequencies): not parameters, not read.
bool is_buffer(const std::string &name) {
  auto ends = [&](const char *s) {
    size_t n = std::strlen(s);
    return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
  };
  return ends(".attn.bias") || ends(".attn.masked_bias") || ends("rotary_emb.inv_freq");
}

struct Folder {
  std::string dir;
  std::vector<std::unique_ptr<SafetensorsReader>> files;
  std::vector<std::string> file_names;
  // Every tensor of every file: name -> (file, entry).
  std::map<std::string, std::pair<size_t, const SafetensorsReader::Entry *>> tensors;
  std::set<std::string> used;

  std::string open(const std::string &d) {
    dir = d;
    const std::string index = dir + "/model.safetensors.index.json";
    std::vector<std::string> names;
    std::map<std::string, std::string> listed; // tensor -> file, as the index says
    if (ckpt_detail::exists(index)) {
      simdjson::dom::parser parser;
      simdjson::dom::element root;
      simdjson::dom::object map;
      simdjson::padded_string text;
      if (simdjson::padded_string::load(index).get(text) != simdjson::SUCCESS)
        return index + ": error: cannot read: " + std::strerror(errno);
      if (auto e = parser.parse(text).get(root); e != simdjson::SUCCESS)
        return index + ": error: not valid JSON (" + simdjson::error_message(e) +
               "); save the model again";
      if (root["weight_map"].get_object().get(map) != simdjson::SUCCESS)
        return index + ": error: has no \"weight_map\" object; save the model again";
      std::set<std::string> seen;
      for (auto f : map) {
        std::string_view file;
        if (f.value.get_string().get(file) != simdjson::SUCCESS)
          return index + ": error: weight_map's entry for " + std::string(f.key) +
                 " is not a file name";
        std::string fn(file);
        if (fn.empty() || fn.find('/') != std::string::npos || fn == "." || fn == "..")
          return index + ": error: weight_map names the file '" + fn + "' for " +
                 std::string(f.key) + "; the shards must lie beside the index";
        listed[std::string(f.key)] = fn;
        if (seen.insert(fn).second)
          names.push_back(fn);
      }
      if (names.empty())
        return index + ": error: weight_map lists no tensors";
    } else if (ckpt_detail::exists(dir + "/model.safetensors")) {
      names.push_back("model.safetensors");
    } else {
      return dir + ": error: has neither model.safetensors nor model.safetensors.index.json" +
             (ckpt_detail::exists(dir + "/pytorch_model.bin")
                  ? " (pytorch_model.bin is a pickle mt does not read: save the model with "
                    "save_pretrained(DIR, safe_serialization=True))"
                  : "; give the folder save_pretrained wrote");
    }
    for (const std::string &n : names) {
      if (!ckpt_detail::exists(dir + "/" + n))
        return index + ": error: weight_map names the shard " + n +
               ", which is not in the folder; the folder is incomplete: copy it again";
      std::string err;
      auto r = SafetensorsReader::open(dir + "/" + n, &err);
      if (!r)
        return err;
      for (const SafetensorsReader::Entry &e : r->tensors()) {
        auto [it, fresh] = tensors.insert({e.name, {files.size(), &e}});
        if (!fresh)
          return dir + "/" + n + ": error: holds tensor " + e.name + ", which " +
                 file_names[it->second.first] + " holds too; the shards overlap";
      }
      files.push_back(std::move(r));
      file_names.push_back(n);
    }
    for (const auto &[t, fn] : listed) {
      auto it = tensors.find(t);
      if (it == tensors.end() || file_names[it->second.first] != fn)
        return index + ": error: weight_map puts " + t + " in " + fn + " but " +
               (it == tensors.end() ? "no shard holds it" : "it is in " +
                                                                file_names[it->second.first]) +
               "; the folder is incomplete: copy it again";
    }
    return "";
  }

  std::string where(size_t file) const { return dir + "/" + file_names[file]; }

  // The tensor `name`, or (a base model's file) without the class's prefix.
  const SafetensorsReader::Entry *find(const std::string &name, const std::string &prefix,
                                       size_t *file) {
    auto it = tensors.find(name);
    if (it == tensors.end() && name.compare(0, prefix.size(), prefix) == 0)
      it = tensors.find(name.substr(prefix.size()));
    if (it == tensors.end())
      return nullptr;
    used.insert(it->first);
    *file = it->second.first;
    return it->second.second;
  }

  // The tensor as f32; "" or one error line.
  std::string read(size_t file, const SafetensorsReader::Entry &e, std::vector<float> *out) {
    const unsigned char *p = files[file]->data(e);
    const size_t n = size_t(e.end - e.begin) / safetensors_dtype_size(e.dtype);
    out->resize(n);
    if (e.dtype == "F32") {
      std::memcpy(out->data(), p, n * 4);
    } else if (e.dtype == "BF16" || e.dtype == "F16") {
      for (size_t i = 0; i < n; ++i) {
        const uint16_t bits = uint16_t(p[2 * i] | (p[2 * i + 1] << 8));
        (*out)[i] = e.dtype == "BF16" ? bf16_to_f32(bits) : f16_to_f32(bits);
      }
    } else {
      return where(file) + ": error: tensor " + e.name + " is " + e.dtype +
             "; mt reads F32, BF16 and F16 weights (a quantized model cannot be loaded: "
             "save it unquantized)";
    }
    return "";
  }
};

// "[48, 32] (model.ffn_hidden_size = 48, model.hidden_size = 32)": the
// shape the spec makes, with the keys of the dimensions that differ.
std::string spec_shape(const HfPiece &p, const std::vector<int64_t> &got) {
  std::string keys;
  for (size_t i = 0; i < p.shape.size(); ++i) {
    const size_t k = p.transpose && p.shape.size() == 2 ? 1 - i : i;
    if (k < p.dim_keys.size() && (got.size() != p.shape.size() || got[i] != p.shape[i]))
      keys += (keys.empty() ? "" : "; ") + ("dimension " + std::to_string(i) + ": " + p.dim_keys[k]);
  }
  return shape_str(p.shape) + (keys.empty() ? "" : " (" + keys + ")");
}

} // namespace

std::string read_hf_weights(const std::string &dir, const HfModelSpec &m, const std::string &arch,
                            std::map<std::string, WholeWeight> *out, int64_t *vocab_rows) {
  Folder f;
  if (std::string e = f.open(dir); !e.empty())
    return e;
  const std::string cls = hf_class_name(arch);
  const std::string prefix = hf_base_prefix(arch);
  const std::string fix = "; the spec is not this model's: write it with 'mtc import-hf " + dir +
                          "' and compile that";
  const int64_t vp = m.padded_vocab_size, h = m.hidden_size;

  // The vocabulary: the embedding's rows, between the spec's vocab_size and
  // its padded size.
  const std::vector<HfMapEntry> probe = hf_mapping(m, arch, vp);
  size_t file = 0;
  const HfPiece &emb_piece = probe.front().pieces.front();
  const SafetensorsReader::Entry *emb = f.find(emb_piece.name, prefix, &file);
  if (!emb)
    return dir + ": error: no tensor " + emb_piece.name + " (the token embedding) in " +
           (f.files.size() == 1 ? f.file_names[0] : "the shards") + ", which " + cls + " has" +
           fix;
  if (emb->shape.size() != 2 || emb->shape[1] != h)
    return f.where(file) + ": error: tensor " + emb->name + " is " + shape_str(emb->shape) +
           " but the spec makes it [VOCABULARY, " + std::to_string(h) + "] (model.hidden_size = " +
           std::to_string(h) + ")" + fix;
  const int64_t rows = emb->shape[0];
  if (rows > vp)
    return f.where(file) + ": error: tensor " + emb->name + " has " + std::to_string(rows) +
           " rows but the spec's padded vocabulary is " + std::to_string(vp) +
           " (model.vocab_size = " + std::to_string(m.vocab_size) +
           ", padded to a multiple of make_vocab_size_divisible_by x tensor_model_parallel_size)"
           "; set model.vocab_size to " + std::to_string(rows) + " or more";
  if (rows < m.vocab_size)
    return f.where(file) + ": error: tensor " + emb->name + " has " + std::to_string(rows) +
           " rows but the spec's model.vocab_size is " + std::to_string(m.vocab_size) +
           "; tokens past row " + std::to_string(rows) +
           " would have no embedding: set model.vocab_size to " + std::to_string(rows);
  *vocab_rows = rows;

  std::vector<float> buf;
  for (const HfMapEntry &e : hf_mapping(m, arch, rows)) {
    if (e.mt_name.empty()) { // a GPT-2 bias mt does not have: it must be zero
      const HfPiece &p = e.pieces.front();
      const SafetensorsReader::Entry *t = f.find(p.name, prefix, &file);
      if (!t)
        continue;
      if (std::string err = f.read(file, *t, &buf); !err.empty())
        return err;
      for (float x : buf)
        if (x != 0.0f)
          return f.where(file) + ": error: tensor " + t->name +
                 " is not zero but the spec has model.add_bias_linear = false" + fix;
      continue;
    }
    WholeWeight &w = (*out)[e.mt_name];
    w.shape = e.mt_shape;
    int64_t numel = 1;
    for (int64_t d : e.mt_shape)
      numel *= d;
    w.data.assign(size_t(numel), 0.0f);
    const int64_t cols = e.mt_shape.size() >= 2 ? e.mt_shape.back() : 1;
    for (const HfPiece &p : e.pieces) {
      const SafetensorsReader::Entry *t = f.find(p.name, prefix, &file);
      if (!t)
        return dir + ": error: no tensor " + p.name + " in " +
               (f.files.size() == 1 ? f.file_names[0] : "the shards") + ", which " + cls +
               " as the spec describes it has (for mt's " + e.mt_name + ")" + fix;
      if (t->shape != p.shape)
        return f.where(file) + ": error: tensor " + t->name + " is " + shape_str(t->shape) +
               " but the spec makes it " + spec_shape(p, t->shape) + fix;
      if (std::string err = f.read(file, *t, &buf); !err.empty())
        return err;
      const int64_t n = p.row_count();
      int64_t at = 0;
      for (const auto &[b, end] : p.rows)
        for (int64_t r = b; r < end; ++r, ++at)
          for (int64_t k = 0; k < cols; ++k)
            w.data[size_t(r * cols + k)] =
                buf[size_t(p.transpose ? k * n + at : at * cols + k)] - (e.one_plus ? 1.0f : 0.0f);
    }
    // Megatron's padding (tools/checkpoint's saver): the last row repeated.
    if (e.vocab)
      for (int64_t r = rows; r < vp; ++r)
        std::memcpy(&w.data[size_t(r * cols)], &w.data[size_t((rows - 1) * cols)],
                    size_t(cols) * 4);
  }
  // A tied model's file may hold the output layer too: the embedding's copy.
  if (!m.untie_embeddings_and_output_weights) {
    const SafetensorsReader::Entry *head = f.find("lm_head.weight", "", &file);
    if (head) {
      const WholeWeight &e = out->at("embedding.word_embeddings.weight");
      if (std::string err = f.read(file, *head, &buf); !err.empty())
        return err;
      if (head->shape != std::vector<int64_t>{rows, h} ||
          std::memcmp(buf.data(), e.data.data(), buf.size() * 4) != 0)
        return f.where(file) + ": error: tensor lm_head.weight differs from the embedding but "
                               "the spec ties them (model.untie_embeddings_and_output_weights = "
                               "false, from config.json's tie_word_embeddings); the weights and "
                               "config.json disagree: set tie_word_embeddings to false, import "
                               "the spec again and compile it";
    }
  }
  for (const auto &[name, where] : f.tensors)
    if (!f.used.count(name) && !is_buffer(name))
      return f.where(where.first) + ": error: tensor " + name + " " +
             shape_str(where.second->shape) + " is not part of " + cls +
             " as the spec describes it" +
             (name == "lm_head.weight"
                  ? " (an untied output layer: set model.untie_embeddings_and_output_weights = "
                    "true)"
                  : "") +
             fix;
  return "";
}

std::string compare_hf_models(const HfModelSpec &c, const HfModelSpec &m,
                              const std::string &config_path) {
  const size_t slash = config_path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : config_path.substr(0, slash);
  auto text = [](double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return std::string(buf);
  };
  struct Field {
    const char *key;
    std::string config, spec;
  };
  auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  auto i = [](int64_t v) { return std::to_string(v); };
  std::vector<Field> fields = {
      {"num_layers", i(c.num_layers), i(m.num_layers)},
      {"hidden_size", i(c.hidden_size), i(m.hidden_size)},
      {"ffn_hidden_size", i(c.ffn_hidden_size), i(m.ffn_hidden_size)},
      {"num_attention_heads", i(c.num_attention_heads), i(m.num_attention_heads)},
      {"num_query_groups", i(c.num_query_groups), i(m.num_query_groups)},
      {"kv_channels", i(c.kv_channels), i(m.kv_channels)},
      {"position_embedding_type", c.rope ? "\"rope\"" : "\"learned_absolute\"",
       m.rope ? "\"rope\"" : "\"learned_absolute\""},
      {"normalization", c.rmsnorm ? "\"RMSNorm\"" : "\"LayerNorm\"",
       m.rmsnorm ? "\"RMSNorm\"" : "\"LayerNorm\""},
      {"norm_epsilon", text(c.norm_epsilon), text(m.norm_epsilon)},
      {"swiglu", b(c.swiglu), b(m.swiglu)},
      {"untie_embeddings_and_output_weights", b(c.untie_embeddings_and_output_weights),
       b(m.untie_embeddings_and_output_weights)},
      {"add_bias_linear", b(c.add_bias_linear), b(m.add_bias_linear)},
  };
  if (c.num_experts > 0 || m.num_experts > 0) {
    fields.push_back({"num_experts", i(c.num_experts), i(m.num_experts)});
    fields.push_back({"moe_ffn_hidden_size", i(c.moe_ffn_hidden_size), i(m.moe_ffn_hidden_size)});
    fields.push_back({"moe_router_topk", i(c.moe_router_topk), i(m.moe_router_topk)});
  }
  if (c.rope) {
    fields.push_back({"rotary_base", i(c.rotary_base), i(m.rotary_base)});
    fields.push_back({"use_rope_scaling", b(c.use_rope_scaling), b(m.use_rope_scaling)});
    if (c.use_rope_scaling)
      fields.push_back(
          {"rope_scaling_factor", text(c.rope_scaling_factor), text(m.rope_scaling_factor)});
  } else {
    fields.push_back({"max_position_embeddings", i(c.max_position_embeddings),
                      i(m.max_position_embeddings)});
  }
  for (const Field &f : fields)
    if (f.config != f.spec)
      return config_path + ": error: describes model." + f.key + " = " + f.config +
             " but the plan's spec has " + f.spec +
             "; the spec is not this model's: write it with 'mtc import-hf " + dir +
             "' and compile that";
  return "";
}

std::string import_hf(const std::string &dir_in, const HfModelSpec &m,
                      const HfModelSpec *from_config, const mt::plan::Plan &plan,
                      const std::string &plan_path, const std::string &out_dir,
                      std::string *summary) {
  std::string dir = dir_in, out = out_dir;
  while (dir.size() > 1 && dir.back() == '/')
    dir.pop_back();
  while (out.size() > 1 && out.back() == '/')
    out.pop_back();
  if (out.empty())
    return "mt-checkpoint: error: -o names no directory; give the checkpoint directory to write";
  const bool existed = ckpt_detail::exists(out);
  if (existed && (!ckpt_detail::is_dir(out) || !ckpt_detail::list_dir(out).empty()))
    return out + ": error: exists and is not an empty directory; write to a new directory "
                 "(nothing was written)";
  std::string why;
  const std::string arch = hf_architecture(m, &why);
  if (arch.empty())
    return plan_path + ": error: the spec's " + why +
           "; no Hugging Face model loads into it (nothing was written)";
  if (from_config)
    if (std::string e = compare_hf_models(*from_config, m, dir + "/config.json"); !e.empty())
      return e + " (nothing was written)";
  std::map<std::string, WholeWeight> weights;
  int64_t rows = 0;
  if (std::string e = read_hf_weights(dir, m, arch, &weights, &rows); !e.empty())
    return e + " (nothing was written)";
  int64_t params = 0;
  for (const auto &[name, w] : weights)
    params += int64_t(w.data.size());
  size_t files = 0;
  const std::map<std::string, std::string> values = {{"imported_from", "huggingface " + dir},
                                                     {"optimizer_state", "initial"}};
  if (std::string e = save_initial_checkpoint(weights, plan, plan_path, "the folder " + dir,
                                              values, out, &files);
      !e.empty()) {
    if (!existed)
      ::rmdir(out.c_str()); // the save leaves its directory, empty, on a failure
    return e + " (nothing was written)";
  }
  const int tp = std::max(1, plan.tensor_parallel()), pp = std::max(1, plan.pipeline_parallel());
  *summary = "wrote " + out + ": " + hf_class_name(arch) +
             " from " + dir + ", " + std::to_string(weights.size()) + " tensors, " +
             std::to_string(params) + " parameters, vocabulary " + std::to_string(rows) +
             (rows == m.padded_vocab_size
                  ? ""
                  : " (padded to " + std::to_string(m.padded_vocab_size) + ")") +
             "; iteration 0 with a fresh optimizer state in the layout of " + plan_path +
             " (tensor " + std::to_string(tp) + " x pipeline " + std::to_string(pp) +
             (plan.expert_model_parallel() > 1
                  ? ", expert-parallel " + std::to_string(plan.expert_model_parallel())
                  : std::string()) +
             (plan.expert_tensor_parallel() > 1
                  ? ", expert-tensor-parallel " + std::to_string(plan.expert_tensor_parallel())
                  : std::string()) +
             ", " + std::to_string(files) + " rank file" + (files == 1 ? "" : "s") + ")";
  return "";
}

} // namespace mt::rt
