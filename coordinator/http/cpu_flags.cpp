// add_cpu_flags (cpu_flags.h): registration, help text and the --matvec callback.
#include "coordinator/http/cpu_flags.h"

#include <string>

#include "kernels/matvec_act.h"
#include "kernels/thread_wait.h"

namespace snap {

void add_cpu_flags(CLI::App* cmd) {
  cmd->add_option_function<std::string>(
         "--matvec",
         [](const std::string& v) {
           kernels::MatvecAct act = kernels::MatvecAct::f32;
           kernels::matvec_act_from_name(v, &act);
           kernels::matvec_act_set(act);
         },
         "Decode matvec for q8_0/q4_0/q4_1 weights: q8x3act (the default on CPUs with AVX-512 VNNI or AVX-VNNI; "
         "activations quantized once per matvec to 22-bit integers per block of 32 in three int8 planes, "
         "exact u8 x s8 dot products with vpdpbusd (AVX-512 VNNI or AVX-VNNI) or vpmaddubsw: as accurate as "
         "f32act, fastest, the same bits on every such CPU), q16x2act (the default elsewhere; two int16 "
         "planes per block, value and rounding residual, integer dot products "
         "with vpmaddwd: as accurate as f32act, faster), f32act (weights dequantized in registers, f32 activations: the "
         "reference), q16act (one int16 plane: faster, logits move by up to ~7e-3) or q8act (int8 blocks: "
         "fastest, logits move by up to ~1.6). Q5_0/Q5_1 and Q2_K-Q6_K weights run q16act when asked, f32act "
         "under f32act and q16x2act otherwise; see README \"CPU decode\"; env SNAP_MATVEC sets the default")
      ->check(CLI::IsMember({"f32act", "q8act", "q16act", "q16x2act", "q8x3act"}));
  cmd->add_option("--threads-wait",
                  "How idle compute threads wait between parallel regions: spin (libgomp's default: fastest on an "
                  "idle machine, collapses when other processes compete for the cores), passive (sleep at once), "
                  "auto (default: passive when, at start, other runnable work + --threads exceed the cores, else "
                  "spin). Sets OMP_WAIT_POLICY and restarts the program once; ignored when you set "
                  "OMP_WAIT_POLICY or GOMP_SPINCOUNT yourself; env SNAP_THREADS_WAIT")
      ->type_name("TEXT")
      ->check(CLI::IsMember({"spin", "passive", "auto"}));
}

}  // namespace snap
