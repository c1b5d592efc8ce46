#include "coordinator/scheduler/token_stream.h"

#include <algorithm>

#include "common/sys.h"

namespace snap {

size_t first_stop(const std::string& text, const std::vector<std::string>& stops, std::string* matched) {
  size_t cut = std::string::npos;
  for (const std::string& stop : stops) {
    if (stop.empty()) continue;
    const size_t at = text.find(stop);
    if (at != std::string::npos && (cut == std::string::npos || at < cut)) {
      cut = at;
      if (matched) *matched = stop;
    }
  }
  return cut;
}

size_t stop_prefix_hold(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const std::string& stop : stops) {
    if (stop.empty()) continue;
    for (size_t k = std::min(stop.size() - 1, text.size()); k > hold; --k) {
      if (text.compare(text.size() - k, k, stop, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  // The decoder's text is whole characters; a stop-string prefix cuts inside one only if the
  // stop string does, so widen the tail to the character's first byte.
  while (hold < text.size() && (static_cast<unsigned char>(text[text.size() - hold]) & 0xC0) == 0x80) ++hold;
  return hold;
}

bool greedy_without_logits(const TokenStream& s) {
  return s.req.sampling.temperature <= 0.0f && !logits_processing_active(s.req) && s.req.logprobs < 0;
}

void sample_and_emit(TokenStream& s, const EmitContext& c) { emit_sampled(s, c, sample_token(s, c)); }

SampledToken sample_token(TokenStream& s, const EmitContext& c, const float* logits) {
  if (logits == nullptr) logits = s.logits.data();
  const float* dist = logits;
  if (logits_processing_active(s.req)) {
    s.processed.assign(logits, logits + c.vocab);
    apply_logits_processing(s.processed.data(), c.vocab, s.req, s.history, s.generated, *c.eos);
    dist = s.processed.data();
  }
  SampledToken t;
  t.id = kernels::sample_cpu(dist, c.vocab, s.req.sampling, s.rng);
  if (s.req.logprobs >= 0) {
    t.logprobs = token_logprobs(logits, c.vocab, t.id, s.req.logprobs);
    t.has_logprobs = true;
  }
  return t;
}

void sample_rows(std::span<TokenStream* const> rows, const EmitContext& c, const float* const* logits,
                 std::vector<SampledToken>* out) {
  const int64_t n = static_cast<int64_t>(rows.size());
  out->assign(static_cast<size_t>(n), SampledToken{});
#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
  for (int64_t i = 0; i < n; ++i) (*out)[i] = sample_token(*rows[i], c, logits ? logits[i] : nullptr);
}

void sample_and_emit_rows(std::span<TokenStream* const> rows, const EmitContext& c, const float* const* logits) {
  std::vector<SampledToken> drawn;
  sample_rows(rows, c, logits, &drawn);
  for (size_t i = 0; i < rows.size(); ++i) emit_sampled(*rows[i], c, std::move(drawn[i]));
}

void emit_token(TokenStream& s, const EmitContext& c, int32_t id) {
  SampledToken t;
  t.id = id;
  if (s.req.logprobs >= 0) {
    t.logprobs = token_logprobs(s.logits.data(), c.vocab, id, s.req.logprobs);
    t.has_logprobs = true;
  }
  emit_sampled(s, c, std::move(t));
}

void emit_sampled(TokenStream& s, const EmitContext& c, SampledToken t) {
  const int32_t id = t.id;
  ++s.history.output_counts[id];
  const double now = now_seconds();
  if (s.generated == 0) {
    s.first_token = now;
    if (c.metrics && !s.child()) c.metrics->observe_time_to_first_token(now - s.arrival);
  } else if (c.metrics) {
    c.metrics->observe_inter_token_latency(now - s.last_token);
  }
  s.last_token = now;
  ++s.generated;
  const std::vector<int32_t>& stop_ids = s.req.stop_token_ids;
  const bool stop_id = std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end();
  const bool eos = (!s.req.ignore_eos && std::find(c.eos->begin(), c.eos->end(), id) != c.eos->end()) || stop_id;
  EngineEvent ev;
  ev.kind = EngineEvent::Kind::token;
  ev.index = s.choice;
  ev.token_id = id;
  ev.stop_token = eos;
  if (t.has_logprobs) {
    ev.logprob = t.logprobs.logprob;
    ev.top_logprobs = std::move(t.logprobs.top);
  }
  if (!eos) {
    s.text += s.decoder->push(id);
    // Stop strings: cut at the first match; hold back a tail that may start one.
    const size_t cut = first_stop(s.text, s.req.stop, &s.stop_string);
    if (cut != std::string::npos) {
      ev.text = s.text.substr(0, cut);
      s.text.clear();
      s.sink(ev);
      s.done_reason = "stop";
      s.stopped_by_string = true;
      return;
    }
    const size_t hold = stop_prefix_hold(s.text, s.req.stop);
    ev.text = s.text.substr(0, s.text.size() - hold);
    s.text.erase(0, s.text.size() - hold);
  }
  s.sink(ev);
  if (eos) {
    s.done_reason = "stop";
    if (stop_id) s.stop_token_id = id;
  } else if (s.generated >= s.req.max_tokens || s.prompt_len() + s.generated >= c.context) {
    s.done_reason = "length";
  } else {
    s.next_token = id;
  }
}

void start_choice(const TokenStream& parent, int choice, const Tokenizer& tokenizer, TokenStream* k) {
  k->group = parent.group;
  k->choice = choice;
  k->req = parent.req;
  k->req.sampling.seed = parent.req.sampling.seed + static_cast<uint64_t>(choice);
  k->sink = parent.sink;
  k->decoder = std::make_unique<StreamDecoder>(tokenizer, true);
  k->rng = kernels::Rng(k->req.sampling.seed);
  k->logits = parent.logits;
  k->history.prompt_unique = parent.history.prompt_unique;
  k->prefilled = parent.prefilled;
  k->arrival = parent.arrival;
  k->admitted = parent.admitted;
  k->prefill_seconds = parent.prefill_seconds;
}

void score_prompt_chunk(TokenStream& s, const float* chunk_logits, int64_t start, int64_t len, int64_t vocab) {
  for (int64_t j = 0; j < len; ++j) {
    const float* row = chunk_logits + j * vocab;
    const int64_t next = start + j + 1;
    if (next < s.prompt_len()) {
      const int32_t tok = s.req.prompt_ids[static_cast<size_t>(next)];
      TokenLogprobs lp = token_logprobs(row, vocab, tok, s.req.prompt_logprobs);
      s.prompt_logprobs.push_back({tok, lp.logprob, std::move(lp.top)});
    } else {
      s.logits.assign(row, row + vocab);
    }
  }
}

void end_unforked_choices(const TokenStream& s, const EngineEvent& ev) {
  if (s.child() || s.req.n <= 1 || s.forked) return;
  for (int c = 1; c < s.req.n; ++c) {
    EngineEvent other;
    other.kind = EngineEvent::Kind::finished;
    other.index = c;
    other.finish_reason = ev.finish_reason;
    other.error = ev.error;
    other.prompt_tokens = ev.prompt_tokens;
    s.sink(other);
  }
}

void finish_stream(TokenStream& s, const std::string& reason, EngineEvent* ev) {
  ev->kind = EngineEvent::Kind::finished;
  ev->finish_reason = reason;
  ev->error = s.error;
  // The held-back tail (a prefix of some stop string that never completed) and the
  // decoder's last bytes are part of the completion; a stop string they complete still cuts.
  if (reason != "error" && !s.stopped_by_string && s.decoder) {
    ev->text = s.text + s.decoder->flush();
    const size_t cut = first_stop(ev->text, s.req.stop, &s.stop_string);
    if (cut != std::string::npos) {
      ev->text.resize(cut);
      ev->finish_reason = "stop";
    }
    s.text.clear();
  }
  ev->prompt_tokens = s.prompt_len();
  ev->completion_tokens = s.generated;
  if (ev->finish_reason == "stop") {
    ev->stop_string = s.stop_string;
    ev->stop_token_id = s.stop_token_id;
  }
}

}  // namespace snap
