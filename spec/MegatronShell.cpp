// Shell evaluation for `mtc import-megatron`: a launch script's text -> its training command.
//
// Megatron-LM's launch scripts build the pretrain_gpt.py command from shell
// variables, arrays, `${VAR:-default}` parameters, `$1`.. and `$((...))`
// arithmetic. This file parses the subset of bash such scripts use and
// evaluates it without running anything: assignments are followed, every
// other command is skipped, and a value mtc cannot know (a command's output,
// a variable assigned under a condition it cannot evaluate, an unset
// variable) is carried as a "taint" that becomes an error only when the
// training command uses it.
#include "spec/MegatronImport.h"
#include "spec/MegatronImportImpl.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fnmatch.h>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <regex.h>
#include <set>
#include <unistd.h>

extern char **environ;

namespace mt::spec {

using namespace megatron;

namespace {

bool isOneOf(char c, const char *set) { return c != '\0' && std::strchr(set, c); }
bool isNameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool isNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool isDigit(char c) { return std::isdigit(static_cast<unsigned char>(c)); }

bool isName(const std::string &s) {
  if (s.empty() || !isNameStart(s[0]))
    return false;
  return std::all_of(s.begin(), s.end(), isNameChar);
}

// The text cut to one line and a readable length, for messages.
std::string brief(std::string s) {
  for (char &c : s)
    if (c == '\n' || c == '\t')
      c = ' ';
  if (s.size() > 60)
    s = s.substr(0, 57) + "...";
  return s;
}

//===----------------------------------------------------------------------===//
// Tokens
//===----------------------------------------------------------------------===//

enum class T {
  Word,      // raw text, quotes and expansions still in it
  ArrayOpen, // `NAME=(` or `NAME+=(`: text is `NAME=` / `NAME+=`
  Arith,     // `(( ... ))`: text is the expression
  Newline,
  Semi,
  DSemi, // `;;`, `;&`, `;;&`
  Amp,
  AndAnd,
  OrOr,
  Pipe,
  LParen,
  RParen,
  Redir, // `>`, `2>&`, `<<`, ...: the next word is its target
  End,
};

struct Token {
  T kind;
  std::string text;
  int line;
};

class Lexer {
public:
  Lexer(const std::string &s, const std::string &source) : s_(s), source_(source) {}

  absl::StatusOr<std::vector<Token>> run() {
    std::vector<Token> out;
    while (true) {
      absl::StatusOr<Token> t = next();
      if (!t.ok())
        return t.status();
      // After a here-document's operator, the next word names its end.
      if (heredocNext_ && t->kind == T::Word) {
        heredocs_.push_back({unquoteDelimiter(t->text), stripTabs_});
        heredocNext_ = false;
      }
      if (t->kind == T::Redir && (t->text == "<<" || t->text == "<<-")) {
        heredocNext_ = true;
        stripTabs_ = t->text == "<<-";
      }
      if (t->kind == T::Word && t->text == "[[")
        condDepth_ = 1;
      else if (t->kind == T::Word && t->text == "]]")
        condDepth_ = 0;
      bool end = t->kind == T::End;
      out.push_back(std::move(*t));
      if (end)
        break;
    }
    return out;
  }

private:
  absl::Status error(int line, const std::string &what) {
    return absl::InvalidArgumentError(absl::StrCat(source_, ":", line, ": ", what));
  }

  static std::string unquoteDelimiter(const std::string &w) {
    std::string out;
    for (char c : w)
      if (c != '\'' && c != '"' && c != '\\')
        out += c;
    return out;
  }

  // Skips the bodies of pending here-documents; i_ is at a line start.
  absl::Status skipHeredocs() {
    for (const auto &[delim, strip] : heredocs_) {
      int startLine = line_;
      while (true) {
        if (i_ >= s_.size())
          return error(startLine, "here-document has no closing '" + delim +
                                      "' line; add it");
        size_t eol = s_.find('\n', i_);
        std::string l = s_.substr(i_, eol == std::string::npos ? std::string::npos : eol - i_);
        i_ = eol == std::string::npos ? s_.size() : eol + 1;
        ++line_;
        if (strip)
          l.erase(0, l.find_first_not_of('\t') == std::string::npos
                         ? l.size()
                         : l.find_first_not_of('\t'));
        if (!l.empty() && l.back() == '\r')
          l.pop_back();
        if (l == delim)
          break;
      }
    }
    heredocs_.clear();
    return absl::OkStatus();
  }

  // Advances past the construct opened at s_[i_] (a quote, `$(`, `${`,
  // backquote), appending its raw text to out.
  absl::Status scanQuoted(std::string &out) {
    int startLine = line_;
    char c = s_[i_];
    auto take = [&] {
      if (s_[i_] == '\n')
        ++line_;
      out += s_[i_++];
    };
    if (c == '\'') {
      take();
      while (i_ < s_.size() && s_[i_] != '\'')
        take();
      if (i_ >= s_.size())
        return error(startLine, "unterminated single quote; close it with '");
      take();
      return absl::OkStatus();
    }
    if (c == '`') {
      take();
      while (i_ < s_.size() && s_[i_] != '`') {
        if (s_[i_] == '\\' && i_ + 1 < s_.size())
          take();
        take();
      }
      if (i_ >= s_.size())
        return error(startLine, "unterminated '`'; close it with '`'");
      take();
      return absl::OkStatus();
    }
    if (c == '"') {
      take();
      while (i_ < s_.size() && s_[i_] != '"') {
        if (s_[i_] == '\\' && i_ + 1 < s_.size()) {
          take();
          take();
        } else if (s_[i_] == '$' || s_[i_] == '`') {
          if (absl::Status st = scanDollar(out); !st.ok())
            return st;
        } else {
          take();
        }
      }
      if (i_ >= s_.size())
        return error(startLine, "unterminated double quote; close it with \"");
      take();
      return absl::OkStatus();
    }
    return scanDollar(out);
  }

  // At `$` or a backquote: a parameter, `$(...)`, `$((...))`, `${...}`.
  absl::Status scanDollar(std::string &out) {
    int startLine = line_;
    if (s_[i_] == '`') {
      return scanQuoted(out);
    }
    out += s_[i_++]; // '$'
    if (i_ >= s_.size())
      return absl::OkStatus();
    char open = s_[i_];
    if (open != '(' && open != '{')
      return absl::OkStatus(); // $NAME and the like are plain characters here
    char close = open == '(' ? ')' : '}';
    int depth = 0;
    while (i_ < s_.size()) {
      char c = s_[i_];
      if (c == '\'' && open == '(') {
        if (absl::Status st = scanQuoted(out); !st.ok())
          return st;
        continue;
      }
      if (c == '"' || c == '`' || (c == '$' && i_ + 1 < s_.size() &&
                                   (s_[i_ + 1] == '(' || s_[i_ + 1] == '{'))) {
        if (absl::Status st = scanQuoted(out); !st.ok())
          return st;
        continue;
      }
      if (c == '\\' && i_ + 1 < s_.size()) {
        out += s_[i_++];
      } else if (c == open) {
        ++depth;
      } else if (c == close && --depth == 0) {
        out += s_[i_++];
        return absl::OkStatus();
      }
      if (s_[i_] == '\n')
        ++line_;
      out += s_[i_++];
    }
    return error(startLine, std::string("unterminated '$") + open + "'; close it with '" +
                                close + "'");
  }

  bool atMeta() const {
    char c = s_[i_];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ';' || c == '&' || c == '|')
      return true;
    if (condDepth_ == 0 && (c == '(' || c == ')' || c == '<' || c == '>'))
      return true;
    return false;
  }

  absl::StatusOr<Token> next() {
    // Blanks, comments, continuations.
    while (i_ < s_.size()) {
      char c = s_[i_];
      if (c == ' ' || c == '\t' || c == '\r') {
        ++i_;
      } else if (c == '\\' && i_ + 1 < s_.size() && s_[i_ + 1] == '\n') {
        i_ += 2;
        ++line_;
      } else if (c == '\\' && i_ + 2 < s_.size() && s_[i_ + 1] == '\r' && s_[i_ + 2] == '\n') {
        i_ += 3;
        ++line_;
      } else if (c == '#') {
        while (i_ < s_.size() && s_[i_] != '\n')
          ++i_;
      } else {
        break;
      }
    }
    int line = line_;
    if (i_ >= s_.size())
      return Token{T::End, "", line};
    char c = s_[i_];
    auto op = [&](T kind, size_t len) {
      Token t{kind, s_.substr(i_, len), line};
      i_ += len;
      return t;
    };
    auto at = [&](const char *p) { return s_.compare(i_, std::strlen(p), p) == 0; };
    if (c == '\n') {
      ++i_;
      ++line_;
      if (!heredocs_.empty())
        if (absl::Status st = skipHeredocs(); !st.ok())
          return st;
      return Token{T::Newline, "\n", line};
    }
    if (condDepth_ > 0 && (at("&&") || at("||")))
      return op(T::Word, 2);
    if (at(";;&"))
      return op(T::DSemi, 3);
    if (at(";;") || at(";&"))
      return op(T::DSemi, 2);
    if (c == ';')
      return op(T::Semi, 1);
    if (at("&&"))
      return op(T::AndAnd, 2);
    if (at("||"))
      return op(T::OrOr, 2);
    if (at("|&"))
      return op(T::Pipe, 2);
    if (c == '|')
      return op(T::Pipe, 1);
    if (at("&>>"))
      return op(T::Redir, 3);
    if (at("&>"))
      return op(T::Redir, 2);
    if (c == '&')
      return op(T::Amp, 1);
    if (condDepth_ == 0) {
      if (at("((")) {
        // An arithmetic command; `((` never opens two subshells here.
        size_t depth = 0, j = i_;
        for (; j < s_.size(); ++j) {
          if (s_[j] == '(')
            ++depth;
          else if (s_[j] == ')' && --depth == 0)
            break;
          else if (s_[j] == '\n')
            ++line_;
        }
        if (j >= s_.size())
          return error(line, "unterminated '(('; close it with '))'");
        Token t{T::Arith, s_.substr(i_ + 2, j - i_ - 3), line};
        i_ = j + 1;
        return t;
      }
      if (c == '(')
        return op(T::LParen, 1);
      if (c == ')')
        return op(T::RParen, 1);
      if (c == '<' || c == '>') {
        size_t j = i_;
        while (j < s_.size() && isOneOf(s_[j], "<>&|-") && j - i_ < 3)
          ++j;
        return op(T::Redir, j - i_);
      }
    }
    // A word. A number right before `<` or `>` is a file descriptor.
    std::string raw;
    while (i_ < s_.size() && !atMeta()) {
      char d = s_[i_];
      if (d == '\\' && i_ + 1 < s_.size()) {
        if (s_[i_ + 1] == '\n') {
          i_ += 2;
          ++line_;
          continue;
        }
        raw += s_.substr(i_, 2);
        i_ += 2;
      } else if (d == '\'' || d == '"' || d == '`' || d == '$') {
        if (absl::Status st = scanQuoted(raw); !st.ok())
          return st;
      } else {
        raw += d;
        ++i_;
      }
    }
    if (condDepth_ == 0 && i_ < s_.size() && (s_[i_] == '<' || s_[i_] == '>') &&
        !raw.empty() && std::all_of(raw.begin(), raw.end(), isDigit)) {
      size_t j = i_;
      while (j < s_.size() && isOneOf(s_[j], "<>&|-") && j - i_ < 3)
        ++j;
      Token t{T::Redir, raw + s_.substr(i_, j - i_), line};
      i_ = j;
      return t;
    }
    if (raw.empty()) {
      // A lone metacharacter in [[ ]] (`(`, `<`): a word of its own.
      raw = std::string(1, s_[i_++]);
      return Token{T::Word, raw, line};
    }
    // NAME=( or NAME+=( opens an array.
    if (i_ < s_.size() && s_[i_] == '(' && !raw.empty() && raw.back() == '=' &&
        isAssignment(raw)) {
      ++i_;
      return Token{T::ArrayOpen, raw, line};
    }
    return Token{T::Word, raw, line};
  }

  const std::string &s_;
  const std::string &source_;
  size_t i_ = 0;
  int line_ = 1;
  int condDepth_ = 0;
  bool heredocNext_ = false, stripTabs_ = false;
  std::vector<std::pair<std::string, bool>> heredocs_;
};

//===----------------------------------------------------------------------===//
// Syntax tree
//===----------------------------------------------------------------------===//

struct Assign {
  std::string name;
  std::optional<std::string> index; // NAME[index]=
  bool append = false;              // +=
  bool array = false;               // NAME=( ... )
  std::string value;                // raw word
  std::vector<std::string> elements; // raw words of ( ... )
  int line = 0;
};

struct Node;
using NodeP = std::unique_ptr<Node>;

struct Node {
  enum Kind {
    Simple,   // assigns + words
    List,     // kids joined by ops (`;`, `&&`, `||`, newline)
    Pipeline, // kids joined by `|`
    If,       // kids: cond, then, [cond, then]..., [else]
    While,    // kids: cond, body; until = negate
    For,      // name, words, kids: body; arith = C-style
    Case,     // word, arms
    Group,    // kids[0]; subshell = ( )
    FuncDef,  // name, kids[0]
    Arith,    // text
  } kind;
  int line = 0;
  bool negate = false;  // `!` pipeline, or `until`
  bool subshell = false;
  bool hasElse = false;
  bool cStyle = false; // for (( ; ; ))
  std::string name, text;
  std::vector<Assign> assigns;
  std::vector<std::string> words;
  std::vector<int> wordLines;
  std::vector<NodeP> kids;
  std::vector<T> ops;
  struct Arm {
    std::vector<std::string> patterns;
    NodeP body;
  };
  std::vector<Arm> arms;
  std::string funcText; // function bodies: whether they mention a .py script
};

class Parser {
public:
  Parser(std::vector<Token> toks, const std::string &source, bool flagLines)
      : t_(std::move(toks)), source_(source), flagLines_(flagLines) {}

  absl::StatusOr<NodeP> program() {
    absl::StatusOr<NodeP> l = list({}, /*top=*/true);
    if (!l.ok())
      return l;
    if (peek().kind != T::End)
      return error(peek().line, "unexpected '" + tokenText(peek()) + "'");
    return l;
  }

private:
  const Token &peek(size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  Token take() { return t_[std::min(p_++, t_.size() - 1)]; }
  bool isWord(const char *w, size_t k = 0) const {
    return peek(k).kind == T::Word && peek(k).text == w;
  }
  static std::string tokenText(const Token &t) {
    return t.kind == T::Newline ? "newline" : t.kind == T::End ? "end of file" : t.text;
  }
  absl::Status error(int line, const std::string &what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ":", line, ": ", what));
  }
  void skipNewlines() {
    while (peek().kind == T::Newline)
      take();
  }
  absl::Status expectWord(const char *w, const char *what, int line) {
    skipNewlines();
    if (!isWord(w))
      return error(peek().line, absl::StrCat("expected '", w, "' to ", what, " (opened at line ",
                                             line, "), found '", tokenText(peek()), "'"));
    take();
    return absl::OkStatus();
  }

  // Items until a reserved word in `stops`, `)`, `;;` or the end.
  absl::StatusOr<NodeP> list(const std::set<std::string> &stops, bool top = false) {
    auto node = std::make_unique<Node>();
    node->kind = Node::List;
    node->line = peek().line;
    while (true) {
      skipNewlines();
      const Token &t = peek();
      if (t.kind == T::End || t.kind == T::RParen || t.kind == T::DSemi)
        break;
      if (t.kind == T::Word && stops.count(t.text))
        break;
      absl::StatusOr<NodeP> item = andOr();
      if (!item.ok())
        return item.status();
      // An argument file lists one flag a line: such a line continues the
      // command before it.
      if (top && flagLines_ && !node->kids.empty() && (*item)->kind == Node::Simple &&
          (*item)->assigns.empty() && !(*item)->words.empty() &&
          startsWith((*item)->words[0], "-") && node->kids.back()->kind == Node::Simple &&
          (node->ops.empty() || node->ops.back() == T::Newline)) {
        Node &prev = *node->kids.back();
        prev.words.insert(prev.words.end(), (*item)->words.begin(), (*item)->words.end());
        prev.wordLines.insert(prev.wordLines.end(), (*item)->wordLines.begin(),
                              (*item)->wordLines.end());
      } else {
        node->kids.push_back(std::move(*item));
      }
      T sep = peek().kind;
      if (sep == T::Semi || sep == T::Amp || sep == T::Newline) {
        take();
        if (node->ops.size() < node->kids.size())
          node->ops.push_back(sep == T::Newline ? T::Newline : T::Semi);
        else
          node->ops.back() = sep == T::Newline ? T::Newline : T::Semi;
        continue;
      }
      break;
    }
    return node;
  }

  absl::StatusOr<NodeP> andOr() {
    absl::StatusOr<NodeP> first = pipeline();
    if (!first.ok())
      return first;
    if (peek().kind != T::AndAnd && peek().kind != T::OrOr)
      return first;
    auto node = std::make_unique<Node>();
    node->kind = Node::List;
    node->line = (*first)->line;
    node->kids.push_back(std::move(*first));
    while (peek().kind == T::AndAnd || peek().kind == T::OrOr) {
      node->ops.push_back(take().kind);
      skipNewlines();
      absl::StatusOr<NodeP> next = pipeline();
      if (!next.ok())
        return next;
      node->kids.push_back(std::move(*next));
    }
    return node;
  }

  absl::StatusOr<NodeP> pipeline() {
    bool negate = false;
    while (isWord("!")) {
      take();
      negate = !negate;
    }
    if (isWord("time"))
      take();
    absl::StatusOr<NodeP> first = command();
    if (!first.ok())
      return first;
    if (peek().kind != T::Pipe) {
      (*first)->negate = (*first)->negate != negate;
      return first;
    }
    auto node = std::make_unique<Node>();
    node->kind = Node::Pipeline;
    node->line = (*first)->line;
    node->negate = negate;
    node->kids.push_back(std::move(*first));
    while (peek().kind == T::Pipe) {
      take();
      skipNewlines();
      absl::StatusOr<NodeP> next = command();
      if (!next.ok())
        return next;
      node->kids.push_back(std::move(*next));
    }
    return node;
  }

  // Redirections after a compound command are dropped.
  void skipRedirections() {
    while (peek().kind == T::Redir) {
      take();
      if (peek().kind == T::Word)
        take();
    }
  }

  absl::StatusOr<NodeP> command() {
    const Token &t = peek();
    int line = t.line;
    auto compound = [&](absl::StatusOr<NodeP> n) -> absl::StatusOr<NodeP> {
      if (n.ok())
        skipRedirections();
      return n;
    };
    if (t.kind == T::Word) {
      if (t.text == "if")
        return compound(ifCommand());
      if (t.text == "while" || t.text == "until")
        return compound(whileCommand());
      if (t.text == "for" || t.text == "select")
        return compound(forCommand());
      if (t.text == "case")
        return compound(caseCommand());
      if (t.text == "{") {
        take();
        absl::StatusOr<NodeP> body = list({"}"});
        if (!body.ok())
          return body;
        if (absl::Status st = expectWord("}", "close the group", line); !st.ok())
          return st;
        return compound(group(std::move(*body), false, line));
      }
      if (t.text == "function") {
        take();
        if (peek().kind != T::Word)
          return error(line, "expected a function name after 'function'");
        std::string name = take().text;
        if (peek().kind == T::LParen && peek(1).kind == T::RParen) {
          take();
          take();
        }
        return funcDef(name, line);
      }
      if (peek(1).kind == T::LParen && peek(2).kind == T::RParen && isName(t.text)) {
        std::string name = take().text;
        take();
        take();
        return funcDef(name, line);
      }
    }
    if (t.kind == T::LParen) {
      take();
      absl::StatusOr<NodeP> body = list({});
      if (!body.ok())
        return body;
      skipNewlines();
      if (peek().kind != T::RParen)
        return error(peek().line, absl::StrCat("expected ')' to close the subshell opened at line ",
                                               line, ", found '", tokenText(peek()), "'"));
      take();
      return compound(group(std::move(*body), true, line));
    }
    if (t.kind == T::Arith) {
      auto node = std::make_unique<Node>();
      node->kind = Node::Arith;
      node->line = line;
      node->text = take().text;
      return compound(std::move(node));
    }
    return simple();
  }

  NodeP group(NodeP body, bool subshell, int line) {
    auto node = std::make_unique<Node>();
    node->kind = Node::Group;
    node->line = line;
    node->subshell = subshell;
    node->kids.push_back(std::move(body));
    return node;
  }

  absl::StatusOr<NodeP> funcDef(const std::string &name, int line) {
    skipNewlines();
    size_t from = p_;
    absl::StatusOr<NodeP> body = command();
    if (!body.ok())
      return body;
    auto node = std::make_unique<Node>();
    node->kind = Node::FuncDef;
    node->line = line;
    node->name = name;
    for (size_t k = from; k < p_ && k < t_.size(); ++k)
      node->funcText += t_[k].text + " ";
    node->kids.push_back(std::move(*body));
    return node;
  }

  absl::StatusOr<NodeP> simple() {
    auto node = std::make_unique<Node>();
    node->kind = Node::Simple;
    node->line = peek().line;
    while (true) {
      const Token &t = peek();
      if (t.kind == T::Word) {
        // `set -x` traces start with `+`, one per nesting level.
        if (node->words.empty() && node->assigns.empty() && isTracePrefix(t.text)) {
          take();
          continue;
        }
        if (node->words.empty() && isAssignment(t.text)) {
          node->assigns.push_back(parseAssign(t.text, t.line));
          take();
          continue;
        }
        node->words.push_back(t.text);
        node->wordLines.push_back(t.line);
        take();
      } else if (t.kind == T::ArrayOpen) {
        int line = t.line;
        Assign a = parseAssign(take().text, line);
        a.array = true;
        while (true) {
          const Token &e = peek();
          if (e.kind == T::Newline) {
            take();
          } else if (e.kind == T::Word) {
            a.elements.push_back(take().text);
          } else if (e.kind == T::RParen) {
            take();
            break;
          } else {
            return error(e.line, absl::StrCat("expected ')' to close the array ", a.name,
                                              " opened at line ", line, ", found '",
                                              tokenText(e), "'"));
          }
        }
        if (node->words.empty()) {
          node->assigns.push_back(std::move(a));
        } else {
          // declare -a NAME=( ... ): keep it for the builtin.
          node->words.push_back("\x01" + std::to_string(node->assigns.size()));
          node->wordLines.push_back(line);
          node->assigns.push_back(std::move(a));
        }
      } else if (t.kind == T::Redir) {
        take();
        if (peek().kind == T::Word)
          take();
      } else {
        break;
      }
    }
    if (node->words.empty() && node->assigns.empty())
      return error(peek().line, "unexpected '" + tokenText(peek()) + "'");
    return node;
  }

  static Assign parseAssign(const std::string &w, int line) {
    Assign a;
    a.line = line;
    size_t eq = w.find('=');
    std::string lhs = w.substr(0, eq);
    a.value = w.substr(eq + 1);
    if (!lhs.empty() && lhs.back() == '+') {
      a.append = true;
      lhs.pop_back();
    }
    size_t br = lhs.find('[');
    if (br != std::string::npos) {
      a.index = lhs.substr(br + 1, lhs.size() - br - 2);
      lhs = lhs.substr(0, br);
    }
    a.name = lhs;
    return a;
  }

  absl::StatusOr<NodeP> ifCommand() {
    int line = take().line; // if
    auto node = std::make_unique<Node>();
    node->kind = Node::If;
    node->line = line;
    while (true) {
      absl::StatusOr<NodeP> cond = list({"then"});
      if (!cond.ok())
        return cond;
      if (absl::Status st = expectWord("then", "follow the if condition", line); !st.ok())
        return st;
      absl::StatusOr<NodeP> body = list({"elif", "else", "fi"});
      if (!body.ok())
        return body;
      node->kids.push_back(std::move(*cond));
      node->kids.push_back(std::move(*body));
      if (isWord("elif")) {
        take();
        continue;
      }
      if (isWord("else")) {
        take();
        absl::StatusOr<NodeP> other = list({"fi"});
        if (!other.ok())
          return other;
        node->kids.push_back(std::move(*other));
        node->hasElse = true;
      }
      if (absl::Status st = expectWord("fi", "close the if", line); !st.ok())
        return st;
      return node;
    }
  }

  absl::StatusOr<NodeP> whileCommand() {
    Token kw = take();
    auto node = std::make_unique<Node>();
    node->kind = Node::While;
    node->line = kw.line;
    node->negate = kw.text == "until";
    absl::StatusOr<NodeP> cond = list({"do"});
    if (!cond.ok())
      return cond;
    if (absl::Status st = expectWord("do", "follow the loop condition", kw.line); !st.ok())
      return st;
    absl::StatusOr<NodeP> body = list({"done"});
    if (!body.ok())
      return body;
    if (absl::Status st = expectWord("done", "close the loop", kw.line); !st.ok())
      return st;
    node->kids.push_back(std::move(*cond));
    node->kids.push_back(std::move(*body));
    return node;
  }

  absl::StatusOr<NodeP> forCommand() {
    Token kw = take();
    auto node = std::make_unique<Node>();
    node->kind = Node::For;
    node->line = kw.line;
    if (peek().kind == T::Arith) {
      node->cStyle = true;
      node->text = take().text;
    } else {
      if (peek().kind != T::Word || !isName(peek().text))
        return error(kw.line, "expected a variable name after '" + kw.text + "'");
      node->name = take().text;
      skipNewlines();
      if (isWord("in")) {
        take();
        node->hasElse = true; // an explicit word list
        while (peek().kind == T::Word) {
          node->words.push_back(peek().text);
          node->wordLines.push_back(peek().line);
          take();
        }
      }
    }
    if (peek().kind == T::Semi)
      take();
    if (absl::Status st = expectWord("do", "start the loop body", kw.line); !st.ok())
      return st;
    absl::StatusOr<NodeP> body = list({"done"});
    if (!body.ok())
      return body;
    if (absl::Status st = expectWord("done", "close the loop", kw.line); !st.ok())
      return st;
    node->kids.push_back(std::move(*body));
    return node;
  }

  absl::StatusOr<NodeP> caseCommand() {
    int line = take().line;
    auto node = std::make_unique<Node>();
    node->kind = Node::Case;
    node->line = line;
    if (peek().kind != T::Word)
      return error(line, "expected a word after 'case'");
    node->text = take().text;
    if (absl::Status st = expectWord("in", "follow the case word", line); !st.ok())
      return st;
    while (true) {
      skipNewlines();
      if (isWord("esac")) {
        take();
        return node;
      }
      Node::Arm arm;
      if (peek().kind == T::LParen)
        take();
      while (true) {
        if (peek().kind != T::Word)
          return error(peek().line, "expected a case pattern, found '" + tokenText(peek()) + "'");
        arm.patterns.push_back(take().text);
        if (peek().kind == T::Pipe) {
          take();
          continue;
        }
        break;
      }
      if (peek().kind != T::RParen)
        return error(peek().line, "expected ')' after the case pattern, found '" +
                                      tokenText(peek()) + "'");
      take();
      absl::StatusOr<NodeP> body = list({"esac"});
      if (!body.ok())
        return body;
      arm.body = std::move(*body);
      node->arms.push_back(std::move(arm));
      if (peek().kind == T::DSemi)
        take();
      else if (!isWord("esac"))
        return error(peek().line, absl::StrCat("expected ';;' or 'esac' in the case at line ",
                                               line, ", found '", tokenText(peek()), "'"));
    }
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  const std::string &source_;
  bool flagLines_;
};

//===----------------------------------------------------------------------===//
// Values
//===----------------------------------------------------------------------===//

// Why a value is not what bash would give, or may not be.
struct Taint {
  bool unset = false;   // the value is bash's (empty) but came from an unset variable
  bool positional = false;
  std::string what;     // unset: "$NAME"; otherwise the construct mtc cannot follow
  int line = 0;         // where
  std::string via;      // the variable that carried it to the command
  std::string fix;      // what to do, when more specific than the default
};
using Taints = std::vector<Taint>;

void addTaints(Taints &to, const Taints &from) {
  for (const Taint &t : from) {
    bool dup = std::any_of(to.begin(), to.end(), [&](const Taint &u) {
      return u.what == t.what && u.line == t.line && u.via == t.via;
    });
    if (!dup)
      to.push_back(t);
  }
}

bool hard(const Taints &ts) {
  return std::any_of(ts.begin(), ts.end(), [](const Taint &t) { return !t.unset; });
}

struct Var {
  std::vector<std::string> values; // one for a scalar
  bool array = false;
  bool exported = false;
  Taints taints;
};

struct Str {
  std::string text;
  Taints taints;
};

struct Fields {
  std::vector<std::string> fields;
  Taints taints;
};

enum class Tri { False, True, Unknown };

Tri triNot(Tri t) {
  return t == Tri::True ? Tri::False : t == Tri::False ? Tri::True : Tri::Unknown;
}

// A command that runs a Python training script, as found.
struct Candidate {
  std::vector<std::string> words;
  Taints taints;
  int line;
  std::string uncertain; // why it may not run, when it may not
  bool pretrainGpt;
};

struct ControlFlow {
  int breaks = 0, continues = 0;
  bool exited = false;
  int exitLine = 0;
};

//===----------------------------------------------------------------------===//
// The evaluator
//===----------------------------------------------------------------------===//

class Shell {
public:
  Shell(const ShellOptions &opts) : opts_(opts) {
    std::vector<std::string> env;
    if (opts.environment) {
      env = *opts.environment;
    } else {
      for (char **e = environ; e && *e; ++e)
        env.push_back(*e);
    }
    for (const std::string &kv : env) {
      size_t eq = kv.find('=');
      if (eq == std::string::npos || !isName(kv.substr(0, eq)))
        continue;
      Var v;
      v.values = {kv.substr(eq + 1)};
      v.exported = true;
      vars_[kv.substr(0, eq)] = v;
    }
    // What bash sets itself when the environment does not.
    if (!vars_.count("PWD")) {
      char buf[4096];
      if (getcwd(buf, sizeof buf))
        vars_["PWD"].values = {buf};
    }
    if (!vars_.count("HOSTNAME")) {
      char buf[256];
      if (gethostname(buf, sizeof buf) == 0) {
        buf[sizeof buf - 1] = '\0';
        vars_["HOSTNAME"].values = {buf};
      }
    }
    vars_["UID"].values = {std::to_string(getuid())};
    vars_["EUID"].values = {std::to_string(geteuid())};
    positional_ = opts.args;
  }

  absl::Status run(const Node &program) {
    ControlFlow cf;
    absl::StatusOr<Tri> st = exec(program, cf);
    if (!st.ok())
      return st.status();
    if (cf.exited)
      exitLine_ = cf.exitLine;
    return absl::OkStatus();
  }

  std::vector<Candidate> &candidates() { return candidates_; }
  const std::vector<std::pair<std::string, int>> &pyFunctionCalls() const { return pyCalls_; }
  int exitLine() const { return exitLine_; }
  int simpleCommands() const { return simpleCommands_; }
  const std::vector<Candidate> &flagCommands() const { return flagCommands_; }

  // The message for a value the training command cannot have.
  std::string explain(const Candidate &c) const {
    const Taint *first = nullptr;
    for (const Taint &t : c.taints)
      if (!t.unset) {
        first = &t;
        break;
      }
    std::string cmd = absl::StrCat("the training command (line ", c.line, ")");
    std::string script = opts_.source;
    if (first) {
      std::string msg = absl::StrCat(script, ":", first->line, ": mtc cannot follow ",
                                     first->what, ", and ", cmd, " uses its value");
      if (!first->via.empty())
        absl::StrAppend(&msg, " (through $", first->via, ")");
      absl::StrAppend(&msg, "; ",
                      first->fix.empty()
                          ? absl::StrCat("mtc runs nothing: write a literal value on line ",
                                         first->line)
                          : first->fix);
      return msg;
    }
    // Every unset variable the command needs, in one message, in line order.
    Taints unset = c.taints;
    std::stable_sort(unset.begin(), unset.end(),
                     [](const Taint &x, const Taint &y) { return x.line < y.line; });
    std::vector<std::string> names;
    bool positional = false;
    std::string envHint;
    for (const Taint &t : unset) {
      std::string n = absl::StrCat(t.what, " (line ", t.line,
                                   t.via.empty() ? "" : ", through $" + t.via, ")");
      if (std::find(names.begin(), names.end(), n) == names.end())
        names.push_back(n);
      if (t.positional)
        positional = true;
      else if (envHint.empty())
        envHint = t.what.substr(1);
    }
    std::string msg;
    if (names.size() == 1)
      msg = absl::StrCat(script, ":", unset[0].line, ": ", unset[0].what, " is not set, and ",
                         cmd, " uses it",
                         unset[0].via.empty() ? "" : " (through $" + unset[0].via + ")");
    else
      msg = absl::StrCat(script, ":", unset[0].line, ": ", cmd, " needs ",
                         absl::StrJoin(names, ", "), ", which are not set");
    std::vector<std::string> fixes;
    if (positional)
      fixes.push_back(
          opts_.scriptArgs
              ? absl::StrCat("pass the script's arguments after it (mtc import-megatron --script ",
                             script, " ARG1 ARG2 ...)")
              : "import the script with --script FILE ARG1 ARG2 ... to give its arguments");
    if (!envHint.empty())
      fixes.push_back(absl::StrCat("set ", envHint, " in the environment (", envHint,
                                   "=VALUE mtc import-megatron ...; ", envHint,
                                   "= for an empty value)"));
    return msg + "; " + absl::StrJoin(fixes, ", and ");
  }

private:
  //===--------------------------------------------------------------------===//
  // Variables
  //===--------------------------------------------------------------------===//

  // A variable assigned where mtc cannot tell whether, or to what.
  void taintVar(const std::string &name, const Taint &why) {
    Var &v = vars_[name];
    Taint t = why;
    if (t.via.empty())
      t.via = name;
    v.taints.erase(std::remove_if(v.taints.begin(), v.taints.end(),
                                  [](const Taint &u) { return u.unset; }),
                   v.taints.end());
    addTaints(v.taints, {t});
  }

  void setVar(const std::string &name, std::vector<std::string> values, bool array,
              Taints taints) {
    Var &v = vars_[name];
    v.values = std::move(values);
    v.array = array;
    for (Taint &t : taints)
      if (t.via.empty())
        t.via = name;
    v.taints = std::move(taints);
  }

  const Var *lookup(const std::string &name) const {
    auto it = vars_.find(name);
    return it == vars_.end() ? nullptr : &it->second;
  }

  //===--------------------------------------------------------------------===//
  // Expansion
  //===--------------------------------------------------------------------===//

  Taint hardTaint(const std::string &what, int line, std::string fix = "") const {
    Taint t;
    t.what = what;
    t.line = line;
    t.fix = std::move(fix);
    return t;
  }

  // The value of a parameter: name, digit(s) or special character, with an
  // optional [index]; nullopt when unset.
  struct Param {
    std::vector<std::string> values;
    bool multi = false; // "$@" / "${A[@]}": one field per value when quoted
    bool star = false;  // "$*" / "${A[*]}": joined by a space
    Taints taints;
    bool set = true;
  };

  absl::StatusOr<Param> param(const std::string &name, const std::optional<std::string> &index,
                              int line) {
    Param p;
    auto unsetTaint = [&](const std::string &shown, bool positional) {
      Taint t;
      t.unset = true;
      t.positional = positional;
      t.what = shown;
      t.line = line;
      if (sourcedAt_) {
        Taint u = *sourcedAt_;
        u.via = shown.substr(1);
        return u;
      }
      return t;
    };
    if (name == "@" || name == "*") {
      p.values = positional_;
      p.multi = name == "@";
      p.star = name == "*";
      addTaints(p.taints, positionalTaints_);
      return p;
    }
    if (name == "#") {
      p.values = {std::to_string(positional_.size())};
      addTaints(p.taints, positionalTaints_);
      return p;
    }
    if (name == "0") {
      p.values = {opts_.source};
      return p;
    }
    if (!name.empty() && std::all_of(name.begin(), name.end(), isDigit)) {
      size_t k = std::stoul(name);
      addTaints(p.taints, positionalTaints_);
      if (k == 0 || k > positional_.size()) {
        p.set = false;
        p.taints.push_back(unsetTaint("$" + name, true));
        return p;
      }
      p.values = {positional_[k - 1]};
      return p;
    }
    if (name == "$" || name == "!" || name == "?" || name == "-" || name == "RANDOM" ||
        name == "SECONDS" || name == "PPID" || name == "BASHPID" || name == "SRANDOM" ||
        name == "EPOCHSECONDS" || name == "EPOCHREALTIME") {
      p.values = {"$" + name};
      p.taints.push_back(hardTaint("$" + name + ", which changes from run to run", line));
      return p;
    }
    if (name == "LINENO") {
      p.values = {std::to_string(line)};
      return p;
    }
    const Var *v = lookup(name);
    if (!v) {
      p.set = false;
      p.taints.push_back(unsetTaint("$" + name, false));
      return p;
    }
    p.taints = v->taints;
    if (!index) {
      if (v->values.empty()) {
        p.set = false;
        return p;
      }
      p.values = {v->values[0]};
      return p;
    }
    if (*index == "@" || *index == "*") {
      p.values = v->values;
      p.multi = *index == "@";
      p.star = *index == "*";
      return p;
    }
    absl::StatusOr<Str> ix = expandString(*index, line);
    if (!ix.ok())
      return ix.status();
    absl::StatusOr<std::optional<int64_t>> k = arithmetic(ix->text, line, p.taints);
    if (!k.ok())
      return k.status();
    if (!*k) {
      p.values = {"${" + name + "[" + *index + "]}"};
      return p;
    }
    int64_t i = **k < 0 ? static_cast<int64_t>(v->values.size()) + **k : **k;
    if (i < 0 || i >= static_cast<int64_t>(v->values.size())) {
      p.set = false;
      p.taints.push_back(unsetTaint("${" + name + "[" + *index + "]}", false));
      return p;
    }
    p.values = {v->values[static_cast<size_t>(i)]};
    return p;
  }

  // `${...}`: its text without the braces.
  absl::StatusOr<Param> braced(const std::string &body, int line) {
    size_t i = 0;
    bool length = false, indirect = false;
    if (body.size() > 1 && body[0] == '#') {
      length = true;
      i = 1;
    } else if (body.size() > 1 && body[0] == '!') {
      indirect = true;
      i = 1;
    }
    size_t start = i;
    if (i < body.size() && isNameStart(body[i])) {
      while (i < body.size() && isNameChar(body[i]))
        ++i;
    } else if (i < body.size() && isDigit(body[i])) {
      while (i < body.size() && isDigit(body[i]))
        ++i;
    } else if (i < body.size() && isOneOf(body[i], "@*#?$!-")) {
      ++i;
    }
    std::string name = body.substr(start, i - start);
    if (name.empty() && length) { // ${#}
      name = "#";
      length = false;
    }
    std::optional<std::string> index;
    if (i < body.size() && body[i] == '[') {
      size_t close = body.find(']', i);
      if (close == std::string::npos)
        return absl::InvalidArgumentError(
            absl::StrCat(opts_.source, ":", line, ": unterminated '[' in ${", body, "}"));
      index = body.substr(i + 1, close - i - 1);
      i = close + 1;
    }
    std::string rest = body.substr(i);
    Param unsupported;
    unsupported.values = {"${" + body + "}"};
    if (name.empty() || indirect) {
      unsupported.taints.push_back(
          hardTaint("the expansion ${" + body + "}", line,
                    absl::StrCat("write the value on line ", line, " literally")));
      return unsupported;
    }
    absl::StatusOr<Param> p = param(name, index, line);
    if (!p.ok())
      return p;
    if (length) {
      if (!rest.empty()) {
        unsupported.taints.push_back(hardTaint("the expansion ${" + body + "}", line));
        return unsupported;
      }
      Param out;
      out.taints = p->taints;
      out.taints.erase(std::remove_if(out.taints.begin(), out.taints.end(),
                                      [](const Taint &t) { return t.unset; }),
                       out.taints.end());
      out.values = {std::to_string(p->multi || p->star ? p->values.size()
                                   : p->values.empty() ? 0
                                                       : p->values[0].size())};
      return out;
    }
    if (rest.empty())
      return p;
    // Operators: -, :-, =, :=, +, :+, ?, :?, #, ##, %, %%.
    bool colon = rest[0] == ':';
    size_t opAt = colon ? 1 : 0;
    if (opAt >= rest.size()) {
      unsupported.taints.push_back(hardTaint("the expansion ${" + body + "}", line));
      return unsupported;
    }
    char op = rest[opAt];
    std::string word = rest.substr(opAt + 1);
    bool isNull = !p->set || (colon && !(p->multi || p->star) &&
                              (p->values.empty() || p->values[0].empty()));
    if (p->multi || p->star)
      isNull = !p->set || (colon && p->values.empty());
    auto expandedWord = [&]() -> absl::StatusOr<Param> {
      absl::StatusOr<Str> w = expandString(word, line, /*removeQuotes=*/true);
      if (!w.ok())
        return w.status();
      Param out;
      out.values = {w->text};
      out.taints = w->taints;
      return out;
    };
    auto withoutUnset = [](Param q) {
      q.taints.erase(std::remove_if(q.taints.begin(), q.taints.end(),
                                    [](const Taint &t) { return t.unset; }),
                     q.taints.end());
      return q;
    };
    switch (colon ? op : op) {
    case '-':
      if (isNull)
        return expandedWord();
      return p;
    case '=':
      if (isNull) {
        absl::StatusOr<Param> w = expandedWord();
        if (!w.ok())
          return w;
        if (name.empty() || !isNameStart(name[0]) || index) {
          unsupported.taints.push_back(hardTaint("the expansion ${" + body + "}", line));
          return unsupported;
        }
        setVar(name, w->values, false, w->taints);
        return w;
      }
      return p;
    case '+':
      if (isNull) {
        Param empty;
        empty.values = {""};
        empty.taints = withoutUnset(*p).taints;
        return empty;
      }
      return expandedWord();
    case '?':
      if (isNull) {
        unsupported.taints.push_back(hardTaint(
            "${" + body + "}, which stops the script when " + name + " is not set", line,
            absl::StrCat("set ", name, " in the environment")));
        return unsupported;
      }
      return p;
    case '#':
    case '%': {
      if (colon)
        break;
      bool longest = word.size() > 0 && word[0] == op;
      absl::StatusOr<Str> pat = expandString(longest ? word.substr(1) : word, line, true);
      if (!pat.ok())
        return pat.status();
      Param out = *p;
      addTaints(out.taints, pat->taints);
      for (std::string &v : out.values)
        v = trimPattern(v, pat->text, op == '#', longest);
      return out;
    }
    default:
      break;
    }
    unsupported.taints.push_back(
        hardTaint("the expansion ${" + body + "}", line,
                  absl::StrCat("write the value on line ", line, " literally")));
    return unsupported;
  }

  static std::string trimPattern(const std::string &v, const std::string &pat, bool prefix,
                                 bool longest) {
    size_t n = v.size();
    if (prefix) {
      for (size_t k = 0; k <= n; ++k) {
        size_t len = longest ? n - k : k;
        if (fnmatch(pat.c_str(), v.substr(0, len).c_str(), 0) == 0)
          return v.substr(len);
      }
    } else {
      for (size_t k = 0; k <= n; ++k) {
        size_t start = longest ? k : n - k;
        if (fnmatch(pat.c_str(), v.substr(start).c_str(), 0) == 0)
          return v.substr(0, start);
      }
    }
    return v;
  }

  // One piece of a word as expansion sees it.
  struct Piece {
    std::string text;
    bool quoted;     // not subject to splitting
    bool expansion;  // from $..., when unquoted split on blanks
    bool fieldBreak; // "$@": a new field starts before this piece
    bool noField = false; // "${EMPTY[@]}": makes no field of its own
  };

  // Splits the raw text of a word into pieces, expanding parameters,
  // arithmetic and command substitutions.
  absl::Status pieces(const std::string &w, int line, bool inDouble, std::vector<Piece> &out,
                      Taints &taints, bool assignment = false) {
    size_t i = 0, n = w.size();
    std::string lit;
    auto flush = [&](bool quoted) {
      if (!lit.empty())
        out.push_back({lit, quoted, false, false});
      lit.clear();
    };
    // A tilde at the start of an unquoted word (or after `=`/`:` in an
    // assignment) is $HOME.
    if (!inDouble && !w.empty() && w[0] == '~' && (n == 1 || w[1] == '/')) {
      const Var *home = lookup("HOME");
      if (home && !home->values.empty()) {
        out.push_back({home->values[0], true, false, false});
        i = 1;
      }
    }
    while (i < n) {
      char c = w[i];
      if (c == '\\') {
        if (i + 1 >= n) {
          lit += c;
          ++i;
          continue;
        }
        char d = w[i + 1];
        if (!inDouble || isOneOf(d, "$`\"\\\n")) {
          flush(inDouble);
          if (d != '\n')
            out.push_back({std::string(1, d), true, false, false});
        } else {
          lit += c;
          lit += d;
        }
        i += 2;
      } else if (c == '\'' && !inDouble) {
        flush(false);
        size_t close = std::min(w.find('\'', i + 1), n);
        out.push_back({w.substr(i + 1, close - i - 1), true, false, false});
        i = close + 1;
      } else if (c == '"' && !inDouble) {
        flush(false);
        size_t close = std::min(matchDoubleQuote(w, i), n);
        std::vector<Piece> inner;
        if (absl::Status st = pieces(w.substr(i + 1, close - i - 1), line, true, inner, taints);
            !st.ok())
          return st;
        if (inner.empty())
          out.push_back({"", true, false, false}); // "" is an empty word
        for (Piece &p : inner) {
          p.quoted = true;
          out.push_back(std::move(p));
        }
        i = close + 1;
      } else if (c == '$' && i + 1 < n && w[i + 1] == '\'' && !inDouble) {
        flush(false);
        size_t j = i + 2;
        std::string s;
        while (j < n && w[j] != '\'') {
          if (w[j] == '\\' && j + 1 < n) {
            char e = w[j + 1];
            s += e == 'n' ? '\n' : e == 't' ? '\t' : e;
            j += 2;
          } else {
            s += w[j++];
          }
        }
        out.push_back({s, true, false, false});
        i = j + 1;
      } else if (c == '$' && i + 1 < n && w[i + 1] == '"' && !inDouble) {
        ++i; // $"..." is "..."
      } else if (c == '$' || c == '`') {
        size_t end = i;
        absl::StatusOr<Param> p = dollar(w, end, line);
        if (!p.ok())
          return p.status();
        if (end == i) {
          lit += c;
          ++i;
          continue;
        }
        flush(inDouble);
        addTaints(taints, p->taints);
        if (p->multi && inDouble) {
          for (size_t k = 0; k < p->values.size(); ++k)
            out.push_back({p->values[k], true, true, k > 0});
          if (p->values.empty())
            out.push_back({"", true, true, false, true});
        } else if (p->multi || (p->star && !inDouble)) {
          for (size_t k = 0; k < p->values.size(); ++k)
            out.push_back({p->values[k], false, true, k > 0});
        } else if (p->star) {
          out.push_back({absl::StrJoin(p->values, " "), true, true, false});
        } else {
          out.push_back({p->values.empty() ? "" : p->values[0], inDouble || assignment, true,
                         false});
        }
        i = end;
      } else {
        lit += c;
        ++i;
      }
    }
    flush(inDouble);
    return absl::OkStatus();
  }

  static size_t matchDoubleQuote(const std::string &w, size_t open) {
    size_t i = open + 1;
    while (i < w.size() && w[i] != '"') {
      if (w[i] == '\\')
        ++i;
      else if (w[i] == '$' && i + 1 < w.size() && (w[i + 1] == '(' || w[i + 1] == '{'))
        i = matchClose(w, i + 1) - 1;
      else if (w[i] == '`')
        i = w.find('`', i + 1);
      if (i == std::string::npos)
        return w.size();
      ++i;
    }
    return i;
  }

  // One past the bracket closing the one at `open`, skipping quotes.
  static size_t matchClose(const std::string &w, size_t open) {
    char o = w[open], c = o == '(' ? ')' : '}';
    int depth = 0;
    for (size_t i = open; i < w.size(); ++i) {
      char d = w[i];
      if (d == '\\') {
        ++i;
      } else if (d == '\'' && o == '(') {
        i = w.find('\'', i + 1);
        if (i == std::string::npos)
          return w.size();
      } else if (d == '"') {
        i = matchDoubleQuote(w, i);
      } else if (d == o) {
        ++depth;
      } else if (d == c && --depth == 0) {
        return i + 1;
      }
    }
    return w.size();
  }

  // At w[i] == '$' or '`': the expansion there; i moves past it (unchanged
  // for a literal dollar).
  absl::StatusOr<Param> dollar(const std::string &w, size_t &i, int line) {
    size_t n = w.size();
    Param p;
    if (w[i] == '`') {
      size_t close = w.find('`', i + 1);
      std::string text = w.substr(i, close == std::string::npos ? n - i : close + 1 - i);
      i = close == std::string::npos ? n : close + 1;
      p.values = {text};
      p.taints.push_back(hardTaint("the command substitution " + brief(text), line));
      return p;
    }
    if (i + 1 >= n)
      return p;
    char c = w[i + 1];
    if (c == '(' && i + 2 < n && w[i + 2] == '(') {
      size_t end = matchClose(w, i + 1);
      std::string expr = w.substr(i + 3, end >= i + 5 ? end - i - 5 : 0);
      i = end;
      absl::StatusOr<Str> e = expandString(expr, line, /*removeQuotes=*/true);
      if (!e.ok())
        return e.status();
      p.taints = e->taints;
      absl::StatusOr<std::optional<int64_t>> v = arithmetic(e->text, line, p.taints);
      if (!v.ok())
        return v.status();
      p.values = {*v ? std::to_string(**v) : "$((" + expr + "))"};
      return p;
    }
    if (c == '(') {
      size_t end = matchClose(w, i + 1);
      std::string text = w.substr(i, end - i);
      i = end;
      p.values = {text};
      p.taints.push_back(hardTaint("the command substitution " + brief(text), line));
      return p;
    }
    if (c == '{') {
      size_t end = matchClose(w, i + 1);
      std::string body = w.substr(i + 2, end - i - 3);
      i = end;
      return braced(body, line);
    }
    if (isNameStart(c)) {
      size_t j = i + 1;
      while (j < n && isNameChar(w[j]))
        ++j;
      std::string name = w.substr(i + 1, j - i - 1);
      i = j;
      return param(name, std::nullopt, line);
    }
    if (isDigit(c) || isOneOf(c, "@*#?$!-")) {
      i += 2;
      return param(std::string(1, c), std::nullopt, line);
    }
    return p; // a literal '$'
  }

  // A word with splitting: the fields bash would pass.
  absl::StatusOr<Fields> expandWords(const std::vector<std::string> &words,
                                     const std::vector<int> &lines) {
    Fields out;
    for (size_t k = 0; k < words.size(); ++k) {
      std::vector<Piece> ps;
      if (absl::Status st = pieces(words[k], lines[k], false, ps, out.taints); !st.ok())
        return st;
      std::string cur;
      bool exists = false;
      auto emit = [&] {
        if (exists)
          out.fields.push_back(cur);
        cur.clear();
        exists = false;
      };
      for (const Piece &p : ps) {
        if (p.fieldBreak)
          emit();
        if (p.noField)
          continue;
        if (p.quoted || !p.expansion) {
          cur += p.text;
          exists = true;
          continue;
        }
        for (char ch : p.text) {
          if (ch == ' ' || ch == '\t' || ch == '\n') {
            emit();
          } else {
            cur += ch;
            exists = true;
          }
        }
      }
      emit();
    }
    return out;
  }

  // A word without splitting (assignments, case words, [[ ]] operands).
  absl::StatusOr<Str> expandString(const std::string &w, int line, bool removeQuotes = true) {
    Str out;
    std::vector<Piece> ps;
    if (absl::Status st = pieces(w, line, !removeQuotes, ps, out.taints, true); !st.ok())
      return st;
    for (size_t k = 0; k < ps.size(); ++k)
      out.text += (ps[k].fieldBreak ? " " : "") + ps[k].text;
    return out;
  }

  // A case or [[ == ]] pattern: quoted parts match literally.
  absl::StatusOr<Str> expandPattern(const std::string &w, int line) {
    Str out;
    std::vector<Piece> ps;
    if (absl::Status st = pieces(w, line, false, ps, out.taints, true); !st.ok())
      return st;
    for (const Piece &p : ps) {
      if (p.quoted && !p.expansion) {
        for (char ch : p.text) {
          if (isOneOf(ch, "*?[]\\"))
            out.text += '\\';
          out.text += ch;
        }
      } else {
        out.text += p.text;
      }
    }
    return out;
  }

  //===--------------------------------------------------------------------===//
  // Arithmetic
  //===--------------------------------------------------------------------===//

  // Integer arithmetic as bash does it; nullopt when a value is unknown
  // (the taint says why).
  absl::StatusOr<std::optional<int64_t>> arithmetic(const std::string &expr, int line,
                                                    Taints &taints, int depth = 0) {
    struct P {
      Shell &sh;
      const std::string &s;
      size_t i = 0;
      int line;
      Taints &taints;
      int depth;
      bool unknown = false;
      std::string err;

      void ws() {
        while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i])))
          ++i;
      }
      bool eat(const char *op) {
        ws();
        size_t n = std::strlen(op);
        if (s.compare(i, n, op) != 0)
          return false;
        // Do not read `<` out of `<=`/`<<`, `&` out of `&&`, and so on.
        if (n == 1 && i + 1 < s.size() && isOneOf(op[0], "<>=!&|*") &&
            (s[i + 1] == '=' || s[i + 1] == op[0]) && !(op[0] == '!' && s[i + 1] == '!'))
          return false;
        i += n;
        return true;
      }
      int64_t fail(const std::string &m) {
        if (err.empty())
          err = m;
        return 0;
      }
      int64_t primary() {
        ws();
        if (eat("(")) {
          int64_t v = ternary();
          if (!eat(")"))
            return fail("expected ')'");
          return v;
        }
        if (eat("-"))
          return -unary();
        if (eat("+"))
          return unary();
        if (eat("!"))
          return !unary();
        if (eat("~"))
          return ~unary();
        if (i < s.size() && isDigit(s[i])) {
          size_t j = i;
          while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '#'))
            ++j;
          std::string num = s.substr(i, j - i);
          i = j;
          try {
            size_t used = 0;
            int64_t v;
            if (num.size() > 1 && num[0] == '0' && (num[1] == 'x' || num[1] == 'X'))
              v = std::stoll(num.substr(2), &used, 16), used += 2;
            else if (num.size() > 1 && num[0] == '0')
              v = std::stoll(num, &used, 8);
            else
              v = std::stoll(num, &used, 10);
            if (used != num.size())
              return fail("'" + num + "' is not a number");
            return v;
          } catch (...) {
            return fail("'" + num + "' is not a number");
          }
        }
        if (i < s.size() && isNameStart(s[i])) {
          size_t j = i;
          while (j < s.size() && isNameChar(s[j]))
            ++j;
          std::string name = s.substr(i, j - i);
          i = j;
          ws();
          if (i < s.size() && (s[i] == '=' && (i + 1 >= s.size() || s[i + 1] != '=')))
            return fail("assignment inside $((...))");
          if (s.compare(i, 2, "++") == 0 || s.compare(i, 2, "--") == 0)
            return fail("'++'/'--' inside $((...))");
          absl::StatusOr<Param> p = sh.param(name, std::nullopt, line);
          if (!p.ok())
            return fail(std::string(p.status().message()));
          addTaints(taints, p->taints);
          if (hard(p->taints)) {
            unknown = true;
            return 0;
          }
          std::string v = p->values.empty() ? "" : p->values[0];
          if (v.empty())
            return 0;
          if (depth > 16)
            return fail("variables in $((...)) refer to each other too deeply");
          absl::StatusOr<std::optional<int64_t>> r = sh.arithmetic(v, line, taints, depth + 1);
          if (!r.ok())
            return fail(std::string(r.status().message()));
          if (!*r) {
            unknown = true;
            return 0;
          }
          return **r;
        }
        if (i >= s.size())
          return fail("an operand is missing");
        return fail(std::string("unexpected '") + s[i] + "'");
      }
      int64_t unary() { return primary(); }
      int64_t power() {
        int64_t b = unary();
        if (eat("**")) {
          int64_t e = power();
          if (e < 0)
            return fail("negative exponent");
          int64_t r = 1;
          for (int64_t k = 0; k < e && k < 64; ++k)
            r *= b;
          return r;
        }
        return b;
      }
      int64_t mul() {
        int64_t v = power();
        while (true) {
          bool div = false;
          if (eat("*")) {
            v *= power();
          } else if ((div = eat("/")) || eat("%")) {
            int64_t r = power();
            if (r == 0) {
              if (!unknown)
                return fail("division by zero");
              return 0;
            }
            v = div ? v / r : v % r;
          } else {
            return v;
          }
        }
      }
      int64_t add() {
        int64_t v = mul();
        while (true) {
          if (eat("+"))
            v += mul();
          else if (eat("-"))
            v -= mul();
          else
            return v;
        }
      }
      int64_t shift() {
        int64_t v = add();
        while (true) {
          if (eat("<<"))
            v <<= add();
          else if (eat(">>"))
            v >>= add();
          else
            return v;
        }
      }
      int64_t rel() {
        int64_t v = shift();
        while (true) {
          if (eat("<="))
            v = v <= shift();
          else if (eat(">="))
            v = v >= shift();
          else if (eat("<"))
            v = v < shift();
          else if (eat(">"))
            v = v > shift();
          else
            return v;
        }
      }
      int64_t eq() {
        int64_t v = rel();
        while (true) {
          if (eat("=="))
            v = v == rel();
          else if (eat("!="))
            v = v != rel();
          else
            return v;
        }
      }
      int64_t band() {
        int64_t v = eq();
        while (eat("&"))
          v &= eq();
        return v;
      }
      int64_t bxor() {
        int64_t v = band();
        while (eat("^"))
          v ^= band();
        return v;
      }
      int64_t bor() {
        int64_t v = bxor();
        while (eat("|"))
          v |= bxor();
        return v;
      }
      int64_t land() {
        int64_t v = bor();
        while (eat("&&")) {
          int64_t r = bor();
          v = v && r;
        }
        return v;
      }
      int64_t lor() {
        int64_t v = land();
        while (eat("||")) {
          int64_t r = land();
          v = v || r;
        }
        return v;
      }
      int64_t ternary() {
        int64_t c = lor();
        if (eat("?")) {
          int64_t a = ternary();
          if (!eat(":"))
            return fail("expected ':' in '?:'");
          int64_t b = ternary();
          return c ? a : b;
        }
        return c;
      }
    };
    P p{*this, expr, 0, line, taints, depth};
    int64_t v = p.ternary();
    p.ws();
    if (p.err.empty() && p.i < expr.size())
      p.err = std::string("unexpected '") + expr[p.i] + "'";
    if (!p.err.empty()) {
      if (p.unknown)
        return std::optional<int64_t>();
      taints.push_back(hardTaint("the arithmetic $((" + brief(expr) + ")) (" + p.err + ")",
                                 line, absl::StrCat("fix the expression on line ", line)));
      return std::optional<int64_t>();
    }
    if (p.unknown)
      return std::optional<int64_t>();
    return std::optional<int64_t>(v);
  }

  //===--------------------------------------------------------------------===//
  // Conditions: test, [ ], [[ ]]
  //===--------------------------------------------------------------------===//

  struct CondResult {
    Tri value;
    std::string why; // when unknown
  };

  // args: the operands after expansion; double: [[ ]] (patterns, &&, ||).
  CondResult test(const std::vector<std::string> &a, const std::vector<bool> &isPattern,
                  bool dbl, int line) {
    size_t i = 0;
    std::string why;
    std::function<Tri()> orExpr, andExpr, notExpr, prim;
    auto unknown = [&](const std::string &w) {
      if (why.empty())
        why = w;
      return Tri::Unknown;
    };
    auto isInt = [](const std::string &s, int64_t &v) {
      std::string t = s;
      t.erase(0, t.find_first_not_of(" \t"));
      t.erase(t.find_last_not_of(" \t") + 1);
      if (t.empty())
        return false;
      size_t k = (t[0] == '-' || t[0] == '+') ? 1 : 0;
      if (k >= t.size() || !std::all_of(t.begin() + k, t.end(), isDigit))
        return false;
      v = std::stoll(t);
      return true;
    };
    auto binary = [&](const std::string &l, const std::string &op, const std::string &r,
                      bool rPattern) -> Tri {
      if (op == "=" || op == "==" || op == "!=") {
        bool eq = dbl && rPattern ? fnmatch(r.c_str(), l.c_str(), 0) == 0 : l == r;
        return (eq != (op == "!=")) ? Tri::True : Tri::False;
      }
      if (op == "<")
        return l < r ? Tri::True : Tri::False;
      if (op == ">")
        return l > r ? Tri::True : Tri::False;
      if (op == "=~") {
        regex_t re;
        if (regcomp(&re, r.c_str(), REG_EXTENDED | REG_NOSUB) != 0)
          return unknown("the regular expression '" + r + "'");
        bool m = regexec(&re, l.c_str(), 0, nullptr, 0) == 0;
        regfree(&re);
        return m ? Tri::True : Tri::False;
      }
      int64_t x, y;
      Taints scratch;
      auto num = [&](const std::string &s, int64_t &v) {
        if (isInt(s, v))
          return true;
        if (!dbl)
          return false;
        absl::StatusOr<std::optional<int64_t>> r = arithmetic(s, line, scratch);
        if (!r.ok() || !*r)
          return false;
        v = **r;
        return true;
      };
      if (!num(l, x) || !num(r, y))
        return unknown("'" + l + " " + op + " " + r + "' (an operand is no integer)");
      if (op == "-eq")
        return x == y ? Tri::True : Tri::False;
      if (op == "-ne")
        return x != y ? Tri::True : Tri::False;
      if (op == "-lt")
        return x < y ? Tri::True : Tri::False;
      if (op == "-le")
        return x <= y ? Tri::True : Tri::False;
      if (op == "-gt")
        return x > y ? Tri::True : Tri::False;
      if (op == "-ge")
        return x >= y ? Tri::True : Tri::False;
      return unknown("the test operator " + op);
    };
    auto isBinary = [](const std::string &s) {
      static const std::set<std::string> ops = {"=",   "==",  "!=",  "<",   ">",  "=~", "-eq",
                                                "-ne", "-lt", "-le", "-gt", "-ge", "-nt", "-ot",
                                                "-ef"};
      return ops.count(s) != 0;
    };
    auto isAnd = [&](const std::string &s) { return dbl ? s == "&&" : s == "-a"; };
    auto isOr = [&](const std::string &s) { return dbl ? s == "||" : s == "-o"; };
    prim = [&]() -> Tri {
      if (i >= a.size())
        return unknown("an incomplete test");
      if (a[i] == "(" && (dbl || i + 1 < a.size())) {
        ++i;
        Tri v = orExpr();
        if (i < a.size() && a[i] == ")")
          ++i;
        return v;
      }
      if (i + 2 < a.size() && isBinary(a[i + 1])) {
        std::string l = a[i], op = a[i + 1], r = a[i + 2];
        bool rp = isPattern[i + 2];
        i += 3;
        if (op == "-nt" || op == "-ot" || op == "-ef")
          return unknown("'" + l + " " + op + " " + r +
                         "', which checks files on the machine that runs the script");
        return binary(l, op, r, rp);
      }
      if (a[i].size() == 2 && a[i][0] == '-' && i + 1 < a.size() &&
          !(isAnd(a[i + 1]) || isOr(a[i + 1]) || a[i + 1] == ")") ) {
        std::string op = a[i], x = a[i + 1];
        i += 2;
        if (op == "-z")
          return x.empty() ? Tri::True : Tri::False;
        if (op == "-n")
          return x.empty() ? Tri::False : Tri::True;
        if (op == "-v") {
          const Var *v = lookup(x);
          return v && !v->values.empty() ? Tri::True : Tri::False;
        }
        if (std::strchr("abcdefghkprsuwxGLNOS", op[1]))
          return unknown("'" + op + " " + x +
                         "', which checks a file on the machine that runs the script");
        return unknown("the test operator " + op);
      }
      std::string x = a[i++];
      return x.empty() ? Tri::False : Tri::True;
    };
    notExpr = [&]() -> Tri {
      if (i < a.size() && a[i] == "!" && i + 1 < a.size()) {
        ++i;
        return triNot(notExpr());
      }
      return prim();
    };
    andExpr = [&]() -> Tri {
      Tri v = notExpr();
      while (i < a.size() && isAnd(a[i])) {
        ++i;
        Tri r = notExpr();
        v = (v == Tri::False || r == Tri::False) ? Tri::False
            : (v == Tri::True && r == Tri::True) ? Tri::True
                                                 : Tri::Unknown;
      }
      return v;
    };
    orExpr = [&]() -> Tri {
      Tri v = andExpr();
      while (i < a.size() && isOr(a[i])) {
        ++i;
        Tri r = andExpr();
        v = (v == Tri::True || r == Tri::True)     ? Tri::True
            : (v == Tri::False && r == Tri::False) ? Tri::False
                                                   : Tri::Unknown;
      }
      return v;
    };
    if (a.empty())
      return {Tri::False, ""};
    Tri v = orExpr();
    if (i < a.size())
      return {Tri::Unknown, "the test '" + absl::StrJoin(a, " ") + "'"};
    return {v, why};
  }

  //===--------------------------------------------------------------------===//
  // Commands
  //===--------------------------------------------------------------------===//

  // Runs `n` where it may or may not run: everything it assigns becomes
  // unknown, for the reason given; a training command inside is uncertain.
  absl::Status maybeRun(const Node &n, const Taint &why, const std::string &uncertainWhy) {
    std::map<std::string, Var> before = vars_;
    std::vector<std::string> posBefore = positional_;
    std::string savedUncertain = uncertain_;
    if (uncertain_.empty())
      uncertain_ = uncertainWhy;
    ++uncertainDepth_;
    ControlFlow cf;
    absl::StatusOr<Tri> st = exec(n, cf);
    --uncertainDepth_;
    uncertain_ = savedUncertain;
    if (!st.ok())
      return st.status();
    std::map<std::string, Var> after = std::move(vars_);
    vars_ = std::move(before);
    // (positional_ is restored below, tainted when it changed)
    for (auto &[name, v] : after) {
      auto it = vars_.find(name);
      if (it == vars_.end() || it->second.values != v.values || it->second.array != v.array ||
          v.taints.size() != it->second.taints.size())
        taintVar(name, why);
    }
    for (auto &[name, v] : vars_)
      if (!after.count(name))
        taintVar(name, why);
    if (positional_ != posBefore) {
      positional_ = posBefore;
      addTaints(positionalTaints_, {why});
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Tri> exec(const Node &n, ControlFlow &cf) {
    if (cf.exited || cf.breaks || cf.continues)
      return Tri::Unknown;
    switch (n.kind) {
    case Node::Simple:
      return withNegate(n, simple(n, cf));
    case Node::List: {
      Tri last = Tri::True;
      for (size_t k = 0; k < n.kids.size(); ++k) {
        if (k > 0 && k - 1 < n.ops.size()) {
          T op = n.ops[k - 1];
          if (op == T::AndAnd || op == T::OrOr) {
            Tri need = op == T::AndAnd ? Tri::True : Tri::False;
            if (last == Tri::Unknown) {
              // Runs or not depending on a command mtc does not run.
              Taint why = hardTaint(absl::StrCat("the command before '",
                                                 op == T::AndAnd ? "&&" : "||", "' on line ",
                                                 n.kids[k - 1]->line,
                                                 ", whose outcome mtc cannot know"),
                                    n.kids[k]->line);
              if (absl::Status st = maybeRun(*n.kids[k], why,
                                             absl::StrCat("line ", n.kids[k - 1]->line,
                                                          " decides whether it runs"));
                  !st.ok())
                return st;
              last = Tri::Unknown;
              continue;
            }
            if (last != need)
              continue;
          }
        }
        absl::StatusOr<Tri> r = exec(*n.kids[k], cf);
        if (!r.ok())
          return r;
        last = *r;
        if (cf.exited || cf.breaks || cf.continues)
          break;
      }
      return withNegate(n, last);
    }
    case Node::Pipeline: {
      // Each part runs in a subshell: its assignments do not stay.
      for (const NodeP &k : n.kids) {
        std::map<std::string, Var> saved = vars_;
        std::vector<std::string> pos = positional_;
        ControlFlow sub;
        absl::StatusOr<Tri> r = exec(*k, sub);
        vars_ = std::move(saved);
        positional_ = std::move(pos);
        if (!r.ok())
          return r;
      }
      return Tri::Unknown;
    }
    case Node::Group: {
      if (!n.subshell)
        return withNegate(n, exec(*n.kids[0], cf));
      std::map<std::string, Var> saved = vars_;
      std::vector<std::string> pos = positional_;
      ControlFlow sub;
      absl::StatusOr<Tri> r = exec(*n.kids[0], sub);
      vars_ = std::move(saved);
      positional_ = std::move(pos);
      return withNegate(n, r);
    }
    case Node::If: {
      size_t k = 0;
      for (; k + 1 < n.kids.size(); k += 2) {
        absl::StatusOr<Tri> c = condition(*n.kids[k], cf);
        if (!c.ok())
          return c;
        if (*c == Tri::True)
          return exec(*n.kids[k + 1], cf);
        if (*c == Tri::Unknown) {
          Taint why = hardTaint(absl::StrCat("the if on line ", n.kids[k]->line, " (", lastWhy_,
                                             "), which assigns it"),
                                n.kids[k]->line,
                                absl::StrCat("mtc runs nothing: edit line ", n.kids[k]->line,
                                             " so its condition depends on known values, or "
                                             "set the variables it tests in the environment"));
          std::string uncertainWhy =
              absl::StrCat("the if on line ", n.kids[k]->line, " decides whether it runs (",
                           lastWhy_, ")");
          // Every branch from here on may run.
          for (size_t j = k + 1; j < n.kids.size(); ++j) {
            bool isBody = j % 2 == 1 || (n.hasElse && j + 1 == n.kids.size());
            if (!isBody)
              continue;
            if (absl::Status st = maybeRun(*n.kids[j], why, uncertainWhy); !st.ok())
              return st;
          }
          return Tri::Unknown;
        }
      }
      if (n.hasElse)
        return exec(*n.kids.back(), cf);
      return Tri::True;
    }
    case Node::While: {
      for (int iter = 0;; ++iter) {
        absl::StatusOr<Tri> c = condition(*n.kids[0], cf);
        if (!c.ok())
          return c;
        Tri go = n.negate ? triNot(*c) : *c;
        if (go == Tri::False)
          return Tri::True;
        if (go == Tri::Unknown || iter >= kMaxIterations) {
          std::string why =
              go == Tri::Unknown
                  ? lastWhy_
                  : absl::StrCat("it runs more than ", kMaxIterations, " times");
          Taint t = hardTaint(absl::StrCat("the loop on line ", n.line, " (", why,
                                           "), which assigns it"),
                              n.line,
                              absl::StrCat("mtc runs nothing: edit the loop on line ", n.line,
                                           " or set the variables it assigns in the script"));
          if (absl::Status st = maybeRun(*n.kids[1], t,
                                         absl::StrCat("it is in the loop on line ", n.line,
                                                      " (", why, ")"));
              !st.ok())
            return st;
          return Tri::Unknown;
        }
        absl::StatusOr<Tri> r = exec(*n.kids[1], cf);
        if (!r.ok())
          return r;
        if (cf.exited)
          return Tri::Unknown;
        if (cf.breaks) {
          --cf.breaks;
          return Tri::True;
        }
        if (cf.continues)
          --cf.continues;
      }
    }
    case Node::For: {
      Taint t = hardTaint(absl::StrCat("the loop on line ", n.line, ", which assigns it"), n.line,
                          absl::StrCat("mtc runs nothing: edit the loop on line ", n.line));
      if (n.cStyle)
        return maybeRunLoop(n, t, "it is in a for (( )) loop");
      std::vector<std::string> items;
      if (n.hasElse) {
        absl::StatusOr<Fields> f = expandWords(n.words, n.wordLines);
        if (!f.ok())
          return f.status();
        if (hard(f->taints)) {
          taintVar(n.name, f->taints[0]);
          return maybeRunLoop(n, t, "its word list is unknown");
        }
        items = f->fields;
      } else {
        items = positional_;
      }
      for (const std::string &item : items) {
        setVar(n.name, {item}, false, {});
        absl::StatusOr<Tri> r = exec(*n.kids[0], cf);
        if (!r.ok())
          return r;
        if (cf.exited)
          return Tri::Unknown;
        if (cf.breaks) {
          --cf.breaks;
          break;
        }
        if (cf.continues)
          --cf.continues;
      }
      return Tri::True;
    }
    case Node::Case: {
      absl::StatusOr<Str> w = expandString(n.text, n.line);
      if (!w.ok())
        return w.status();
      if (hard(w->taints)) {
        Taint t = hardTaint(absl::StrCat("the case on line ", n.line, ", which assigns it"),
                            n.line, w->taints[0].fix);
        for (const Node::Arm &arm : n.arms)
          if (absl::Status st = maybeRun(*arm.body, t,
                                         absl::StrCat("the case on line ", n.line,
                                                      " decides whether it runs"));
              !st.ok())
            return st;
        return Tri::Unknown;
      }
      for (const Node::Arm &arm : n.arms)
        for (const std::string &pat : arm.patterns) {
          absl::StatusOr<Str> p = expandPattern(pat, n.line);
          if (!p.ok())
            return p.status();
          if (fnmatch(p->text.c_str(), w->text.c_str(), 0) == 0)
            return exec(*arm.body, cf);
        }
      return Tri::True;
    }
    case Node::FuncDef:
      functions_[n.name] = &n;
      return Tri::True;
    case Node::Arith: {
      absl::StatusOr<Str> e = expandString(n.text, n.line);
      if (!e.ok())
        return e.status();
      Taints ts = e->taints;
      absl::StatusOr<std::optional<int64_t>> v = arithmetic(e->text, n.line, ts);
      if (!v.ok())
        return v.status();
      if (!*v) {
        lastWhy_ = "((" + brief(n.text) + ")) has an unknown value";
        return withNegate(n, Tri::Unknown);
      }
      return withNegate(n, **v != 0 ? Tri::True : Tri::False);
    }
    }
    return Tri::Unknown;
  }

  absl::StatusOr<Tri> maybeRunLoop(const Node &n, const Taint &t, const std::string &why) {
    if (absl::Status st = maybeRun(*n.kids[0], t,
                                   absl::StrCat("it is in the loop on line ", n.line, " (", why,
                                                ")"));
        !st.ok())
      return st;
    return Tri::Unknown;
  }

  static absl::StatusOr<Tri> withNegate(const Node &n, absl::StatusOr<Tri> t) {
    if (!t.ok() || !n.negate)
      return t;
    return triNot(*t);
  }

  // A condition list; lastWhy_ says why when the result is unknown.
  absl::StatusOr<Tri> condition(const Node &n, ControlFlow &cf) {
    lastWhy_ = "its condition runs a command";
    return exec(n, cf);
  }

  static constexpr int kMaxIterations = 10000;

  bool isBuiltinNoop(const std::string &c) {
    static const std::set<std::string> noop = {
        "echo",  "printf", "mkdir", "rm",    "cp",      "mv",     "ln",    "touch",  "chmod",
        "trap",  "ulimit", "umask", "wait",  "sleep",   "hash",   "shopt", "alias",  "unalias",
        "nvidia-smi", "date",  "ls",  "cat",  "tee",  "env",  "hostname", "nproc", "pip"};
    return noop.count(c) != 0;
  }

  absl::StatusOr<Tri> simple(const Node &n, ControlFlow &cf) {
    ++simpleCommands_;
    int line = n.line;
    // Expand the words (the array placeholders of `declare -a X=(...)` stay).
    std::vector<std::string> words;
    std::vector<int> lines;
    std::vector<size_t> arrayAt;
    for (size_t k = 0; k < n.words.size(); ++k) {
      if (!n.words[k].empty() && n.words[k][0] == '\x01') {
        arrayAt.push_back(std::stoul(n.words[k].substr(1)));
        continue;
      }
      words.push_back(n.words[k]);
      lines.push_back(n.wordLines[k]);
    }
    if (words.empty()) {
      for (const Assign &a : n.assigns)
        if (absl::Status st = assign(a); !st.ok())
          return st;
      return Tri::True;
    }
    // Declarations take NAME=value words as assignments: not split.
    static const std::set<std::string> declarations = {"export", "declare", "typeset",
                                                       "readonly", "local"};
    if (declarations.count(words[0]))
      return declaration(n, words, lines, arrayAt);
    absl::StatusOr<Fields> f = expandWords(words, lines);
    if (!f.ok())
      return f.status();
    if (f->fields.empty()) {
      for (const Assign &a : n.assigns)
        if (absl::Status st = assign(a); !st.ok())
          return st;
      return Tri::True;
    }
    const std::vector<std::string> &w = f->fields;
    const std::string &cmd = w[0];


    auto allTainted = [&](const std::string &what, const std::string &fix) {
      Taint t = hardTaint(what, line, fix);
      for (auto &[name, v] : vars_)
        taintVar(name, t);
      sourcedAt_ = t;
      addTaints(positionalTaints_, {t});
    };
    if (cmd == ":" || cmd == "true")
      return Tri::True;
    if (cmd == "false")
      return Tri::False;
    if (cmd == "[" || cmd == "test" || cmd == "[[") {
      std::vector<std::string> args(w.begin() + 1, w.end());
      std::vector<bool> pattern(args.size(), false);
      bool dbl = cmd == "[[";
      if (cmd == "[") {
        if (args.empty() || args.back() != "]")
          return error(line, "'[' without its closing ']'");
        args.pop_back();
        pattern.pop_back();
      }
      if (dbl) {
        // [[ ]] does not split words, and the right of == is a pattern.
        args.clear();
        pattern.clear();
        Taints ts;
        for (size_t k = 1; k < words.size(); ++k) {
          if (words[k] == "]]")
            break;
          bool rhs = !args.empty() && (args.back() == "==" || args.back() == "=" ||
                                       args.back() == "!=");
          absl::StatusOr<Str> s = rhs ? expandPattern(words[k], lines[k])
                                      : expandString(words[k], lines[k]);
          if (!s.ok())
            return s.status();
          addTaints(ts, s->taints);
          args.push_back(s->text);
          pattern.push_back(rhs);
        }
        if (hard(ts)) {
          lastWhy_ = absl::StrCat("it tests ", ts[0].what);
          return Tri::Unknown;
        }
      } else if (hard(f->taints)) {
        lastWhy_ = absl::StrCat("it tests ", f->taints[0].what);
        return Tri::Unknown;
      }
      CondResult r = test(args, pattern, dbl, line);
      if (r.value == Tri::Unknown)
        lastWhy_ = r.why;
      return r.value;
    }
    if (cmd == "shift") {
      size_t k = 1;
      if (w.size() > 1) {
        int64_t v = 0;
        if (!absl::SimpleAtoi(w[1], &v) || v < 0)
          return error(line, "shift " + w[1] + ": not a count");
        k = static_cast<size_t>(v);
      }
      if (k > positional_.size())
        return Tri::False;
      positional_.erase(positional_.begin(), positional_.begin() + static_cast<long>(k));
      return Tri::True;
    }
    if (cmd == "set") {
      for (size_t k = 1; k < w.size(); ++k)
        if (w[k] == "--") {
          positional_.assign(w.begin() + static_cast<long>(k) + 1, w.end());
          break;
        }
      return Tri::True;
    }
    if (cmd == "unset") {
      bool functions = false;
      for (size_t k = 1; k < w.size(); ++k) {
        if (w[k] == "-f") {
          functions = true;
        } else if (w[k] == "-v") {
          functions = false;
        } else if (functions) {
          functions_.erase(w[k]);
        } else {
          vars_.erase(w[k]);
        }
      }
      return Tri::True;
    }
    if (cmd == "exit" || cmd == "return" || cmd == "exec" || cmd == "logout") {
      if (cmd == "exec" && w.size() > 1)
        return Tri::Unknown;
      cf.exited = true;
      cf.exitLine = line;
      return Tri::Unknown;
    }
    if (cmd == "break" || cmd == "continue") {
      int64_t levels = 1;
      if (w.size() > 1 && (!absl::SimpleAtoi(w[1], &levels) || levels < 1))
        levels = 1;
      (cmd == "break" ? cf.breaks : cf.continues) = static_cast<int>(levels);
      return Tri::True;
    }
    if (cmd == "source" || cmd == ".") {
      allTainted(absl::StrCat("`", brief(absl::StrJoin(w, " ")), "` (mtc reads no other files)"),
                 absl::StrCat("mtc runs nothing: copy the assignments the command needs into the "
                              "script in place of line ",
                              line));
      return Tri::Unknown;
    }
    if (cmd == "eval") {
      allTainted(absl::StrCat("`", brief(absl::StrJoin(w, " ")), "`"),
                 absl::StrCat("mtc runs nothing: write what line ", line,
                              " evaluates into the script"));
      return Tri::Unknown;
    }
    if (cmd == "read" || cmd == "mapfile" || cmd == "readarray" || cmd == "getopts" ||
        (cmd == "printf" && w.size() > 2 && w[1] == "-v")) {
      Taint t = hardTaint(absl::StrCat("`", brief(absl::StrJoin(w, " ")), "`"), line,
                          absl::StrCat("mtc runs nothing: assign the value on line ", line,
                                       " literally"));
      std::vector<std::string> names;
      if (cmd == "printf") {
        names.push_back(w[2]);
      } else if (cmd == "getopts") {
        if (w.size() > 2)
          names.push_back(w[2]);
        names.push_back("OPTARG");
        names.push_back("OPTIND");
      } else {
        for (size_t k = 1; k < w.size(); ++k)
          if (isName(w[k]))
            names.push_back(w[k]);
        if (names.empty())
          names.push_back(cmd == "read" ? "REPLY" : "MAPFILE");
      }
      for (const std::string &name : names)
        taintVar(name, t);
      return Tri::Unknown;
    }
    if (cmd == "cd" || cmd == "pushd" || cmd == "popd") {
      Taint t = hardTaint(absl::StrCat("`", brief(absl::StrJoin(w, " ")), "`"), line,
                          "mtc runs nothing: use an absolute path instead of $PWD");
      if (cmd == "cd" && w.size() == 2 && startsWith(w[1], "/") && !hard(f->taints)) {
        if (const Var *pwd = lookup("PWD"))
          setVar("OLDPWD", pwd->values, false, pwd->taints);
        setVar("PWD", {w[1]}, false, {});
      } else {
        taintVar("PWD", t);
        taintVar("OLDPWD", t);
      }
      return Tri::Unknown;
    }
    if (cmd == "let") {
      Taint t = hardTaint("`" + brief(absl::StrJoin(w, " ")) + "`", line,
                          absl::StrCat("write the value on line ", line, " with $((...))"));
      for (size_t k = 1; k < w.size(); ++k) {
        size_t j = 0;
        while (j < w[k].size() && isNameChar(w[k][j]))
          ++j;
        if (j > 0)
          taintVar(w[k].substr(0, j), t);
      }
      return Tri::Unknown;
    }
    if (auto fn = functions_.find(cmd); fn != functions_.end()) {
      // mtc does not follow functions: what they may assign is unknown.
      allTainted(absl::StrCat("the function ", cmd, " called on line ", line),
                 absl::StrCat("mtc does not follow functions: move what the command needs "
                              "out of ",
                              cmd, " (defined on line ", fn->second->line, ")"));
      if (fn->second->funcText.find(".py") != std::string::npos)
        pyCalls_.push_back({cmd, line});
      return Tri::Unknown;
    }
    if (isBuiltinNoop(cmd))
      return cmd == "echo" || cmd == "printf" ? Tri::True : Tri::Unknown;
    // A command that runs a Python script: maybe the training command.
    for (const std::string &x : w)
      if (endsWith(x, ".py")) {
        Candidate c{w, f->taints, line, uncertain_, false};
        for (const std::string &y : w)
          if (endsWith(y, kScript))
            c.pretrainGpt = true;
        candidates_.push_back(std::move(c));
        return Tri::Unknown;
      }
    // Flags alone, or a command mtc does not know: an argument file's command.
    flagCommands_.push_back({w, f->taints, line, uncertain_, false});
    return Tri::Unknown;
  }

  absl::Status error(int line, const std::string &what) const {
    return absl::InvalidArgumentError(absl::StrCat(opts_.source, ":", line, ": ", what));
  }

  // export / declare / typeset / readonly / local.
  absl::StatusOr<Tri> declaration(const Node &n, const std::vector<std::string> &words,
                                  const std::vector<int> &lines,
                                  const std::vector<size_t> &arrayAt) {
    bool exportIt = words[0] == "export";
    bool assoc = false;
    for (size_t k = 1; k < words.size(); ++k) {
      absl::StatusOr<Str> s = expandString(words[k], lines[k]);
      if (!s.ok())
        return s.status();
      const std::string &a = s->text;
      if (startsWith(a, "-")) {
        if (a.find('x') != std::string::npos)
          exportIt = true;
        if (a.find('A') != std::string::npos)
          assoc = true;
        if (a.find('f') != std::string::npos || a == "-p")
          return Tri::True;
        continue;
      }
      size_t eq = a.find('=');
      std::string name = a.substr(0, eq);
      bool append = false;
      if (!name.empty() && name.back() == '+') {
        append = true;
        name.pop_back();
      }
      if (!isName(name))
        continue;
      if (assoc) {
        taintVar(name, hardTaint("the associative array " + name, lines[k],
                                 absl::StrCat("use plain variables on line ", lines[k])));
        continue;
      }
      if (eq != std::string::npos) {
        std::string value = a.substr(eq + 1);
        Taints taints = s->taints;
        const Var *old = lookup(name);
        bool exported = old && old->exported;
        if (append && old && !old->values.empty()) {
          value = old->values[0] + value;
          Taints t = old->taints;
          addTaints(t, taints);
          taints = t;
        }
        setVar(name, {value}, false, std::move(taints));
        vars_[name].exported = exported;
      }
      if (exportIt && vars_.count(name))
        vars_[name].exported = true;
    }
    for (size_t idx : arrayAt)
      if (absl::Status st = assign(n.assigns[idx]); !st.ok())
        return st;
    return Tri::True;
  }

  absl::Status assign(const Assign &a) {
    if (a.array) {
      Fields all;
      for (const std::string &e : a.elements) {
        // [k]=value elements: give up on sparse arrays, they are rare here.
        if (!e.empty() && e[0] == '[' && e.find("]=") != std::string::npos) {
          taintVar(a.name, hardTaint("the indexed array element " + e, a.line,
                                     absl::StrCat("list the elements on line ", a.line,
                                                  " in order")));
          return absl::OkStatus();
        }
      }
      absl::StatusOr<Fields> f =
          expandWords(a.elements, std::vector<int>(a.elements.size(), a.line));
      if (!f.ok())
        return f.status();
      std::vector<std::string> values = f->fields;
      Taints taints = f->taints;
      if (a.append) {
        if (const Var *old = lookup(a.name)) {
          values.insert(values.begin(), old->values.begin(), old->values.end());
          Taints t = old->taints;
          addTaints(t, taints);
          taints = t;
        }
      }
      setVar(a.name, std::move(values), true, std::move(taints));
      return absl::OkStatus();
    }
    absl::StatusOr<Str> v = expandString(a.value, a.line);
    if (!v.ok())
      return v.status();
    if (a.index) {
      absl::StatusOr<Str> ix = expandString(*a.index, a.line);
      if (!ix.ok())
        return ix.status();
      Taints ts = ix->taints;
      absl::StatusOr<std::optional<int64_t>> k = arithmetic(ix->text, a.line, ts);
      if (!k.ok())
        return k.status();
      if (!*k || **k < 0) {
        taintVar(a.name, hardTaint("the array index [" + *a.index + "]", a.line));
        return absl::OkStatus();
      }
      Var &var = vars_[a.name];
      size_t i = static_cast<size_t>(**k);
      if (var.values.size() <= i)
        var.values.resize(i + 1);
      var.values[i] = a.append ? var.values[i] + v->text : v->text;
      var.array = true;
      addTaints(var.taints, v->taints);
      for (Taint &t : var.taints)
        if (t.via.empty())
          t.via = a.name;
      return absl::OkStatus();
    }
    if (a.append) {
      if (const Var *old = lookup(a.name)) {
        std::vector<std::string> values = old->values;
        if (values.empty())
          values.push_back("");
        values[0] += v->text;
        Taints t = old->taints;
        addTaints(t, v->taints);
        setVar(a.name, std::move(values), old->array, std::move(t));
        return absl::OkStatus();
      }
    }
    bool array = false;
    if (const Var *old = lookup(a.name))
      array = old->array; // X=v on an array sets element 0
    if (array) {
      Var &var = vars_[a.name];
      if (var.values.empty())
        var.values.push_back("");
      var.values[0] = v->text;
      addTaints(var.taints, v->taints);
      return absl::OkStatus();
    }
    setVar(a.name, {v->text}, false, v->taints);
    return absl::OkStatus();
  }

  const ShellOptions &opts_;
  std::map<std::string, Var> vars_;
  std::vector<std::string> positional_;
  Taints positionalTaints_;
  std::map<std::string, const Node *> functions_;
  std::optional<Taint> sourcedAt_; // after `source`: an unset variable may be set
  std::vector<Candidate> candidates_, flagCommands_;
  std::vector<std::pair<std::string, int>> pyCalls_;
  std::string uncertain_;
  int uncertainDepth_ = 0;
  std::string lastWhy_;
  int exitLine_ = 0;
  int simpleCommands_ = 0;
};

} // namespace

namespace megatron {

bool isAssignment(const std::string &w) {
  if (w.empty() || !isNameStart(w[0]))
    return false;
  size_t i = 1;
  while (i < w.size() && isNameChar(w[i]))
    ++i;
  if (i < w.size() && w[i] == '[') {
    size_t close = w.find(']', i);
    if (close == std::string::npos)
      return false;
    i = close + 1;
  }
  if (i < w.size() && w[i] == '+')
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
  // A single quote reads better inside double quotes, when nothing there expands.
  if (w.find('\'') != std::string::npos && w.find_first_of("\"$`\\!\n") == std::string::npos)
    return "\"" + w + "\"";
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

absl::StatusOr<TrainingCommand> evaluateLaunchScript(const std::string &text,
                                                     const ShellOptions &opts) {
  absl::StatusOr<std::vector<Token>> toks = Lexer(text, opts.source).run();
  if (!toks.ok())
    return toks.status();
  Parser parser(std::move(*toks), opts.source, opts.flagLines);
  absl::StatusOr<NodeP> program = parser.program();
  if (!program.ok())
    return program.status();
  Shell sh(opts);
  if (absl::Status st = sh.run(**program); !st.ok())
    return st;

  std::vector<Candidate> &all = sh.candidates();
  std::vector<const Candidate *> chosen;
  for (const Candidate &c : all)
    if (c.pretrainGpt)
      chosen.push_back(&c);
  std::string what = kScript;
  if (chosen.empty()) {
    for (const Candidate &c : all)
      chosen.push_back(&c);
    what = "a Python script";
  }
  if (chosen.empty() && opts.flagLines && sh.flagCommands().size() == 1) {
    chosen.push_back(&sh.flagCommands()[0]);
    what = "flags";
  }
  if (chosen.empty()) {
    std::string msg;
    if (sh.simpleCommands() == 0)
      return absl::InvalidArgumentError(
          absl::StrCat(opts.source, " is empty; give the pretrain_gpt.py command or its flags"));
    msg = absl::StrCat(opts.source, " runs no pretrain_gpt.py (nor another *.py script)");
    if (!sh.pyFunctionCalls().empty())
      absl::StrAppend(&msg, "; the function ", sh.pyFunctionCalls()[0].first, " called on line ",
                      sh.pyFunctionCalls()[0].second,
                      " may, but mtc does not follow functions: run the training command at "
                      "the top level of the script");
    else if (sh.exitLine() > 0)
      absl::StrAppend(&msg, " before it exits on line ", sh.exitLine(),
                      opts.scriptArgs ? "; check the script's arguments (mtc's own options go "
                                        "before --script) and the environment"
                                      : "; check the environment");
    else
      absl::StrAppend(&msg, "; give the script that runs the training command");
    return absl::InvalidArgumentError(msg);
  }
  if (chosen.size() > 1) {
    std::vector<std::string> lines;
    for (const Candidate *c : chosen)
      if (std::find(lines.begin(), lines.end(), std::to_string(c->line)) == lines.end())
        lines.push_back(std::to_string(c->line));
    return absl::InvalidArgumentError(absl::StrCat(
        opts.source, " runs ", what, " ", chosen.size(), " times (",
        lines.size() == 1 ? "line " : "lines ", absl::StrJoin(lines, ", "),
        "); keep the training command you want translated"));
  }
  const Candidate &c = *chosen[0];
  if (!c.uncertain.empty())
    return absl::InvalidArgumentError(absl::StrCat(
        opts.source, ":", c.line, ": mtc cannot tell whether the training command runs: ",
        c.uncertain, "; edit the script so it runs unconditionally"));
  if (!c.taints.empty())
    return absl::InvalidArgumentError(sh.explain(c));
  TrainingCommand out;
  out.words = c.words;
  out.line = c.line;
  return out;
}

absl::StatusOr<std::vector<std::string>> splitCommandLine(const std::string &text) {
  ShellOptions opts;
  opts.flagLines = true;
  absl::StatusOr<TrainingCommand> c = evaluateLaunchScript(text, opts);
  if (!c.ok())
    return c.status();
  return c->words;
}

} // namespace mt::spec
