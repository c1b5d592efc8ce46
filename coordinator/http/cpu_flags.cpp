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
         "Decode matvec for q8_0/q4_0/q4_1 weights: f32act (default; weights dequantized in registers, f32 "
         "activations), q8act (activations quantized to int8 blocks of 32 once per matvec, integer dot "
         "products; changes logits slightly), q16act (int16 activation blocks, weights widened to int16: "
         "1/258 of q8act's rounding error) or q16x2act (q16act plus an int16 residual plane: activations as "
         "exact as f32 for these sums); see README \"CPU decode\"; env SNAP_MATVEC sets the default")
      ->check(CLI::IsMember({"f32act", "q8act", "q16act", "q16x2act"}));
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
