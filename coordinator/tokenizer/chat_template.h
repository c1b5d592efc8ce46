// Chat templates without a Jinja interpreter: the family is detected from the template
// source (ChatML, Llama-3, Mistral/Llama-2, Gemma) and rendered by hand, byte-exact with what
// transformers' apply_chat_template produces for the known templates of each family.
// An empty template renders as Gemma's when the vocabulary has <start_of_turn> (Gemma 3
// GGUFs carry no template), else, like an unrecognised one, as ChatML (llama.cpp's fallback).
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace snap {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

enum class ChatFamily { chatml, llama3, mistral, llama2, gemma };

ChatFamily chat_family(const std::string& template_source);

// The prompt text. It contains the BOS text when the template emits bos_token (Llama-3,
// Mistral, Llama-2, Gemma): encode it with add_special_tokens=false then.
Result<std::string> apply_chat_template(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                                        bool add_generation_prompt);

}  // namespace snap
