// Text steps of a Hugging Face tokenizer.json: patterns (Oniguruma's, run by
// PCRE2), the normalizers (Unicode forms by ICU) and the pre-tokenizers, as
// HF `tokenizers` 0.23 applies them (normalizers/*.rs, pre_tokenizers/*.rs,
// tokenizer/normalizer.rs split, tokenizer/pattern.rs).
#include "runtime/data/tokenizers/hf_internal.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

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
  return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_P_MASK) != 0;
}

} // namespace

bool is_word_char(uint32_t cp) {
  if (cp < 0x80)
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
  UChar32 c = static_cast<UChar32>(cp);
  int8_t t = u_charType(c);
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
  std::u16string in(text.size() + 1, u'\0'), out;
  int32_t len = 0;
  st = U_ZERO_ERROR;
  u_strFromUTF8(in.data(), static_cast<int32_t>(in.size()), &len, text.data(),
                static_cast<int32_t>(text.size()), &st);
  in.resize(len);
  out.resize(len * 4 + 16);
  st = U_ZERO_ERROR;
  int32_t got = unorm2_normalize(norm, in.data(), len, out.data(), static_cast<int32_t>(out.size()), &st);
  if (st == U_BUFFER_OVERFLOW_ERROR) {
    out.resize(got);
    st = U_ZERO_ERROR;
    got = unorm2_normalize(norm, in.data(), len, out.data(), static_cast<int32_t>(out.size()), &st);
  }
  out.resize(got);
  tmp.resize(out.size() * 3 + 4);
  st = U_ZERO_ERROR;
  u_strToUTF8(tmp.data(), static_cast<int32_t>(tmp.size()), &len, out.data(), got, &st);
  tmp.resize(len);
  text.swap(tmp);
}

} // namespace

void normalize(const std::vector<NormStep> &steps, Matcher &m, std::string &text,
               std::string &tmp) {
  std::vector<std::pair<uint32_t, uint32_t>> matches;
  for (const NormStep &st : steps) {
    switch (st.kind) {
    case NormStep::NFC:
    case NormStep::NFD:
    case NormStep::NFKC:
    case NormStep::NFKD:
      unicode_form(st.kind, text, tmp);
      break;
    case NormStep::Lowercase: {
      // char::to_lowercase per character: Unicode's lowercase mapping, where
      // U+0130 alone becomes two characters.
      tmp.clear();
      const uint8_t *p = reinterpret_cast<const uint8_t *>(text.data());
      for (size_t i = 0; i < text.size();) {
        size_t len;
        uint32_t cp = decode_utf8(p + i, text.size() - i, &len);
        if (cp < 0x80)
          tmp += static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
        else if (cp == 0x130)
          tmp += "i\xCC\x87";
        else
          append_utf8(tmp, static_cast<uint32_t>(u_tolower(static_cast<UChar32>(cp))));
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
      text = text.substr(b, e - b);
      break;
    }
    case NormStep::StripAccents: {
      tmp.clear();
      const uint8_t *p = reinterpret_cast<const uint8_t *>(text.data());
      for (size_t i = 0; i < text.size();) {
        size_t len;
        uint32_t cp = decode_utf8(p + i, text.size() - i, &len);
        if (cp < 0x80 || !is_mark(cp))
          tmp.append(text, i, len);
        i += len;
      }
      text.swap(tmp);
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
        // split; the byte alphabet is applied by the model's tables.
        if (st.add_prefix_space && arena[pc.off] != ' ') {
          uint32_t off = static_cast<uint32_t>(arena.size());
          arena.reserve(arena.size() + pc.len + 1);
          arena += ' ';
          arena.append(arena.data() + pc.off, pc.len);
          pc = {off, pc.len + 1, pc.first};
        }
        if (!st.regex) {
          s.next.push_back(pc);
          continue;
        }
        segments_by_regex(m, *st.regex, reinterpret_cast<const uint8_t *>(arena.data()) + pc.off,
                          pc.len, s);
        emit(pc, s.segments, Behavior::Isolated, false, s.next);
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
