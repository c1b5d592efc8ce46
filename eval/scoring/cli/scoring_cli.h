// The scoring subcommands under `snapserve eval`: toxicity (generate + score + store),
// rescore (score stored generations with another scorer version, appending), compare
// (rankings per scorer version, Kendall tau-b, flips, crossings; refuses mixed versions),
// export (the store as JSONL or CSV). Each callback runs its command and sets *rc.
#pragma once

#include <CLI/CLI.hpp>

namespace snap::scoring {

void add_scoring_eval_commands(CLI::App& eval, int* rc);

}  // namespace snap::scoring
