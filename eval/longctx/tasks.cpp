// Task generators (see tasks.h). Every random choice comes from one EvalRng seeded from the
// spec; the haystack length is found by bisection on the real token count of the whole
// prompt, and needles sit at unit boundaries chosen by the units' token counts.
#include "eval/longctx/tasks.h"

#include <algorithm>
#include <set>

#include "common/sha256.h"
#include "coordinator/engine/prompt.h"
#include "coordinator/tokenizer/chat_template.h"

namespace snap::eval {

// --- names --------------------------------------------------------------------------

namespace {
constexpr TaskKind k_all_tasks[] = {TaskKind::niah_single, TaskKind::passkey, TaskKind::niah_multikey,
                                    TaskKind::niah_multivalue, TaskKind::vt, TaskKind::cwe};
}  // namespace

const char* task_name(TaskKind k) {
  switch (k) {
    case TaskKind::niah_single: return "niah_single";
    case TaskKind::passkey: return "passkey";
    case TaskKind::niah_multikey: return "niah_multikey";
    case TaskKind::niah_multivalue: return "niah_multivalue";
    case TaskKind::vt: return "vt";
    case TaskKind::cwe: return "cwe";
  }
  return "?";
}

Result<TaskKind> task_from_name(const std::string& name) {
  for (TaskKind k : k_all_tasks) {
    if (name == task_name(k)) return k;
  }
  return invalid_argument("unknown task '" + name +
                          "' (expected niah_single, passkey, niah_multikey, niah_multivalue, vt, cwe)");
}

bool task_uses_depth(TaskKind k) { return k != TaskKind::vt && k != TaskKind::cwe; }
bool task_uses_haystack(TaskKind k) { return k != TaskKind::cwe; }

int64_t task_default_max_tokens(TaskKind k) {
  switch (k) {
    case TaskKind::niah_single:
    case TaskKind::passkey:
    case TaskKind::niah_multikey: return 32;
    case TaskKind::niah_multivalue:
    case TaskKind::vt:
    case TaskKind::cwe: return 64;
  }
  return 32;
}

const char* placement_name(Placement p) { return p == Placement::after ? "after" : "context_only"; }

Result<Placement> placement_from_name(const std::string& name) {
  if (name == "after") return Placement::after;
  if (name == "context_only") return Placement::context_only;
  return invalid_argument("unknown question placement '" + name + "' (expected after or context_only)");
}

// --- prompt and tokens ----------------------------------------------------------------

std::string task_prompt_text(const std::string& context, const std::string& question, bool chat) {
  std::string t = context + "\n\n" + question;
  if (!chat) t += "\nAnswer:";
  return t;
}

namespace {

// The number of leading prompt ids that the prompt's first `chars` characters produce: the
// longest common prefix of the prompt's ids with the ids of that text alone (chat: the
// template rendered with a marker at the cut, then cut there).
Result<int64_t> prompt_tokens_before(const Tokenizer& tok, bool chat, const EvalTask& task, size_t chars) {
  std::vector<int32_t> prefix;
  const std::string head = task.prompt_text.substr(0, chars);
  if (chat) {
    SNAP_ASSIGN_OR_RETURN(std::string t, apply_chat_template(tok, {{"user", head + "\x01"}}, true));
    t = t.substr(0, t.find('\x01'));
    prefix = tok.encode(t, false);
    if (tok.add_bos() && (prefix.empty() || prefix.front() != tok.bos_id())) prefix.insert(prefix.begin(), tok.bos_id());
  } else {
    prefix = prompt_ids_for_text(tok, head);
  }
  const auto& full = task.prompt_ids;
  int64_t c = 0;
  while (c < static_cast<int64_t>(std::min(prefix.size(), full.size())) && prefix[c] == full[c]) ++c;
  return c;
}

}  // namespace

Status tokenize_task(const Tokenizer& tok, bool chat, EvalTask* task) {
  task->prompt_text = task_prompt_text(task->context, task->question, chat);
  task->prompt_sha256 = sha256_hex(task->prompt_text);
  if (chat) {
    SNAP_ASSIGN_OR_RETURN(task->prompt_ids, prompt_ids_for_chat(tok, {{"user", task->prompt_text}}));
  } else {
    task->prompt_ids = prompt_ids_for_text(tok, task->prompt_text);
  }
  SNAP_ASSIGN_OR_RETURN(int64_t c, prompt_tokens_before(tok, chat, *task, task->context.size() + 2));
  task->context_tokens = std::min<int64_t>(c, static_cast<int64_t>(task->prompt_ids.size()) - 1);
  return {};
}

Status locate_needle_tokens(const Tokenizer& tok, bool chat, EvalTask* task) {
  task->needle_tokens.clear();
  size_t from = 0;
  for (const std::string& needle : task->needles) {
    const size_t at = task->prompt_text.find(needle, from);
    if (at == std::string::npos) return internal_error("needle '" + needle + "' is not in the prompt text");
    SNAP_ASSIGN_OR_RETURN(int64_t b, prompt_tokens_before(tok, chat, *task, at));
    SNAP_ASSIGN_OR_RETURN(int64_t e, prompt_tokens_before(tok, chat, *task, at + needle.size()));
    task->needle_tokens.emplace_back(b, std::max(b, e));
    from = at + needle.size();
  }
  return {};
}

// --- vocabularies ------------------------------------------------------------------------

namespace {

const char* const k_adjectives[] = {
    "ancient", "brave",  "calm",   "clever",  "curious", "distant", "eager",  "faint",   "fierce", "gentle",
    "golden",  "hidden", "hollow", "humble",  "icy",     "jolly",   "lively", "lonely",  "lucky",  "mellow",
    "misty",   "noble",  "odd",    "pale",    "patient", "proud",   "quiet",  "rapid",   "rusty",  "silent",
    "silver",  "sleepy", "smooth", "solemn",  "steady",  "stormy",  "sturdy", "sudden",  "swift",  "tender",
    "tidy",    "urgent", "velvet", "vivid",   "wandering", "weary", "wild",   "wise",    "witty",  "young"};
const char* const k_nouns[] = {
    "anchor", "badger",  "beacon", "canyon", "castle",  "cedar",  "comet",  "compass", "crater", "dolphin",
    "ember",  "falcon",  "fjord",  "garden", "glacier", "harbor", "hazel",  "island",  "jasper", "kettle",
    "lantern", "meadow", "mirror", "needle", "orchard", "otter",  "pebble", "pepper",  "piano",  "quarry",
    "raven",  "ribbon",  "saddle", "salmon", "spruce",  "thistle", "tiger", "tulip",   "valley", "violin",
    "walnut", "willow",  "wizard", "yarrow", "zephyr",  "marble", "copper", "harvest", "summit", "feather"};

// "quiet-lantern"; distinct keys by rejection.
std::string make_key(EvalRng& rng, std::set<std::string>* used) {
  for (;;) {
    std::string k = std::string(k_adjectives[rng.below(std::size(k_adjectives))]) + "-" +
                    k_nouns[rng.below(std::size(k_nouns))];
    if (used->insert(k).second) return k;
  }
}

std::string make_number(EvalRng& rng, int digits, std::set<std::string>* used) {
  int64_t lo = 1;
  for (int i = 1; i < digits; ++i) lo *= 10;
  for (;;) {
    std::string v = std::to_string(rng.between(lo, lo * 10 - 1));
    if (used->insert(v).second) return v;
  }
}

// Five capital letters, e.g. "QZKRA".
std::string make_variable(EvalRng& rng, std::set<std::string>* used) {
  for (;;) {
    std::string v;
    for (int i = 0; i < 5; ++i) v += static_cast<char>('A' + rng.below(26));
    if (used->insert(v).second) return v;
  }
}

// Pronounceable pseudo-words of 2-3 consonant-vowel syllables ("dokame"): 70^2 + 70^3
// distinct words, none an English word the model could favour from pre-training.
std::string make_word(EvalRng& rng, std::set<std::string>* used) {
  static const char k_consonants[] = "bdfgklmnprstvz";
  static const char k_vowels[] = "aeiou";
  for (;;) {
    std::string w;
    const int syllables = 2 + static_cast<int>(rng.below(2));
    for (int i = 0; i < syllables; ++i) {
      w += k_consonants[rng.below(14)];
      w += k_vowels[rng.below(5)];
    }
    if (used->insert(w).second) return w;
  }
}

// --- needle-in-a-haystack tasks ------------------------------------------------------------

struct Needle {
  std::string text;
  double depth;  // 0..1 of the haystack's tokens
};

// Finds the most haystack units for which the whole prompt fits prompt_token_bound(spec)
// tokens. build(n) returns the task with n units (or an error).
template <class Build>
Result<EvalTask> fit_length(const TaskSpec& spec, size_t max_units, Build build) {
  const int64_t bound = prompt_token_bound(spec);
  SNAP_ASSIGN_OR_RETURN(EvalTask smallest, build(0));
  if (static_cast<int64_t>(smallest.prompt_ids.size()) > bound) {
    const std::string what = bound < spec.length ? "length " + std::to_string(spec.length) + " (at most " +
                                                       std::to_string(bound) + " prompt tokens in the model's context)"
                                                 : "length " + std::to_string(spec.length);
    return invalid_argument(what + " is too short for task " + task_name(spec.kind) + ": its fixed parts take " +
                            std::to_string(smallest.prompt_ids.size()) + " tokens");
  }
  size_t lo = 0, hi = max_units;  // invariant: build(lo) fits
  EvalTask best = std::move(smallest);
  while (lo < hi) {
    const size_t mid = lo + (hi - lo + 1) / 2;
    SNAP_ASSIGN_OR_RETURN(EvalTask t, build(mid));
    if (static_cast<int64_t>(t.prompt_ids.size()) <= bound) {
      lo = mid;
      best = std::move(t);
    } else {
      hi = mid - 1;
    }
  }
  return best;
}

Result<EvalTask> make_haystack_task(const TaskSpec& spec, const Tokenizer& tok, const TextCorpus* corpus, bool chat,
                                    EvalRng& rng, const std::string& instruction, const std::string& question,
                                    std::vector<Needle> needles, std::vector<std::string> expected, ScoreKind scorer) {
  // Enough units for the length: each unit's tokens counted alone (a close estimate; the
  // bisection below checks the real count of the whole prompt).
  const uint64_t hay_seed = rng.next_u64();
  const int64_t est_needed = spec.length + 64;
  std::vector<std::string> units;
  std::vector<int64_t> unit_tokens;
  int64_t total = 0;
  const char* sep = haystack_separator(spec.haystack);
  for (size_t batch = 64; total < est_needed; batch *= 2) {
    units = haystack_units(spec.haystack, corpus, hay_seed, units.size() + batch);
    for (size_t i = unit_tokens.size(); i < units.size(); ++i) {
      unit_tokens.push_back(static_cast<int64_t>(tok.encode(sep + units[i], false).size()));
      total += unit_tokens.back();
    }
    if (units.size() > (1u << 22)) break;  // cannot happen with real units; bounds the loop
  }
  std::stable_sort(needles.begin(), needles.end(), [](const Needle& a, const Needle& b) { return a.depth < b.depth; });
  auto build = [&](size_t n) -> Result<EvalTask> {
    int64_t hay_tokens = 0;
    for (size_t i = 0; i < n; ++i) hay_tokens += unit_tokens[i];
    // Boundary b (before unit b) nearest to each needle's depth, by token count.
    std::vector<size_t> at(needles.size(), n);
    for (size_t k = 0; k < needles.size(); ++k) {
      const double want = needles[k].depth * static_cast<double>(hay_tokens);
      int64_t cum = 0;
      size_t best = 0;
      double best_d = want;
      for (size_t b = 1; b <= n; ++b) {
        cum += unit_tokens[b - 1];
        const double d = std::abs(static_cast<double>(cum) - want);
        if (d < best_d) {
          best_d = d;
          best = b;
        }
      }
      at[k] = best;
    }
    EvalTask t;
    t.spec = spec;
    t.question = question;
    t.expected = expected;
    t.scorer = scorer;
    std::string hay;
    size_t next = 0;
    bool first = true;
    auto put = [&](const std::string& s) {
      if (!first) hay += sep;
      hay += s;
      first = false;
    };
    for (size_t b = 0; b <= n; ++b) {
      while (next < needles.size() && at[next] == b) {
        put(needles[next].text);
        t.needles.push_back(needles[next].text);
        ++next;
      }
      if (b < n) put(units[b]);
    }
    t.context = instruction + "\n\n" + hay;
    SNAP_RETURN_IF_ERROR(tokenize_task(tok, chat, &t));
    return t;
  };
  return fit_length(spec, units.size(), build);
}

double random_depth(EvalRng& rng) { return static_cast<double>(rng.below(10001)) / 10000.0; }

// --- common-word extraction ------------------------------------------------------------------

constexpr int k_cwe_common = 10;

Result<EvalTask> make_cwe(const TaskSpec& spec, const Tokenizer& tok, bool chat, EvalRng& rng) {
  std::set<std::string> used;
  std::vector<std::string> common;
  for (int i = 0; i < k_cwe_common; ++i) common.push_back(make_word(rng, &used));
  const uint64_t list_seed = rng.next_u64();
  const std::string instruction =
      "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
      "that appear most often.";
  const std::string question = "What are the 10 most common words in the above list?";
  // n list items: each common word f = max(3, 3n/100) times (30% of the list), every other
  // word once, so the ten common words are strictly the most frequent.
  auto build = [&](size_t n) -> Result<EvalTask> {
    const size_t f = std::max<size_t>(3, 3 * n / 100);
    EvalRng list_rng(list_seed);
    std::set<std::string> taken(used);
    std::vector<std::string> words;
    for (const auto& w : common) words.insert(words.end(), f, w);
    while (words.size() < std::max(n, f * k_cwe_common)) words.push_back(make_word(list_rng, &taken));
    list_rng.shuffle(words);
    EvalTask t;
    t.spec = spec;
    t.question = question;
    t.expected = common;
    t.scorer = ScoreKind::all;
    std::string list;
    for (size_t i = 0; i < words.size(); ++i) list += (i ? " " : "") + std::to_string(i + 1) + ". " + words[i];
    t.context = instruction + "\n\n" + list;
    SNAP_RETURN_IF_ERROR(tokenize_task(tok, chat, &t));
    return t;
  };
  // Words cost about 4 tokens with their number: spec.length / 2 items bounds the search.
  return fit_length(spec, static_cast<size_t>(std::max<int64_t>(spec.length / 2, 40)), build);
}

}  // namespace

// --- the generators -------------------------------------------------------------------------

namespace {

Result<EvalTask> make_task_text(const TaskSpec& spec, const Tokenizer& tok, const TextCorpus* corpus, bool chat) {
  if (spec.length < 16) return invalid_argument("length " + std::to_string(spec.length) + " is below 16 tokens");
  if (task_uses_depth(spec.kind) && (spec.depth_percent < 0 || spec.depth_percent > 100)) {
    return invalid_argument("depth " + std::to_string(spec.depth_percent) + "% is outside 0..100");
  }
  if (spec.haystack == HaystackKind::shakespeare && task_uses_haystack(spec.kind) && corpus == nullptr) {
    return invalid_argument("the shakespeare haystack needs the text corpus (--haystack-dir)");
  }
  uint64_t s = mix_seed(1469598103934665603ULL, "snapserve-eval-v1");
  s = mix_seed(s, task_name(spec.kind));
  s = mix_seed(s, haystack_name(spec.haystack));
  s = mix_seed(s, spec.length);
  s = mix_seed(s, task_uses_depth(spec.kind) ? spec.depth_percent : -1);
  s = mix_seed(s, static_cast<int64_t>(spec.seed));
  EvalRng rng(s);
  const double depth = spec.depth_percent / 100.0;
  std::set<std::string> keys, values;
  const std::string niah_instruction =
      "Some special magic numbers are hidden within the following text. Make sure to memorize them. I will quiz "
      "you about the numbers afterwards.";
  auto magic = [](const std::string& key, const std::string& value) {
    return "One of the special magic numbers for " + key + " is: " + value + ".";
  };
  switch (spec.kind) {
    case TaskKind::niah_single: {
      const std::string key = make_key(rng, &keys), value = make_number(rng, 7, &values);
      return make_haystack_task(spec, tok, corpus, chat, rng, niah_instruction,
                                "What is the special magic number for " + key + " mentioned in the provided text?",
                                {{magic(key, value), depth}}, {value}, ScoreKind::contains);
    }
    case TaskKind::passkey: {
      const std::string value = make_number(rng, 5, &values);
      return make_haystack_task(
          spec, tok, corpus, chat, rng,
          "There is an important piece of information hidden inside a lot of irrelevant text. Find it and memorize "
          "it. I will quiz you about the important information there.",
          "What is the pass key?", {{"The pass key is " + value + ". Remember it. " + value + " is the pass key.", depth}},
          {value}, ScoreKind::contains);
    }
    case TaskKind::niah_multikey: {
      const std::string key = make_key(rng, &keys), value = make_number(rng, 7, &values);
      std::vector<Needle> needles{{magic(key, value), depth}};
      for (int i = 0; i < 3; ++i) {  // distractor keys, each with its own number
        const std::string k = make_key(rng, &keys), v = make_number(rng, 7, &values);
        needles.push_back({magic(k, v), random_depth(rng)});
      }
      return make_haystack_task(spec, tok, corpus, chat, rng, niah_instruction,
                                "What is the special magic number for " + key + " mentioned in the provided text?",
                                needles, {value}, ScoreKind::contains);
    }
    case TaskKind::niah_multivalue: {
      const std::string key = make_key(rng, &keys);
      std::vector<Needle> needles;
      std::vector<std::string> expected;
      for (int i = 0; i < 4; ++i) {
        expected.push_back(make_number(rng, 7, &values));
        needles.push_back({magic(key, expected.back()), i == 0 ? depth : random_depth(rng)});
      }
      return make_haystack_task(spec, tok, corpus, chat, rng, niah_instruction,
                                "What are all the special magic numbers for " + key +
                                    " mentioned in the provided text?",
                                needles, expected, ScoreKind::all);
    }
    case TaskKind::vt: {
      const std::string value = make_number(rng, 5, &values);
      std::vector<std::string> vars;
      for (int i = 0; i < 5; ++i) vars.push_back(make_variable(rng, &keys));
      std::vector<double> depths;
      for (int i = 0; i < 5; ++i) depths.push_back(random_depth(rng));
      std::sort(depths.begin(), depths.end());  // the chain reads in order
      std::vector<Needle> needles{{"VAR " + vars[0] + " = " + value + ".", depths[0]}};
      for (int i = 1; i < 5; ++i) needles.push_back({"VAR " + vars[i] + " = VAR " + vars[i - 1] + ".", depths[i]});
      return make_haystack_task(spec, tok, corpus, chat, rng,
                                "Memorize and track the chain of variable assignments hidden in the following text.",
                                "Find all variables that are assigned the value " + value + " in the text above.",
                                needles, vars, ScoreKind::all);
    }
    case TaskKind::cwe: return make_cwe(spec, tok, chat, rng);
  }
  return invalid_argument("unknown task");
}

}  // namespace

int64_t prompt_token_bound(const TaskSpec& spec) {
  return spec.max_prompt_tokens > 0 ? std::min(spec.length, spec.max_prompt_tokens) : spec.length;
}

Result<EvalTask> make_task(const TaskSpec& spec, const Tokenizer& tok, const TextCorpus* corpus, bool chat) {
  SNAP_ASSIGN_OR_RETURN(EvalTask t, make_task_text(spec, tok, corpus, chat));
  SNAP_RETURN_IF_ERROR(locate_needle_tokens(tok, chat, &t));
  return t;
}

}  // namespace snap::eval
