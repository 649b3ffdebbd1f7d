// Text steps of a Hugging Face tokenizer.json: patterns (Oniguruma's, run by
// PCRE2), the normalizers (Unicode forms by ICU) and the pre-tokenizers, as
// HF `tokenizers` 0.23 applies them (normalizers/*.rs, pre_tokenizers/*.rs,
// tokenizer/normalizer.rs split, tokenizer/pattern.rs).
#include "runtime/data/tokenizers/hf_internal.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <unicode/ubrk.h>
#include <unicode/utf8.h>
#include <unicode/uchar.h>
#include <unicode/utext.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <cstdlib>

namespace mt::rt::hf {

using namespace tok;

// ---------------------------------------------------------------------------
// Characters

uint32_t decode_utf8(const uint8_t *p, size_t n, size_t *len) {
  size_t l = utf8_sequence(p, n);
  if (l == 0) {
    *len = 1;
    return 0xFFFD;
  }
  *len = l;
  switch (l) {
  case 1:
    return p[0];
  case 2:
    return ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
  case 3:
    return ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
  default:
    return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) |
           (p[3] & 0x3Fu);
  }
}

namespace {

// HF's character classes differ from ICU 72's (Unicode 15.0) where Unicode
// changed since: Rust's char and regex know Unicode 16-17, HF's
// unicode_categories (punctuation) and unicode-normalization-alignments
// (normal forms, combining marks) know Unicode 8-9. The differences below
// were found by probing tokenizers 0.23.3 on every code point against ICU.
struct Range {
  uint32_t lo, hi;
};

template <size_t N> bool in(const Range (&r)[N], uint32_t cp) {
  for (const Range &x : r)
    if (cp >= x.lo && cp <= x.hi)
      return true;
  return false;
}

// Numbers (char::is_numeric) ICU 72 does not know: Unicode 16 digits.
const Range kNewNumbers[] = {{0x10D40, 0x10D49}, {0x116D0, 0x116E3}, {0x11BF0, 0x11BF9},
                             {0x11DE0, 0x11DE9}, {0x16130, 0x16139}, {0x16D70, 0x16D79},
                             {0x16FF4, 0x16FF6}, {0x1CCF0, 0x1CCF9}, {0x1E5F1, 0x1E5FA}};
// Word characters (regex's \w) ICU 72 does not know: Unicode 16 letters,
// marks and digits.
const Range kNewWord[] = {
    {0x897, 0x897},       {0x1C89, 0x1C8A},     {0xA7CB, 0xA7CD},     {0xA7DA, 0xA7DC},
    {0x105C0, 0x105F3},   {0x10D40, 0x10D65},   {0x10D69, 0x10D6D},   {0x10D6F, 0x10D85},
    {0x10EC2, 0x10EC4},   {0x10EFC, 0x10EFC},   {0x11380, 0x11389},   {0x1138B, 0x1138B},
    {0x1138E, 0x1138E},   {0x11390, 0x113B5},   {0x113B7, 0x113C0},   {0x113C2, 0x113C2},
    {0x113C5, 0x113C5},   {0x113C7, 0x113CA},   {0x113CC, 0x113D3},   {0x113E1, 0x113E2},
    {0x116D0, 0x116E3},   {0x11BC0, 0x11BE0},   {0x11BF0, 0x11BF9},   {0x11F5A, 0x11F5A},
    {0x13460, 0x143FA},   {0x16100, 0x16139},   {0x16D40, 0x16D6C},   {0x16D70, 0x16D79},
    {0x18CFF, 0x18CFF},   {0x1CCF0, 0x1CCF9},   {0x1E5D0, 0x1E5FA},   {0x2EBF0, 0x2EE5D}};
// Punctuation ICU has and HF's unicode_categories (Unicode 8) has not.
const Range kNotPunctuation[] = {
    {0x61D, 0x61D},       {0x9FD, 0x9FD},       {0xA76, 0xA76},       {0xC77, 0xC77},
    {0xC84, 0xC84},       {0x1B7D, 0x1B7E},     {0x2E43, 0x2E4F},     {0x2E52, 0x2E5D},
    {0x10EAD, 0x10EAD},   {0x10F55, 0x10F59},   {0x10F86, 0x10F89},   {0x1144B, 0x1144F},
    {0x1145A, 0x1145B},   {0x1145D, 0x1145D},   {0x11660, 0x1166C},   {0x116B9, 0x116B9},
    {0x1183B, 0x1183B},   {0x11944, 0x11946},   {0x119E2, 0x119E2},   {0x11A3F, 0x11A46},
    {0x11A9A, 0x11A9C},   {0x11A9E, 0x11AA2},   {0x11B00, 0x11B09},   {0x11C41, 0x11C45},
    {0x11C70, 0x11C71},   {0x11EF7, 0x11EF8},   {0x11F43, 0x11F4F},   {0x11FFF, 0x11FFF},
    {0x12FF1, 0x12FF2},   {0x16E97, 0x16E9A},   {0x16FE2, 0x16FE2},   {0x1E95E, 0x1E95F}};

// Assigned by Unicode 9.0, the version of HF's normalization tables: later
// characters are unassigned there (no decomposition, combining class 0).
bool known_to_hf_normalizer(uint32_t cp) {
  UVersionInfo v;
  u_charAge(static_cast<UChar32>(cp), v);
  return (v[0] != 0 || v[1] != 0) && (v[0] < 9 || (v[0] == 9 && v[1] == 0));
}

} // namespace

bool is_white_space(uint32_t cp) {
  if (cp < 0x80)
    return cp == ' ' || (cp >= '\t' && cp <= '\r');
  return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE);
}

namespace {

bool is_numeric(uint32_t cp) { // char::is_numeric: Nd, Nl, No
  if (cp < 0x80)
    return cp >= '0' && cp <= '9';
  int8_t t = u_charType(static_cast<UChar32>(cp));
  if (t == U_UNASSIGNED)
    return in(kNewNumbers, cp);
  return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

bool is_mark(uint32_t cp) {
  int8_t t = u_charType(static_cast<UChar32>(cp));
  return t == U_NON_SPACING_MARK || t == U_COMBINING_SPACING_MARK || t == U_ENCLOSING_MARK;
}

// pre_tokenizers/punctuation.rs: ASCII punctuation or Unicode's P*.
bool is_punctuation(uint32_t cp) {
  if (cp < 0x80)
    return (cp >= '!' && cp <= '/') || (cp >= ':' && cp <= '@') || (cp >= '[' && cp <= '`') ||
           (cp >= '{' && cp <= '~');
  if (cp == 0x166D || cp == 0x111C9) // punctuation in Unicode 8
    return true;
  return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_P_MASK) != 0 && !in(kNotPunctuation, cp);
}

// unicode_categories' is_other (Unicode 8.0): control, format and private
// use characters (not unassigned ones).
bool hf_is_other(uint32_t cp) {
  int8_t t = u_charType(static_cast<UChar32>(cp));
  if (t != U_CONTROL_CHAR && t != U_FORMAT_CHAR && t != U_PRIVATE_USE_CHAR)
    return false;
  UVersionInfo v;
  u_charAge(static_cast<UChar32>(cp), v);
  return v[0] < 8 || (v[0] == 8 && v[1] == 0);
}

// unicode_categories' is_mark_nonspacing (Unicode 8.0): U+1734 was Mn then;
// U+1885, U+1886, U+A9BD and U+111C9 were not.
bool hf_nonspacing_mark(uint32_t cp) {
  if (cp == 0x1734)
    return true;
  if (cp == 0x1885 || cp == 0x1886 || cp == 0xA9BD || cp == 0x111C9)
    return false;
  if (u_charType(static_cast<UChar32>(cp)) != U_NON_SPACING_MARK)
    return false;
  UVersionInfo v;
  u_charAge(static_cast<UChar32>(cp), v);
  return v[0] < 8 || (v[0] == 8 && v[1] == 0);
}

// unicode-normalization-alignments' is_combining_mark (Unicode 9.0): U+111C9
// was punctuation then, U+1CF2 and U+1CF3 marks.
bool hf_combining_mark(uint32_t cp) {
  if (cp == 0x1CF2 || cp == 0x1CF3)
    return true;
  return cp != 0x111C9 && is_mark(cp) && known_to_hf_normalizer(cp);
}

} // namespace

bool is_word_char(uint32_t cp) {
  if (cp < 0x80)
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
  UChar32 c = static_cast<UChar32>(cp);
  int8_t t = u_charType(c);
  if (t == U_UNASSIGNED)
    return in(kNewWord, cp);
  return u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || is_mark(cp) || t == U_DECIMAL_DIGIT_NUMBER ||
         t == U_CONNECTOR_PUNCTUATION || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL);
}

// ---------------------------------------------------------------------------
// Patterns

namespace {

// Oniguruma's \s, \S, \p{L}, \p{N}, \P{L}, \P{N} spelled out (text_common.h
// says why); everything else is the same in PCRE2's syntax for the patterns
// tokenizer.json files carry (possessive quantifiers, (?i:...), lookahead,
// \p{..} classes, {m,n}).
std::string translate(std::string_view p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size();) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char d = p[i + 1];
      const char *cls = nullptr;
      size_t len = 2;
      bool negated = false;
      if (d == 's' || d == 'S') {
        cls = kSpace;
        negated = d == 'S';
      } else if ((d == 'p' || d == 'P') && (p.substr(i + 2, 3) == "{L}" || p.substr(i + 2, 3) == "{N}")) {
        cls = p[i + 3] == 'L' ? kLetter : kNumber;
        negated = d == 'P';
        len = 5;
      }
      if (cls && !in_class) {
        out += negated ? "[^" : "[";
        out += cls;
        out += "]";
        i += len;
        continue;
      }
      if (cls && !negated) {
        out += cls;
        i += len;
        continue;
      }
      out.append(p.substr(i, 2));
      i += 2;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      ++i;
      if (i < p.size() && p[i] == '^')
        out += p[i++];
      if (i < p.size() && p[i] == ']')
        out += p[i++];
      continue;
    }
    if (c == ']' && in_class)
      in_class = false;
    out += c;
    ++i;
  }
  return out;
}

} // namespace

Regex::~Regex() { pcre2_code_free(code); }

bool Regex::compile(std::string_view onig, std::string *error) {
  std::string text = translate(onig);
  int err = 0;
  PCRE2_SIZE offset = 0;
  // Oniguruma's Ruby syntax: ^ and $ match at line boundaries.
  code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                       PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof buf);
    *error = reinterpret_cast<char *>(buf);
    return false;
  }
  // Without JIT (an unsupported CPU) the interpreter gives the same matches.
  jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return true;
}

bool Regex::compile_literal(std::string_view literal, std::string *error) {
  std::string text = "\\Q";
  for (size_t i = 0; i < literal.size(); ++i) {
    // \E inside \Q...\E ends it: split it as \E\\E\Q.
    if (literal.substr(i, 2) == "\\E") {
      text += "\\E\\\\E\\Q";
      ++i;
      continue;
    }
    text += literal[i];
  }
  text += "\\E";
  int err = 0;
  PCRE2_SIZE offset = 0;
  code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), PCRE2_UTF, &err,
                       &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof buf);
    *error = reinterpret_cast<char *>(buf);
    return false;
  }
  jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return true;
}

Matcher::Matcher() {
  data_ = pcre2_match_data_create(1, nullptr);
  context_ = pcre2_match_context_create(nullptr);
  stack_ = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  if (stack_)
    pcre2_jit_stack_assign(context_, nullptr, stack_);
}

Matcher::~Matcher() {
  pcre2_jit_stack_free(stack_);
  pcre2_match_context_free(context_);
  pcre2_match_data_free(data_);
}

void Matcher::find_all(const Regex &re, const uint8_t *s, size_t n,
                       std::vector<std::pair<uint32_t, uint32_t>> &out) {
  size_t start = 0;
  long long last_end = -1;
  while (start <= n) {
    int rc = re.jit ? pcre2_jit_match(re.code, s, n, start, 0, data_, context_)
                    : pcre2_match(re.code, s, n, start, PCRE2_NO_UTF_CHECK, data_, context_);
    if (rc < 0)
      break; // no match (or out of resources: the rest is unmatched text)
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(data_);
    size_t ms = ov[0], me = ov[1];
    if (ms == me && static_cast<long long>(me) == last_end) {
      // onig's find_iter: no empty match right after the previous match.
      if (me >= n)
        break;
      start = me + std::max<size_t>(1, utf8_sequence(s + me, n - me));
      continue;
    }
    out.emplace_back(static_cast<uint32_t>(ms), static_cast<uint32_t>(me));
    last_end = static_cast<long long>(me);
    if (me == ms) {
      if (me >= n)
        break;
      start = me; // the next search finds this empty match again and steps on
    } else {
      start = me;
    }
  }
}

// ---------------------------------------------------------------------------
// Normalizers

namespace {

// One run of text through ICU's normal form.
void icu_form(const UNormalizer2 *norm, std::string_view in8, std::string &out8,
              std::u16string &in, std::u16string &out) {
  UErrorCode st = U_ZERO_ERROR;
  int32_t len = 0;
  in.resize(in8.size() + 1);
  u_strFromUTF8(in.data(), static_cast<int32_t>(in.size()), &len, in8.data(),
                static_cast<int32_t>(in8.size()), &st);
  out.resize(len * 4 + 16);
  st = U_ZERO_ERROR;
  int32_t got = unorm2_normalize(norm, in.data(), len, out.data(), static_cast<int32_t>(out.size()), &st);
  if (st == U_BUFFER_OVERFLOW_ERROR) {
    out.resize(got);
    st = U_ZERO_ERROR;
    got = unorm2_normalize(norm, in.data(), len, out.data(), static_cast<int32_t>(out.size()), &st);
  }
  size_t at = out8.size();
  out8.resize(at + got * 3 + 4);
  st = U_ZERO_ERROR;
  u_strToUTF8(out8.data() + at, static_cast<int32_t>(out8.size() - at), &len, out.data(), got, &st);
  out8.resize(at + len);
}

// HF's NFC/NFD/NFKC/NFKD know Unicode 9.0: a later character stays as it
// is and, a starter there, bounds what is around it. So the runs between
// such characters go through ICU, and they are copied.
void unicode_form(NormStep::Kind kind, std::string &text, std::string &tmp) {
  // ASCII is unchanged by every form.
  bool ascii = true;
  for (unsigned char c : text)
    if (c >= 0x80) {
      ascii = false;
      break;
    }
  if (ascii)
    return;
  UErrorCode st = U_ZERO_ERROR;
  const UNormalizer2 *norm = kind == NormStep::NFC    ? unorm2_getNFCInstance(&st)
                             : kind == NormStep::NFD  ? unorm2_getNFDInstance(&st)
                             : kind == NormStep::NFKC ? unorm2_getNFKCInstance(&st)
                                                      : unorm2_getNFKDInstance(&st);
  thread_local std::u16string in, out;
  tmp.clear();
  const uint8_t *p = reinterpret_cast<const uint8_t *>(text.data());
  size_t run = 0;
  for (size_t i = 0; i < text.size();) {
    size_t len;
    uint32_t cp = decode_utf8(p + i, text.size() - i, &len);
    if (cp >= 0x80 && !known_to_hf_normalizer(cp)) {
      icu_form(norm, std::string_view(text).substr(run, i - run), tmp, in, out);
      tmp.append(text, i, len);
      run = i + len;
    }
    i += len;
  }
  icu_form(norm, std::string_view(text).substr(run), tmp, in, out);
  text.swap(tmp);
}

// SentencePiece's precompiled_charsmap (spm_precompiled's reading of it):
// the replacement of the shortest key that prefixes `chunk`, or null.
// A unit of the double array: bit 8 says a value follows, its low 31 bits
// are a value, its low byte (and bit 31) a label, the rest an offset.
const char *charsmap_lookup(const NormStep &st, const char *chunk, size_t n, size_t *out_len) {
  const std::vector<uint32_t> &a = st.trie;
  if (a.empty())
    return nullptr;
  auto offset = [](uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); };
  size_t pos = offset(a[0]);
  for (size_t i = 0; i < n; ++i) {
    uint8_t c = static_cast<uint8_t>(chunk[i]);
    if (c == 0)
      break;
    pos ^= c;
    if (pos >= a.size())
      return nullptr;
    uint32_t unit = a[pos];
    if ((unit & ((1u << 31) | 0xFFu)) != c)
      return nullptr;
    pos ^= offset(unit);
    if (pos >= a.size())
      return nullptr;
    if ((unit >> 8) & 1) {
      size_t at = a[pos] & ((1u << 31) - 1);
      if (at > st.replacements.size())
        return nullptr;
      size_t end = st.replacements.find('\0', at);
      *out_len = (end == std::string::npos ? st.replacements.size() : end) - at;
      return st.replacements.data() + at;
    }
  }
  return nullptr;
}

// precompiled.rs: per extended grapheme cluster (ICU's), the replacement
// of the whole cluster when it is under 6 bytes and has one, else of each
// character.
bool precompiled(const NormStep &st, std::string &text, std::string &tmp) {
  struct Breaks {
    UBreakIterator *bi = nullptr;
    UText *ut = nullptr;
    ~Breaks() {
      ubrk_close(bi);
      utext_close(ut);
    }
  };
  thread_local Breaks b;
  UErrorCode err = U_ZERO_ERROR;
  if (!b.bi)
    b.bi = ubrk_open(UBRK_CHARACTER, "", nullptr, 0, &err);
  err = U_ZERO_ERROR;
  b.ut = utext_openUTF8(b.ut, text.data(), static_cast<int64_t>(text.size()), &err);
  ubrk_setUText(b.bi, b.ut, &err);
  tmp.clear();
  bool start_kept = true;
  int32_t start = ubrk_first(b.bi);
  for (int32_t end = ubrk_next(b.bi); end != UBRK_DONE; start = end, end = ubrk_next(b.bi)) {
    // Marks of the BMP that Unicode 16-17 assigned extend a cluster for HF
    // (unicode-segmentation), which ICU 72 does not know (probed from the
    // library; later supplementary ones cannot change a result, as a
    // cluster holding one is never under 6 bytes with a mapped base).
    while (static_cast<size_t>(end) < text.size()) {
      // (never after a control character, CR or LF: a cluster ends there)
      UChar32 last = U_SENTINEL;
      int32_t at = end;
      U8_PREV(reinterpret_cast<const uint8_t *>(text.data()), start, at, last);
      int gcb = u_getIntPropertyValue(last, UCHAR_GRAPHEME_CLUSTER_BREAK);
      if (gcb == U_GCB_CONTROL || gcb == U_GCB_CR || gcb == U_GCB_LF)
        break;
      size_t len;
      uint32_t cp = decode_utf8(reinterpret_cast<const uint8_t *>(text.data()) + end,
                                text.size() - end, &len);
      if (!(cp == 0x897 || (cp >= 0x1ACF && cp <= 0x1ADD) || (cp >= 0x1AE0 && cp <= 0x1AEB)))
        break;
      int32_t next = ubrk_next(b.bi);
      if (next == UBRK_DONE)
        break;
      end = next;
    }
    const char *g = text.data() + start;
    size_t glen = static_cast<size_t>(end - start), rlen = 0;
    const char *r = glen < 6 ? charsmap_lookup(st, g, glen, &rlen) : nullptr;
    if (r) {
      tmp.append(r, rlen);
    } else {
      for (size_t i = 0; i < glen;) {
        size_t len = std::max<size_t>(1, utf8_sequence(reinterpret_cast<const uint8_t *>(g + i), glen - i));
        if ((r = charsmap_lookup(st, g + i, len, &rlen)))
          tmp.append(r, rlen);
        else
          tmp.append(g + i, len);
        i += len;
      }
    }
    if (start == 0 && tmp.empty())
      start_kept = false;
  }
  text.swap(tmp);
  return start_kept;
}

// char::to_lowercase (Unicode 17 in the Rust HF is built with): ICU 72's
// simple lowercase mapping, U+0130's two characters, and the case pairs
// Unicode 16 and 17 added.
void append_lowercase(std::string &out, uint32_t cp) {
  if (cp == 0x130) {
    out += "i\xCC\x87";
    return;
  }
  if (cp >= 0x10D50 && cp <= 0x10D65)
    cp += 0x20;
  else if (cp >= 0x16EA0 && cp <= 0x16EB8)
    cp += 0x1B;
  else if (cp == 0x1C89)
    cp = 0x1C8A;
  else if (cp == 0xA7CB)
    cp = 0x264;
  else if (cp == 0xA7CC || cp == 0xA7CE || cp == 0xA7D2 || cp == 0xA7D4 || cp == 0xA7DA)
    cp += 1;
  else if (cp == 0xA7DC)
    cp = 0x19B;
  else
    cp = static_cast<uint32_t>(u_tolower(static_cast<UChar32>(cp)));
  append_utf8(out, cp);
}

} // namespace

bool normalize(const std::vector<NormStep> &steps, Matcher &m, std::string &text,
               std::string &tmp) {
  std::vector<std::pair<uint32_t, uint32_t>> matches;
  bool start_kept = true;
  for (const NormStep &st : steps) {
    switch (st.kind) {
    case NormStep::NFC:
    case NormStep::NFD:
    case NormStep::NFKC:
    case NormStep::NFKD:
      unicode_form(st.kind, text, tmp);
      break;
    case NormStep::Lowercase: {
      tmp.clear();
      const uint8_t *p = reinterpret_cast<const uint8_t *>(text.data());
      for (size_t i = 0; i < text.size();) {
        size_t len;
        uint32_t cp = decode_utf8(p + i, text.size() - i, &len);
        if (cp < 0x80)
          tmp += static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
        else
          append_lowercase(tmp, cp);
        i += len;
      }
      text.swap(tmp);
      break;
    }
    case NormStep::Strip: {
      const uint8_t *p = reinterpret_cast<const uint8_t *>(text.data());
      size_t b = 0, e = text.size();
      if (st.left)
        while (b < e) {
          size_t len;
          uint32_t cp = decode_utf8(p + b, e - b, &len);
          if (!is_white_space(cp))
            break;
          b += len;
        }
      if (st.right)
        while (e > b) {
          size_t s = e - 1;
          while (s > b && (p[s] & 0xC0) == 0x80)
            --s;
          size_t len;
          uint32_t cp = decode_utf8(p + s, e - s, &len);
          if (!is_white_space(cp))
            break;
          e = s;
        }
      if (b > 0 && !text.empty())
        start_kept = false;
      text = text.substr(b, e - b);
      break;
    }
    case NormStep::StripAccents: {
      tmp.clear();
      const uint8_t *p = reinterpret_cast<const uint8_t *>(text.data());
      for (size_t i = 0; i < text.size();) {
        size_t len;
        uint32_t cp = decode_utf8(p + i, text.size() - i, &len);
        if (cp < 0x80 || !hf_combining_mark(cp))
          tmp.append(text, i, len);
        else if (tmp.empty())
          start_kept = false;
        i += len;
      }
      text.swap(tmp);
      break;
    }
    case NormStep::Precompiled:
      if (!precompiled(st, text, tmp))
        start_kept = false;
      break;
    case NormStep::Nmt: {
      // normalizers/unicode.rs do_nmt: ASCII and C1 control characters out,
      // other white-space-like characters to ' '.
      tmp.clear();
      const uint8_t *p = reinterpret_cast<const uint8_t *>(text.data());
      for (size_t i = 0; i < text.size();) {
        size_t len;
        uint32_t cp = decode_utf8(p + i, text.size() - i, &len);
        bool drop = (cp >= 0x1 && cp <= 0x8) || cp == 0xB || (cp >= 0xE && cp <= 0x1F) ||
                    cp == 0x7F || cp == 0x8F || cp == 0x9F;
        bool space = cp == 0x9 || cp == 0xA || cp == 0xC || cp == 0xD || cp == 0x1680 ||
                     (cp >= 0x200B && cp <= 0x200F) || cp == 0x2028 || cp == 0x2029 ||
                     cp == 0x2581 || cp == 0xFEFF || cp == 0xFFFD;
        if (drop) {
          if (i == 0)
            start_kept = false;
        } else if (space) {
          tmp += ' ';
        } else {
          tmp.append(text, i, len);
        }
        i += len;
      }
      text.swap(tmp);
      break;
    }
    case NormStep::Bert: {
      // normalizers/bert.rs: control characters out and white space to ' ',
      // spaces around CJK ideographs, NFD without nonspacing marks (when
      // strip_accents, which defaults to lowercase), lowercase.
      const uint8_t *p = reinterpret_cast<const uint8_t *>(text.data());
      if (st.clean_text || st.chinese_chars) {
        tmp.clear();
        for (size_t i = 0; i < text.size();) {
          size_t len;
          uint32_t cp = decode_utf8(p + i, text.size() - i, &len);
          bool cjk = (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
                     (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
                     (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
                     (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
          if (st.clean_text && (cp == 0 || cp == 0xFFFD ||
                                (cp != '\t' && cp != '\n' && cp != '\r' && hf_is_other(cp)))) {
            if (i == 0)
              start_kept = false;
          } else if (st.clean_text && is_white_space(cp)) {
            tmp += ' ';
          } else if (st.chinese_chars && cjk) {
            tmp += ' ';
            tmp.append(text, i, len);
            tmp += ' ';
          } else {
            tmp.append(text, i, len);
          }
          i += len;
        }
        text.swap(tmp);
      }
      if (st.bert_strip_accents) {
        unicode_form(NormStep::NFD, text, tmp);
        tmp.clear();
        p = reinterpret_cast<const uint8_t *>(text.data());
        for (size_t i = 0; i < text.size();) {
          size_t len;
          uint32_t cp = decode_utf8(p + i, text.size() - i, &len);
          if (cp < 0x80 || !hf_nonspacing_mark(cp))
            tmp.append(text, i, len);
          else if (tmp.empty())
            start_kept = false;
          i += len;
        }
        text.swap(tmp);
      }
      if (st.lowercase) {
        tmp.clear();
        p = reinterpret_cast<const uint8_t *>(text.data());
        for (size_t i = 0; i < text.size();) {
          size_t len;
          uint32_t cp = decode_utf8(p + i, text.size() - i, &len);
          if (cp < 0x80)
            tmp += static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
          else
            append_lowercase(tmp, cp);
          i += len;
        }
        text.swap(tmp);
      }
      break;
    }
    case NormStep::Prepend:
      if (!text.empty())
        text.insert(0, st.text);
      break;
    case NormStep::Replace: {
      matches.clear();
      m.find_all(*st.regex, reinterpret_cast<const uint8_t *>(text.data()), text.size(), matches);
      if (matches.empty())
        break;
      tmp.clear();
      size_t at = 0;
      if (matches[0].first == 0 && matches[0].second > 0 && st.text.empty())
        start_kept = false;
      for (auto [b, e] : matches) {
        tmp.append(text, at, b - at);
        tmp += st.text;
        at = e;
      }
      tmp.append(text, at, std::string::npos);
      text.swap(tmp);
      break;
    }
    }
  }
  return start_kept;
}

// ---------------------------------------------------------------------------
// Pre-tokenizers

namespace {

using Segment = PreScratch::Segment;

// Segments of a piece by a character predicate (pattern.rs's Fn(char)).
template <typename F>
void segments_by_char(const uint8_t *p, size_t n, F &&pred, std::vector<Segment> &out) {
  size_t last = 0;
  for (size_t i = 0; i < n;) {
    size_t len;
    uint32_t cp = decode_utf8(p + i, n - i, &len);
    if (pred(cp)) {
      if (last < i)
        out.push_back({static_cast<uint32_t>(last), static_cast<uint32_t>(i), false});
      out.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(i + len), true});
      last = i + len;
    }
    i += len;
  }
  if (last < n)
    out.push_back({static_cast<uint32_t>(last), static_cast<uint32_t>(n), false});
}

void segments_by_regex(Matcher &m, const Regex &re, const uint8_t *p, size_t n,
                       PreScratch &s) {
  s.matches.clear();
  m.find_all(re, p, n, s.matches);
  size_t prev = 0;
  for (auto [b, e] : s.matches) {
    if (prev != b)
      s.segments.push_back({static_cast<uint32_t>(prev), b, false});
    s.segments.push_back({b, e, true});
    prev = e;
  }
  if (prev != n)
    s.segments.push_back({static_cast<uint32_t>(prev), static_cast<uint32_t>(n), false});
}

// normalizer.rs split: the segments (start, end, is_match) become pieces as
// the behaviour says; empty ones are dropped (pre_tokenizer.rs split).
void emit(const Piece &in, std::vector<Segment> &seg, Behavior b, bool invert,
          std::vector<Piece> &out) {
  if (invert)
    for (Segment &x : seg)
      x.match = !x.match;
  auto put = [&](uint32_t start, uint32_t end) {
    if (end > start)
      out.push_back({in.off + start, end - start, in.first && start == 0});
  };
  switch (b) {
  case Behavior::Isolated:
    for (const Segment &x : seg)
      put(x.start, x.end);
    break;
  case Behavior::Removed:
    for (const Segment &x : seg)
      if (!x.match)
        put(x.start, x.end);
    break;
  case Behavior::Contiguous:
  case Behavior::MergedWithPrevious: {
    bool prev_match = false;
    std::vector<std::pair<uint32_t, uint32_t>> acc;
    for (const Segment &x : seg) {
      bool merge = b == Behavior::Contiguous ? x.match == prev_match : x.match && !prev_match;
      if (merge && !acc.empty())
        acc.back().second = x.end;
      else
        acc.push_back({x.start, x.end});
      prev_match = x.match;
    }
    for (auto [s, e] : acc)
      put(s, e);
    break;
  }
  case Behavior::MergedWithNext: {
    bool prev_match = false;
    std::vector<std::pair<uint32_t, uint32_t>> acc; // built from the end
    for (size_t i = seg.size(); i-- > 0;) {
      const Segment &x = seg[i];
      if (x.match && !prev_match && !acc.empty())
        acc.back().first = x.start;
      else
        acc.push_back({x.start, x.end});
      prev_match = x.match;
    }
    for (size_t i = acc.size(); i-- > 0;)
      put(acc[i].first, acc[i].second);
    break;
  }
  }
}

} // namespace

void pre_tokenize(const std::vector<PreStep> &steps, Matcher &m, std::string &arena,
                  std::vector<Piece> &pieces, PreScratch &s) {
  for (const PreStep &st : steps) {
    s.next.clear();
    for (Piece pc : pieces) {
      s.segments.clear();
      switch (st.kind) {
      case PreStep::ByteLevel: {
        // byte_level.rs: a space before a piece that has none, then GPT-2's
        // split, then the byte alphabet (by the model's tables when this is
        // the last step).
        size_t first_out = s.next.size();
        if (st.add_prefix_space && arena[pc.off] != ' ') {
          uint32_t off = static_cast<uint32_t>(arena.size());
          arena.reserve(arena.size() + pc.len + 1);
          arena += ' ';
          arena.append(arena.data() + pc.off, pc.len);
          pc = {off, pc.len + 1, pc.first};
        }
        if (!st.regex) {
          s.next.push_back(pc);
        } else {
          segments_by_regex(m, *st.regex, reinterpret_cast<const uint8_t *>(arena.data()) + pc.off,
                            pc.len, s);
          emit(pc, s.segments, Behavior::Isolated, false, s.next);
        }
        if (st.map_bytes) {
          const ByteAlphabet &abc = alphabet();
          for (size_t k = first_out; k < s.next.size(); ++k) {
            Piece &q = s.next[k];
            uint32_t off = static_cast<uint32_t>(arena.size());
            for (uint32_t b = 0; b < q.len; ++b)
              append_utf8(arena, abc.byte_to_cp[static_cast<uint8_t>(arena[q.off + b])]);
            q = {off, static_cast<uint32_t>(arena.size() - off), q.first};
          }
        }
        continue;
      }
      case PreStep::Metaspace: {
        // metaspace.rs: spaces become the replacement; it is prepended
        // (always, or to the text's first piece) unless already there.
        uint32_t off = static_cast<uint32_t>(arena.size());
        std::string_view text(arena.data() + pc.off, pc.len);
        bool starts = text.substr(0, st.replacement.size()) == st.replacement ||
                      (!text.empty() && text[0] == ' ');
        if (!starts && (st.prepend == PreStep::Always || (st.prepend == PreStep::First && pc.first)))
          arena += st.replacement;
        for (size_t i = 0; i < pc.len; ++i) {
          char c = arena[pc.off + i];
          if (c == ' ')
            arena += st.replacement;
          else
            arena += c;
        }
        pc = {off, static_cast<uint32_t>(arena.size() - off), pc.first};
        if (!st.split) {
          s.next.push_back(pc);
          continue;
        }
        uint32_t rep = st.replacement_cp;
        segments_by_char(reinterpret_cast<const uint8_t *>(arena.data()) + pc.off, pc.len,
                         [rep](uint32_t cp) { return cp == rep; }, s.segments);
        emit(pc, s.segments, Behavior::MergedWithNext, false, s.next);
        continue;
      }
      case PreStep::Split:
        segments_by_regex(m, *st.regex, reinterpret_cast<const uint8_t *>(arena.data()) + pc.off,
                          pc.len, s);
        emit(pc, s.segments, st.behavior, st.invert, s.next);
        continue;
      case PreStep::Digits:
        segments_by_char(reinterpret_cast<const uint8_t *>(arena.data()) + pc.off, pc.len,
                         is_numeric, s.segments);
        emit(pc, s.segments, st.individual_digits ? Behavior::Isolated : Behavior::Contiguous,
             false, s.next);
        continue;
      case PreStep::Bert: {
        // pre_tokenizers/bert.rs: split on white space (removed), then on
        // punctuation (isolated).
        s.segments.clear();
        segments_by_char(reinterpret_cast<const uint8_t *>(arena.data()) + pc.off, pc.len,
                         is_white_space, s.segments);
        size_t from = s.next.size();
        emit(pc, s.segments, Behavior::Removed, false, s.next);
        std::vector<Piece> words(s.next.begin() + from, s.next.end());
        s.next.resize(from);
        for (const Piece &w : words) {
          s.segments.clear();
          segments_by_char(reinterpret_cast<const uint8_t *>(arena.data()) + w.off, w.len,
                           is_punctuation, s.segments);
          emit(w, s.segments, Behavior::Isolated, false, s.next);
        }
        continue;
      }
      case PreStep::WhitespaceSplit:
        segments_by_char(reinterpret_cast<const uint8_t *>(arena.data()) + pc.off, pc.len,
                         is_white_space, s.segments);
        emit(pc, s.segments, Behavior::Removed, false, s.next);
        continue;
      case PreStep::Punctuation:
        segments_by_char(reinterpret_cast<const uint8_t *>(arena.data()) + pc.off, pc.len,
                         is_punctuation, s.segments);
        emit(pc, s.segments, st.behavior, false, s.next);
        continue;
      case PreStep::CharDelimiterSplit: {
        uint32_t d = st.replacement_cp;
        segments_by_char(reinterpret_cast<const uint8_t *>(arena.data()) + pc.off, pc.len,
                         [d](uint32_t cp) { return cp == d; }, s.segments);
        emit(pc, s.segments, Behavior::Removed, false, s.next);
        continue;
      }
      case PreStep::Whitespace: {
        // whitespace.rs: the matches of \w+|[^\w\s]+ are kept, the rest
        // (white space) removed; by character class, as regex's \w and \s.
        const uint8_t *p = reinterpret_cast<const uint8_t *>(arena.data()) + pc.off;
        size_t i = 0, n = pc.len;
        while (i < n) {
          size_t len;
          uint32_t cp = decode_utf8(p + i, n - i, &len);
          int cls = is_word_char(cp) ? 1 : is_white_space(cp) ? 0 : 2;
          size_t j = i + len;
          while (j < n) {
            size_t l2;
            uint32_t c2 = decode_utf8(p + j, n - j, &l2);
            int k = is_word_char(c2) ? 1 : is_white_space(c2) ? 0 : 2;
            if (k != cls)
              break;
            j += l2;
          }
          if (cls != 0)
            s.next.push_back({pc.off + static_cast<uint32_t>(i), static_cast<uint32_t>(j - i),
                              pc.first && i == 0});
          i = j;
        }
        continue;
      }
      }
    }
    pieces.swap(s.next);
  }
}

} // namespace mt::rt::hf
