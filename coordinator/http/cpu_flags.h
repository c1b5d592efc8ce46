// The CPU kernel flags every compute subcommand (generate, serve, batch) takes:
// --matvec q8x3act|q16x2act|f32act|q16act|q8act (kernels/matvec_act.h) and --threads-wait spin|passive|auto
// (kernels/thread_wait.h; applied by threads_wait_setup() at the top of main(), before CLI11
// parses, because libgomp must see it in its environment when it loads).
#pragma once

#include <CLI/CLI.hpp>

namespace snap {

void add_cpu_flags(CLI::App* cmd);

}  // namespace snap
