// Shell words for `mtc import-megatron`: a launch script's text -> the training command.
#include "spec/MegatronImport.h"
#include "spec/MegatronImportImpl.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include <algorithm>
#include <cctype>
#include <cstring>

namespace mt::spec {

using namespace megatron;

namespace {

//===----------------------------------------------------------------------===//
// Shell word splitting
//===----------------------------------------------------------------------===//

// A word as the shell would see it, plus the expansions it would have made;
// we refuse those instead of guessing their values.
struct Word {
  std::string text;
  std::vector<std::string> expansions; // "$VAR", "${VAR}", "$(cmd)", "`cmd`"
};
using Command = std::vector<Word>;

// strchr() also finds the terminating NUL; a NUL in the text is no operator.
bool isOneOf(char c, const char *set) { return c != '\0' && std::strchr(set, c); }

bool isNameStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool isNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

// Index one past the parenthesis that closes the one at `open`, or npos.
size_t matchParen(const std::string &s, size_t open) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '(')
      ++depth;
    else if (s[i] == ')' && --depth == 0)
      return i + 1;
  }
  return std::string::npos;
}

// At s[i] == '$': reads a parameter expansion or command substitution and
// returns its text, advancing i past it. Returns "" (i unchanged) when the
// dollar is literal, as the shell treats `$` before a non-name character.
absl::StatusOr<std::string> readExpansion(const std::string &s, size_t &i) {
  size_t n = s.size();
  if (i + 1 >= n)
    return std::string();
  char c = s[i + 1];
  size_t end;
  if (c == '{') {
    end = s.find('}', i + 2);
    if (end == std::string::npos)
      return absl::InvalidArgumentError(
          "unterminated '${' in the command line; close it with '}'");
    ++end;
  } else if (c == '(') {
    end = matchParen(s, i + 1);
    if (end == std::string::npos)
      return absl::InvalidArgumentError(
          "unterminated '$(' in the command line; close it with ')'");
  } else if (isNameStart(c)) {
    end = i + 2;
    while (end < n && isNameChar(s[end]))
      ++end;
  } else if (std::isdigit(static_cast<unsigned char>(c)) || isOneOf(c, "@*#?$!-")) {
    end = i + 2;
  } else {
    return std::string();
  }
  std::string text = s.substr(i, end - i);
  i = end;
  return text;
}

// Splits text into commands (newline, `;`, `&`, `|` end one) of words.
// Redirections (`> log`, `2>&1`) are dropped with their target.
absl::StatusOr<std::vector<Command>> tokenize(const std::string &s) {
  std::vector<Command> commands;
  Command cmd;
  Word cur;
  bool inWord = false;
  bool dropNextWord = false; // the target of a redirection
  auto endWord = [&] {
    if (inWord) {
      if (dropNextWord)
        dropNextWord = false;
      else
        cmd.push_back(std::move(cur));
    }
    cur = Word();
    inWord = false;
  };
  auto endCommand = [&] {
    endWord();
    dropNextWord = false;
    if (!cmd.empty())
      commands.push_back(std::move(cmd));
    cmd.clear();
  };
  auto addExpansion = [&](size_t &i) -> absl::Status {
    absl::StatusOr<std::string> e = readExpansion(s, i);
    if (!e.ok())
      return e.status();
    if (e->empty()) {
      cur.text += '$';
      ++i;
    } else {
      cur.text += *e;
      cur.expansions.push_back(*e);
    }
    inWord = true;
    return absl::OkStatus();
  };

  size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    char c = s[i];
    if (c == ' ' || c == '\t' || c == '\r') {
      endWord();
      ++i;
    } else if (c == '\n') {
      endCommand();
      ++i;
    } else if (c == '#' && !inWord) {
      while (i < n && s[i] != '\n')
        ++i;
    } else if (c == '\\') {
      // Backslash-newline joins lines; any other backslash quotes one char.
      if (i + 1 < n && s[i + 1] == '\n') {
        i += 2;
      } else if (i + 2 < n && s[i + 1] == '\r' && s[i + 2] == '\n') {
        i += 3;
      } else if (i + 1 < n) {
        cur.text += s[i + 1];
        inWord = true;
        i += 2;
      } else {
        ++i;
      }
    } else if (c == '\'') {
      size_t close = s.find('\'', i + 1);
      if (close == std::string::npos)
        return absl::InvalidArgumentError(
            "unterminated single quote in the command line; close it with '");
      cur.text += s.substr(i + 1, close - i - 1);
      inWord = true;
      i = close + 1;
    } else if (c == '"') {
      inWord = true;
      ++i;
      bool closed = false;
      while (i < n) {
        char d = s[i];
        if (d == '"') {
          closed = true;
          ++i;
          break;
        }
        if (d == '\\' && i + 1 < n && isOneOf(s[i + 1], "$`\"\\\n")) {
          if (s[i + 1] != '\n')
            cur.text += s[i + 1];
          i += 2;
        } else if (d == '$') {
          if (absl::Status st = addExpansion(i); !st.ok())
            return st;
        } else if (d == '`') {
          size_t close = s.find('`', i + 1);
          if (close == std::string::npos)
            return absl::InvalidArgumentError(
                "unterminated '`' in the command line; close it with '`'");
          std::string e = s.substr(i, close + 1 - i);
          cur.text += e;
          cur.expansions.push_back(e);
          i = close + 1;
        } else {
          cur.text += d;
          ++i;
        }
      }
      if (!closed)
        return absl::InvalidArgumentError(
            "unterminated double quote in the command line; close it with \"");
    } else if (c == '$') {
      if (i + 1 < n && (s[i + 1] == '\'' || s[i + 1] == '"')) {
        ++i; // bash's $'...' and $"...": the quotes do the work
        continue;
      }
      if (absl::Status st = addExpansion(i); !st.ok())
        return st;
    } else if (c == '`') {
      size_t close = s.find('`', i + 1);
      if (close == std::string::npos)
        return absl::InvalidArgumentError(
            "unterminated '`' in the command line; close it with '`'");
      std::string e = s.substr(i, close + 1 - i);
      cur.text += e;
      cur.expansions.push_back(e);
      inWord = true;
      i = close + 1;
    } else if (c == '>' || c == '<') {
      // A redirection: a file-descriptor number just before it belongs to it.
      bool fdNumber = inWord && cur.expansions.empty() && !cur.text.empty() &&
                      cur.text.find_first_not_of("0123456789") == std::string::npos;
      if (fdNumber) {
        cur = Word();
        inWord = false;
      } else {
        endWord();
      }
      while (i < n && isOneOf(s[i], "<>&|"))
        ++i;
      dropNextWord = true;
      // `2>&1` names its target inside the operator's word.
      size_t j = i;
      while (j < n && std::isdigit(static_cast<unsigned char>(s[j])))
        ++j;
      if (j > i && s[i - 1] == '&' &&
          (j == n || std::isspace(static_cast<unsigned char>(s[j])))) {
        i = j;
        dropNextWord = false;
      }
    } else if (c == ';' || c == '&' || c == '|') {
      endCommand();
      while (i < n && isOneOf(s[i], ";&|"))
        ++i;
    } else {
      cur.text += c;
      inWord = true;
      ++i;
    }
  }
  endCommand();
  return commands;
}

} // namespace

namespace megatron {

bool isAssignment(const std::string &w) {
  if (w.empty() || !isNameStart(w[0]))
    return false;
  size_t i = 1;
  while (i < w.size() && isNameChar(w[i]))
    ++i;
  return i < w.size() && w[i] == '=';
}

// `set -x` prefixes traced commands with `+`, one per nesting level.
bool isTracePrefix(const std::string &w) {
  return !w.empty() && w.find_first_not_of('+') == std::string::npos;
}

// Quotes a word for the header comment so it reads back as one word.
std::string shellQuote(const std::string &w) {
  if (!w.empty() &&
      w.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                          "0123456789-_./=:,+@%") == std::string::npos)
    return w;
  std::string out = "'";
  for (char c : w) {
    if (c == '\'')
      out += "'\\''";
    else if (c == '\n')
      out += ' ';
    else
      out += c;
  }
  return out + "'";
}

} // namespace megatron

absl::StatusOr<std::vector<std::string>> splitCommandLine(const std::string &text) {
  absl::StatusOr<std::vector<Command>> tokens = tokenize(text);
  if (!tokens.ok())
    return tokens.status();

  // Drop env assignments and `set -x` markers; a line that starts with a flag
  // continues the command before it (argument files list one flag a line).
  std::vector<Command> commands;
  for (Command &c : *tokens) {
    size_t k = leadingNoise(c, [](const Word &w) { return w.text; });
    c.erase(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(k));
    if (c.empty())
      continue;
    if (startsWith(c[0].text, "-") && !commands.empty())
      commands.back().insert(commands.back().end(), c.begin(), c.end());
    else
      commands.push_back(std::move(c));
  }
  if (commands.empty())
    return absl::InvalidArgumentError(
        "the command line is empty; give the pretrain_gpt.py command or its flags");

  // A script holds other commands too (export, mkdir): take the training one.
  const Command *chosen = nullptr;
  if (commands.size() == 1) {
    chosen = &commands[0];
  } else {
    int runs = 0;
    for (const Command &c : commands)
      for (const Word &w : c)
        if (endsWith(w.text, kScript)) {
          chosen = &c;
          ++runs;
          break;
        }
    if (runs == 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "the text holds ", commands.size(),
          " commands and none runs pretrain_gpt.py; pass only the training command"));
    if (runs > 1)
      return absl::InvalidArgumentError(
          absl::StrCat("the text runs pretrain_gpt.py ", runs,
                       " times; pass only the training command you want translated"));
  }

  std::vector<std::string> expansions;
  std::vector<std::string> words;
  for (const Word &w : *chosen) {
    for (const std::string &e : w.expansions)
      if (std::find(expansions.begin(), expansions.end(), e) == expansions.end())
        expansions.push_back(e);
    words.push_back(w.text);
  }
  if (!expansions.empty())
    return absl::InvalidArgumentError(
        "the command line uses shell variables mtc cannot know: " +
        absl::StrJoin(expansions, ", ") +
        "; expand them first (run the script with `set -x` and pass the command "
        "it prints, or write literal values)");
  return words;
}

} // namespace mt::spec
