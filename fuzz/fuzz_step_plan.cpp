// The step-plan decoder (bytes every worker rank takes from rank 0); a plan that decodes
// re-encodes to the same bytes.
#include <cstdlib>
#include <cstring>

#include "worker/step_plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto plan = snap::decode_step_plan(std::span<const uint8_t>(data, size));
  if (!plan.ok()) return 0;
  const std::vector<uint8_t> again = snap::encode_step_plan(*plan);
  auto twice = snap::decode_step_plan(again);
  if (!twice.ok() || snap::encode_step_plan(*twice) != again) std::abort();
  return 0;
}
