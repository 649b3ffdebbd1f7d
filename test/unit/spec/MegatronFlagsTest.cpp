// Tests of the Megatron flag table (spec/MegatronFlags.h) against the flags
// Megatron-LM itself declares (test/spec/Inputs/megatron-core-0.16.1-flags.txt,
// written by tools/megatron_flags.py), and of import-megatron's use of it.
#include "spec/MegatronFlags.h"
#include "spec/MegatronImport.h"
#include "spec/SpecKeys.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

namespace mt::spec {
namespace {

struct Listed {
  std::string arity;
  std::string source;
};

// FLAG ARITY [post-training] per line; # comments.
std::map<std::string, Listed> megatronListing() {
  std::ifstream in(std::string(MT_SOURCE_DIR) + "/test/spec/Inputs/megatron-core-0.16.1-flags.txt");
  EXPECT_TRUE(in) << "cannot read the flag listing under " << MT_SOURCE_DIR;
  std::map<std::string, Listed> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#')
      continue;
    std::istringstream ws(line);
    std::string flag;
    Listed l;
    ws >> flag >> l.arity >> l.source;
    EXPECT_TRUE(out.emplace(flag, l).second) << flag << " is listed twice";
  }
  return out;
}

std::string describe(const MegatronFlag &f) {
  return std::string(flagStatusName(f.status)) + " (" + f.text + ")";
}

TEST(MegatronFlagTable, EveryMegatronFlagHasExactlyOneStatus) {
  std::map<std::string, Listed> listed = megatronListing();
  ASSERT_GT(listed.size(), 600u);
  std::map<std::string, std::vector<const MegatronFlag *>> rows;
  for (const MegatronFlag &f : megatronFlags())
    rows[f.flag].push_back(&f);
  for (const auto &[flag, l] : listed) {
    auto it = rows.find(flag);
    if (it == rows.end()) {
      ADD_FAILURE() << flag << " (" << l.arity
                    << ") is a Megatron flag without a status in spec/MegatronFlags.cpp";
      continue;
    }
    if (it->second.size() != 1) {
      std::string all;
      for (const MegatronFlag *f : it->second)
        all += "\n  " + describe(*f) + (f->fromKeyTable ? " from the key table" : "");
      ADD_FAILURE() << flag << " has " << it->second.size()
                    << " statuses; keep one (a flag a spec key implements loses its "
                       "row in spec/MegatronFlags.cpp):"
                    << all;
    }
    // The import reads a flag's value by its arity; it must be Megatron's.
    // (nargs '?' would be `optional`; Megatron has none of those.)
    EXPECT_EQ(flagArityName(it->second.front()->arity), l.arity) << flag;
    EXPECT_EQ(it->second.front()->source, l.source) << flag;
  }
}

TEST(MegatronFlagTable, NamesNoFlagMegatronLacks) {
  std::map<std::string, Listed> listed = megatronListing();
  for (const MegatronFlag &f : megatronFlags())
    EXPECT_TRUE(listed.count(f.flag))
        << f.flag << " (" << describe(f)
        << (f.fromKeyTable ? ", the megatronFlag of a spec key" : "")
        << ") is not a flag of Megatron-LM " << kMegatronRelease;
}

TEST(MegatronFlagTable, EveryRowSaysWhy) {
  for (const MegatronFlag &f : megatronFlags()) {
    EXPECT_FALSE(f.text.empty()) << f.flag;
    if (f.status == FlagStatus::Mtrun) {
      EXPECT_EQ(f.text.rfind("--", 0), 0u) << f.flag << ": an mtrun flag";
    }
    if (!f.onlyValue.empty()) {
      EXPECT_EQ(f.status, FlagStatus::Refused) << f.flag;
      EXPECT_FALSE(f.onlyWhy.empty()) << f.flag;
    }
  }
}

TEST(MegatronFlagTable, AcceptsTheOneValueNumerically) {
  const MegatronFlag *cp = findMegatronFlag("--context-parallel-size");
  ASSERT_NE(cp, nullptr);
  EXPECT_TRUE(acceptsOnlyValue(*cp, "1"));
  EXPECT_TRUE(acceptsOnlyValue(*cp, "1.0"));
  EXPECT_FALSE(acceptsOnlyValue(*cp, "2"));
  const MegatronFlag *loader = findMegatronFlag("--dataloader-type");
  ASSERT_NE(loader, nullptr);
  EXPECT_TRUE(acceptsOnlyValue(*loader, "single"));
  EXPECT_FALSE(acceptsOnlyValue(*loader, "cyclic"));
  // --optimizer is the key training.optimizer now (adam or sgd).
  const MegatronFlag *opt = findMegatronFlag("--optimizer");
  ASSERT_NE(opt, nullptr);
  EXPECT_EQ(opt->status, FlagStatus::Implemented);
  const MegatronFlag *tp = findMegatronFlag("--tensor-model-parallel-size");
  ASSERT_NE(tp, nullptr);
  EXPECT_EQ(tp->status, FlagStatus::Implemented);
  EXPECT_FALSE(acceptsOnlyValue(*tp, "1"));
  EXPECT_EQ(findMegatronFlag("--frobnicate"), nullptr);
}

const char kBase[] = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 "
                     "--seq-length 128 --vocab-size 1000 --micro-batch-size 2 "
                     "--train-iters 10 --lr 1e-3";

std::vector<std::string> words(const std::string &s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;)
    out.push_back(w);
  return out;
}

// "Implemented" rows without a spec key promise a translation rule; each one
// must reach it (the import reports an internal error where none takes it).
TEST(MegatronFlagTable, ImplementedRowsReachTheirTranslation) {
  for (const MegatronFlag &f : megatronFlags()) {
    if (f.status != FlagStatus::Implemented)
      continue;
    std::vector<std::string> args = words(kBase);
    args.push_back(f.flag);
    if (f.arity != FlagArity::Switch)
      args.push_back("4");
    absl::StatusOr<MegatronImportResult> r = importMegatronArgs(args);
    if (!r.ok()) {
      EXPECT_EQ(std::string(r.status().message()).find("internal error"), std::string::npos)
          << f.flag << ": " << r.status();
    }
  }
}

// --calculate-per-token-loss is implemented as equal to Megatron's default
// because every label counts: no flag that masks the loss may be accepted
// until per-token loss takes the masked token counts (docs/training.md).
TEST(MegatronFlagTable, PerTokenLossAssumesNoLossMask) {
  const MegatronFlag *perToken = findMegatronFlag("--calculate-per-token-loss");
  ASSERT_TRUE(perToken);
  ASSERT_EQ(perToken->status, FlagStatus::Implemented);
  const MegatronFlag *mask = findMegatronFlag("--eod-mask-loss");
  ASSERT_TRUE(mask);
  EXPECT_EQ(mask->status, FlagStatus::Refused)
      << "--eod-mask-loss masks tokens out of the loss: per-token loss (passes/Autodiff.cpp's "
      << "seed) must then count the unmasked tokens of each micro-batch";
}

// Each other status does what the table says, through the import.
TEST(MegatronFlagTable, ImportFollowsEveryRow) {
  for (const MegatronFlag &f : megatronFlags()) {
    if (f.status == FlagStatus::Implemented)
      continue;
    std::vector<std::string> args = words(kBase);
    args.push_back(f.flag);
    if (f.arity != FlagArity::Switch)
      args.push_back("7");
    absl::StatusOr<MegatronImportResult> r = importMegatronArgs(args);
    switch (f.status) {
    case FlagStatus::Refused:
      ASSERT_FALSE(r.ok()) << f.flag << " is refused but imports";
      EXPECT_EQ(std::string(r.status().message()).rfind(f.flag, 0), 0u)
          << f.flag << ": " << r.status();
      break;
    case FlagStatus::NotApplicable:
      ASSERT_TRUE(r.ok()) << f.flag << ": " << r.status();
      ASSERT_EQ(r->ignoredFlags.size(), 1u) << f.flag;
      EXPECT_EQ(r->ignoredFlags[0].flag.rfind(f.flag, 0), 0u) << f.flag;
      EXPECT_EQ(r->ignoredFlags[0].reason, f.text) << f.flag;
      break;
    case FlagStatus::Mtrun:
      ASSERT_TRUE(r.ok()) << f.flag << ": " << r.status();
      ASSERT_FALSE(r->mtrunArgs.empty()) << f.flag;
      EXPECT_EQ(r->mtrunArgs[0], f.text) << f.flag;
      EXPECT_NE(r->toml.find(mtrunCommandLine(r->mtrunArgs)), std::string::npos)
          << f.flag << "\n"
          << r->toml;
      break;
    case FlagStatus::Implemented:
      break;
    }
  }
}

TEST(MegatronFlagTable, OnlyValueIsAcceptedAndOthersRefused) {
  for (const MegatronFlag &f : megatronFlags()) {
    if (f.onlyValue.empty())
      continue;
    std::vector<std::string> args = words(kBase);
    args.push_back(f.flag);
    args.push_back(f.onlyValue);
    absl::StatusOr<MegatronImportResult> r = importMegatronArgs(args);
    ASSERT_TRUE(r.ok()) << f.flag << " " << f.onlyValue << ": " << r.status();
    ASSERT_EQ(r->ignoredFlags.size(), 1u) << f.flag;
    EXPECT_EQ(r->ignoredFlags[0].reason, f.onlyWhy) << f.flag;
  }
}

TEST(MegatronFlagTable, MarkdownHasOneRowPerFlag) {
  std::string md = renderMegatronFlagsMarkdown();
  size_t rows = 0;
  for (size_t p = md.find("\n| `--"); p != std::string::npos; p = md.find("\n| `--", p + 1))
    ++rows;
  EXPECT_EQ(rows, megatronFlags().size());
}

} // namespace
} // namespace mt::spec
