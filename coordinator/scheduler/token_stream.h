// A completion's stream, shared by the CPU engine (engine.cpp) and the device engine
// (worker/device/device_engine.cpp): sampling the next token from a sequence's logits, the
// stop conditions (EOS, stop_token_ids, stop strings, max_tokens, the context), the text
// held back while it may start a stop string, and the text and counts of the final event.
// Both engines keep their sequences in a struct derived from TokenStream and call these.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "coordinator/scheduler/engine.h"
#include "coordinator/scheduler/logits_processing.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "kernels/kernels.h"

namespace snap {

// What one sequence's stream needs, whichever engine runs its forward.
struct TokenStream {
  EngineRequest req;
  EventSink sink;
  std::unique_ptr<StreamDecoder> decoder;
  kernels::Rng rng{0};
  std::vector<float> logits;
  std::vector<float> processed;  // logits after penalties/bias/masks (when the request has any)
  TokenHistory history;          // for the penalties
  int64_t prefilled = 0;         // prompt tokens already in the cache
  int64_t generated = 0;
  int32_t next_token = -1;       // sampled, to be fed at the next decode step
  std::string text;              // generated text not yet emitted (held back for stop strings)
  double arrival = 0, admitted = 0, first_token = 0, last_token = 0;
  double prefill_seconds = 0;
  std::string done_reason;       // set when the sequence must finish this step
  bool stopped_by_string = false;
  std::string stop_string;       // the stop string that ended it
  int32_t stop_token_id = -1;    // the stop_token_ids entry that ended it
  Status error;
  // n > 1: choice 0 prefills, then choices 1..n-1 are forked from it (start_choice), each with
  // its own copy of the KV cache; `group` is the id of choice 0 (what cancel() takes).
  uint64_t group = 0;
  int choice = 0;
  bool forked = false;                         // choice 0 of n > 1: the other choices exist
  std::vector<float> chunk_logits;             // every row's logits of a prompt chunk (prompt_logprobs)
  std::vector<PromptLogprob> prompt_logprobs;  // prompt tokens scored so far (echo)

  int64_t prompt_len() const { return static_cast<int64_t>(req.prompt_ids.size()); }
  bool prefilling() const { return prefilled < prompt_len(); }
  bool child() const { return choice > 0; }
};

// The engine-wide facts sample_and_emit reads. A stream's own choice gives its events' index,
// and only choice 0 observes the time to first token (one a request).
struct EmitContext {
  int64_t vocab = 0;
  int64_t context = 0;                     // the model's context: prompt + generated stops there
  const std::vector<int32_t>* eos = nullptr;  // the model's end-of-sequence ids
  ServerMetrics* metrics = nullptr;        // may be null
};

// Samples the next token from s.logits (after the request's logits processing), streams it
// through s.sink, and sets s.done_reason ("stop" or "length") when a stop condition holds,
// else s.next_token.
void sample_and_emit(TokenStream& s, const EmitContext& c);
// The part of sample_and_emit after sampling: `id` is the next token (chosen elsewhere, e.g. by
// an argmax on the GPU); s.logits is read only for logprobs.
void emit_token(TokenStream& s, const EmitContext& c, int32_t id);

// A stream's next token, drawn but not yet emitted, with its logprobs when the request asks.
struct SampledToken {
  int32_t id = -1;
  bool has_logprobs = false;
  TokenLogprobs logprobs;
};
// The drawing half of sample_and_emit, from `logits` (vocab floats; s.logits when null): the
// request's logits processing, the draw from s's own generator, the logprobs. It touches only s
// (its processed logits and generator), so different streams may draw at once.
SampledToken sample_token(TokenStream& s, const EmitContext& c, const float* logits = nullptr);
// The emitting half: emit_token with the logprobs sample_token computed.
void emit_sampled(TokenStream& s, const EmitContext& c, SampledToken t);
// A continuous-batching step's rows: row i's sample_token (from logits[i], or its own s.logits
// when logits is null) on OpenMP threads, rows spread over them (each draws from its own
// generator: the ids are those one thread draws), then each row's emit_sampled in row order on
// this thread (the sinks are called from here only).
void sample_rows(std::span<TokenStream* const> rows, const EmitContext& c, const float* const* logits,
                 std::vector<SampledToken>* out);
void sample_and_emit_rows(std::span<TokenStream* const> rows, const EmitContext& c, const float* const* logits = nullptr);
// Whether s's next token is the plain argmax of its logits and nothing else of them is needed:
// greedy (temperature ≤ 0: sample_cpu takes the lowest id of the maximum and draws no random
// number), no logits processing, no logprobs. Then an engine may take the id from a device
// argmax with the same tie rule (kernels::argmax_cuda) and never copy the logits to the host.
bool greedy_without_logits(const TokenStream& s);

// Choice `choice` (1..n-1) of parent's request, forked once parent's prompt is in its cache:
// the request with seed + choice, the same sink, prompt state, logits and timings, and its own
// decoder and random stream. The engine sets its own fields (ids, the KV copy, reservations).
void start_choice(const TokenStream& parent, int choice, const Tokenizer& tokenizer, TokenStream* child);

// Scores a prompt chunk for echo's prompt logprobs: row j of chunk_logits ([len, vocab], the
// chunk starting at prompt position `start`) predicts prompt token start + j + 1, whose
// logprob and top req.prompt_logprobs alternatives go to s.prompt_logprobs; the prompt's last
// row is the next-token distribution and goes to s.logits.
void score_prompt_chunk(TokenStream& s, const float* chunk_logits, int64_t start, int64_t len, int64_t vocab);

// The finished events of choices 1..n-1 of a request whose choice 0 ends (`ev`, its own final
// event) before they were forked: every choice of the request gets its finished event.
void end_unforked_choices(const TokenStream& s, const EngineEvent& ev);

// Fills the final event's text (the held-back tail and the decoder's last bytes, cut at a stop
// string they complete, which makes the reason "stop"), its finish reason, token counts and
// what stopped it.
void finish_stream(TokenStream& s, const std::string& reason, EngineEvent* ev);

// Where the earliest stop string starts in `text` (npos: none); `matched` (when given) gets
// it, the first listed on a tie.
size_t first_stop(const std::string& text, const std::vector<std::string>& stops, std::string* matched);

// How many bytes at the end of `text` must be held back: the longest tail that is a proper
// prefix of a stop string, widened so as not to split a UTF-8 character.
size_t stop_prefix_hold(const std::string& text, const std::vector<std::string>& stops);

}  // namespace snap
