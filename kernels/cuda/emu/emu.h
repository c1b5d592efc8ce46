// The kernel emulator's controls (kernels/cuda/emu/README.md), for tests and tools that link
// snap_kernels_cuda_emu. Kernel code sees kernel_lang.h instead.
#pragma once

namespace snap_emu {

// The order in which a pass runs the threads of a block, and the blocks of a grid run:
// launch order, reversed, or shuffled (threads; blocks reversed). The default comes from
// SNAP_EMU_SCHEDULE (forward|reverse|shuffle), else forward. A kernel whose results depend on
// it has a race.
enum class Schedule { forward, reverse, shuffle };
void set_schedule(Schedule s);
Schedule schedule();

// Launches that faulted since the process started, on every OS thread.
long long faults();

}  // namespace snap_emu
