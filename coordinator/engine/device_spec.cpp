// parse_device and, in a build without CUDA, the device functions' refusals. With CUDA
// (SNAP_HAVE_CUDA, set on this library by the root CMakeLists.txt), check_device and
// open_device_generator come from worker/device/device_generate.cpp, open_device_engine from
// worker/device/device_engine.cpp (library snap_device).
#include "coordinator/engine/device_spec.h"

#include <cctype>

#include "coordinator/scheduler/engine.h"

namespace snap {

Result<DeviceSpec> parse_device(const std::string& text) {
  DeviceSpec d;
  if (text == "cpu") return d;
  d.kind = DeviceKind::cuda;
  if (text == "cuda") return d;
  const std::string prefix = "cuda:";
  const std::string num = text.compare(0, prefix.size(), prefix) == 0 ? text.substr(prefix.size()) : "";
  bool digits = !num.empty() && num.size() <= 4;
  for (char ch : num) digits = digits && std::isdigit(static_cast<unsigned char>(ch));
  if (!digits) return invalid_argument("--device '" + text + "': expected cpu, cuda or cuda:N (N a device number)");
  d.ordinal = std::stoi(num);
  return d;
}

#if !defined(SNAP_HAVE_CUDA)

bool build_has_cuda() { return false; }
bool device_nccl_usable() { return false; }

namespace {
Status no_cuda(const DeviceSpec& spec) {
  return unimplemented("--device " + spec.name() + ": this build has no CUDA (configure with -DSNAP_ENABLE_CUDA=ON)");
}
}  // namespace

Status check_device(const DeviceSpec& spec) {
  if (spec.kind == DeviceKind::cpu) return {};
  return no_cuda(spec);
}

Result<DeviceSpec> device_for_local_rank(int) { return no_cuda(DeviceSpec{DeviceKind::cuda, 0}); }

Result<std::unique_ptr<DeviceGenerator>> open_device_generator(const DeviceSpec& spec, const LoadedModel&,
                                                               comm::Communicator*, comm::Communicator*, DType) {
  return no_cuda(spec);
}

Result<std::unique_ptr<Engine>> open_device_engine(const DeviceSpec& spec, const EngineConfig&, ServerMetrics*) {
  return no_cuda(spec);
}

Status run_device_engine_follower(const DeviceSpec& spec, const EngineConfig&) { return no_cuda(spec); }

#endif

}  // namespace snap
