// Exact scorers (see answer_check.h). ASCII case folding only: answers are ASCII (digits,
// generated keys and words), outputs may hold anything.
#include "eval/longctx/answer_check.h"

#include <cctype>

namespace snap::eval {

const char* score_kind_name(ScoreKind k) {
  switch (k) {
    case ScoreKind::contains: return "contains";
    case ScoreKind::exact: return "exact";
    case ScoreKind::numeric: return "numeric";
    case ScoreKind::all: return "all";
  }
  return "?";
}

Result<ScoreKind> score_kind_from_name(const std::string& name) {
  for (ScoreKind k : {ScoreKind::contains, ScoreKind::exact, ScoreKind::numeric, ScoreKind::all}) {
    if (name == score_kind_name(k)) return k;
  }
  return invalid_argument("unknown scorer '" + name + "' (expected contains, exact, numeric, all)");
}

namespace {

char lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }
bool is_alnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string lowered(const std::string& s) {
  std::string out = s;
  for (char& c : out) c = lower(c);
  return out;
}

// "  The answer is 42.  " -> "The answer is 42"
std::string trimmed(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && (std::isspace(static_cast<unsigned char>(s[e - 1])) || s[e - 1] == '.' || s[e - 1] == '!' ||
                   s[e - 1] == ',' || s[e - 1] == ';')) {
    --e;
  }
  return s.substr(b, e - b);
}

}  // namespace

bool contains_whole(const std::string& text, const std::string& answer) {
  if (answer.empty()) return false;
  const std::string t = lowered(text), a = lowered(answer);
  for (size_t pos = t.find(a); pos != std::string::npos; pos = t.find(a, pos + 1)) {
    const bool left_ok = pos == 0 || !is_alnum(t[pos - 1]);
    const size_t end = pos + a.size();
    const bool right_ok = end >= t.size() || !is_alnum(t[end]);
    if (left_ok && right_ok) return true;
  }
  return false;
}

AnswerScore score_answer(ScoreKind kind, const std::string& output, const std::vector<std::string>& expected) {
  AnswerScore s;
  if (expected.empty()) return s;
  switch (kind) {
    case ScoreKind::contains:
      for (const auto& e : expected) s.correct = s.correct || contains_whole(output, e);
      break;
    case ScoreKind::exact: {
      const std::string o = lowered(trimmed(output));
      for (const auto& e : expected) s.correct = s.correct || o == lowered(trimmed(e));
      break;
    }
    case ScoreKind::numeric: {
      size_t i = 0;
      while (i < output.size() && !is_digit(output[i])) ++i;
      size_t j = i;
      while (j < output.size() && is_digit(output[j])) ++j;
      const std::string first = output.substr(i, j - i);
      for (const auto& e : expected) s.correct = s.correct || (!first.empty() && first == e);
      break;
    }
    case ScoreKind::all: {
      size_t found = 0;
      for (const auto& e : expected) found += contains_whole(output, e) ? 1 : 0;
      s.partial = static_cast<double>(found) / static_cast<double>(expected.size());
      s.correct = found == expected.size();
      return s;
    }
  }
  s.partial = s.correct ? 1.0 : 0.0;
  return s;
}

}  // namespace snap::eval
