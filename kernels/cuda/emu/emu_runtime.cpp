// The kernel emulator's execution model (kernel_lang.h says what a kernel sees): a launch runs
// its blocks one after another on the calling OS thread; inside a block every CUDA thread is a
// fiber (ucontext) with its own stack, run until it finishes or reaches a barrier. When no
// thread can run, the scheduler releases the barriers whose threads have all arrived — a warp's
// shuffle when every lane of its mask is there, __syncthreads when every thread of the block
// is — and reports a fault when none can be released (a barrier some threads never reach).
//   SNAP_EMU_SCHEDULE=forward|reverse|shuffle (default forward) orders the threads of a pass and
// the blocks of a grid: a kernel whose result depends on it has a race (a missing
// __syncthreads, a read of another thread's shared memory before the barrier that orders it);
// the emulated tests run under two orders.
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/emu/kernel_lang.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define SNAP_EMU_ASAN 1
#endif

namespace snap_emu {
namespace {

// sm_90 (H100/H200) limits, as the runtime checks them at a launch.
constexpr unsigned k_max_threads = 1024;
constexpr unsigned k_max_block_z = 64;
constexpr unsigned k_max_grid_x = 0x7fffffffu;
constexpr unsigned k_max_grid_yz = 65535;
constexpr size_t k_default_dynamic_shared = 48 * 1024;  // without cudaFuncAttributeMaxDynamicSharedMemorySize
constexpr size_t k_max_shared = 227 * 1024;             // static + dynamic, per block
#if defined(SNAP_EMU_ASAN)
constexpr size_t k_stack_bytes = 1 << 20;
#else
constexpr size_t k_stack_bytes = 256 << 10;
#endif

enum class St { ready, block_bar, warp_bar, done };

struct Fiber {
  ucontext_t ctx{};
  void* stack = nullptr;
  uint3 tid{};
  St st = St::ready;
  bool started = false;
  uint32_t mask = 0;          // at a warp barrier: the lanes it names
  int src_lane = 0;           // ... and the lane whose deposit it reads
  const char* what = nullptr;  // ... and which intrinsic
  uint64_t deposit = 0, result = 0;
  size_t next_slot = 0;  // the next static __shared__ declaration
};

struct Slot {
  size_t bytes;
  const char* name;
  std::unique_ptr<unsigned char[]> mem;
};

enum class Order { forward, reverse, shuffle };

Order order_from_env() {
  const char* v = std::getenv("SNAP_EMU_SCHEDULE");
  const std::string s = v ? v : "forward";
  if (s == "reverse") return Order::reverse;
  if (s == "shuffle") return Order::shuffle;
  return Order::forward;
}

// One OS thread's emulator state: the launch it is running (if any) and its fiber stacks.
struct Engine {
  ucontext_t sched{};
  std::vector<Fiber> fibers;
  Fiber* cur = nullptr;
  uint3 bid{};
  dim3 bdim, gdim;
  std::vector<Slot> slots;
  std::unique_ptr<unsigned char[]> dyn;
  size_t dyn_bytes = 0;
  const Site* site = nullptr;
  void (*body)(void*) = nullptr;
  void* ctx = nullptr;
  bool running = false;
  std::string fault;  // set by a thread or the scheduler; ends the launch
  std::vector<void*> stacks;
  std::mt19937 rng{12345};
#if defined(SNAP_EMU_ASAN)
  const void* main_stack_bottom = nullptr;
  size_t main_stack_size = 0;
#endif

  ~Engine() {
    for (void* s : stacks) munmap(s, k_stack_bytes);
  }
};

thread_local Engine t_engine;

std::mutex g_attr_mu;
std::map<const void*, size_t>& attr_table() {
  static auto* t = new std::map<const void*, size_t>;
  return *t;
}

size_t max_dynamic_shared(const void* fn) {
  std::lock_guard<std::mutex> lock(g_attr_mu);
  auto it = attr_table().find(fn);
  return it == attr_table().end() ? k_default_dynamic_shared : it->second;
}

void* take_stack(Engine& e) {
  if (!e.stacks.empty()) {
    void* s = e.stacks.back();
    e.stacks.pop_back();
    return s;
  }
  void* s = mmap(nullptr, k_stack_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (s == MAP_FAILED) {
    std::fprintf(stderr, "snap_emu: cannot map a %zu-byte fiber stack\n", k_stack_bytes);
    std::abort();
  }
  mprotect(s, static_cast<size_t>(sysconf(_SC_PAGESIZE)), PROT_NONE);  // guard page: an overflow faults
  return s;
}

std::string block_name(const Engine& e) {
  return "block (" + std::to_string(e.bid.x) + "," + std::to_string(e.bid.y) + "," + std::to_string(e.bid.z) + ")";
}

std::string thread_name(const Fiber& f) {
  return "thread (" + std::to_string(f.tid.x) + "," + std::to_string(f.tid.y) + "," + std::to_string(f.tid.z) + ")";
}

// Back to the scheduler from a fiber (a barrier or the end of the thread).
void yield_to_scheduler(Engine& e) {
  Fiber* f = e.cur;
#if defined(SNAP_EMU_ASAN)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(f->st == St::done ? nullptr : &fake, e.main_stack_bottom, e.main_stack_size);
  swapcontext(&f->ctx, &e.sched);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  swapcontext(&f->ctx, &e.sched);
#endif
}

void fiber_entry() {
  Engine& e = t_engine;
#if defined(SNAP_EMU_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &e.main_stack_bottom, &e.main_stack_size);
#endif
  e.body(e.ctx);
  e.cur->st = St::done;
  yield_to_scheduler(e);  // never resumed
}

void run_fiber(Engine& e, Fiber& f) {
  if (!f.started) {
    f.stack = take_stack(e);
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = k_stack_bytes;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_entry, 0);
    f.started = true;
  }
  e.cur = &f;
#if defined(SNAP_EMU_ASAN)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack, k_stack_bytes);
  swapcontext(&e.sched, &f.ctx);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  swapcontext(&e.sched, &f.ctx);
#endif
  e.cur = nullptr;
  if (f.st == St::done) {
    e.stacks.push_back(f.stack);
    f.stack = nullptr;
  }
}

// Releases the warps whose every named lane waits at its shuffle; a fault when a warp's lanes
// disagree on the mask or name a lane that does not exist or has returned.
bool release_warps(Engine& e) {
  bool released = false;
  const size_t n = e.fibers.size();
  for (size_t w0 = 0; w0 < n; w0 += 32) {
    const size_t w1 = std::min(n, w0 + 32);
    uint32_t mask = 0;
    bool any = false;
    for (size_t i = w0; i < w1; ++i) {
      const Fiber& f = e.fibers[i];
      if (f.st != St::warp_bar) continue;
      if (any && f.mask != mask) {
        e.fault = "warp " + std::to_string(w0 / 32) + ": lanes wait at shuffles with different masks";
        return false;
      }
      mask = f.mask;
      any = true;
    }
    if (!any) continue;
    bool all = true;
    for (int lane = 0; lane < 32; ++lane) {
      if (!(mask >> lane & 1u)) continue;
      const size_t i = w0 + static_cast<size_t>(lane);
      if (i >= w1) {
        e.fault = "warp " + std::to_string(w0 / 32) + ": a shuffle's mask names lane " + std::to_string(lane) +
                  ", which this block (" + std::to_string(n) + " threads) does not have";
        return false;
      }
      if (e.fibers[i].st == St::done) {
        e.fault = "warp " + std::to_string(w0 / 32) + ": a shuffle's mask names lane " + std::to_string(lane) +
                  ", which has returned";
        return false;
      }
      if (e.fibers[i].st != St::warp_bar) all = false;
    }
    if (!all) continue;
    for (size_t i = w0; i < w1; ++i) {
      Fiber& f = e.fibers[i];
      if (f.st != St::warp_bar) continue;
      const int src = f.src_lane;
      if (src < 0 || src >= 32 || !(mask >> src & 1u)) {
        e.fault = "warp " + std::to_string(w0 / 32) + ": lane " + std::to_string(i - w0) + "'s " + f.what +
                  " reads lane " + std::to_string(src) + ", outside the mask";
        return false;
      }
      f.result = e.fibers[w0 + static_cast<size_t>(src)].deposit;
    }
    for (size_t i = w0; i < w1; ++i)
      if (e.fibers[i].st == St::warp_bar) e.fibers[i].st = St::ready;
    released = true;
  }
  return released;
}

bool release_block(Engine& e) {
  size_t at = 0, done = 0;
  for (const Fiber& f : e.fibers) {
    at += f.st == St::block_bar;
    done += f.st == St::done;
  }
  if (at == 0 || at + done != e.fibers.size()) return false;
  if (done > 0) {
    const auto it = std::find_if(e.fibers.begin(), e.fibers.end(), [](const Fiber& f) { return f.st == St::done; });
    e.fault = "__syncthreads reached by " + std::to_string(at) + " of " + std::to_string(e.fibers.size()) +
              " threads; the others returned before it (first: " + thread_name(*it) + ")";
    return false;
  }
  for (Fiber& f : e.fibers) f.st = St::ready;
  return true;
}

std::string stuck(const Engine& e) {
  size_t at_block = 0, at_warp = 0, done = 0;
  std::string first_warp;
  for (const Fiber& f : e.fibers) {
    at_block += f.st == St::block_bar;
    done += f.st == St::done;
    if (f.st == St::warp_bar) {
      if (at_warp++ == 0) first_warp = thread_name(f) + " at " + f.what;
    }
  }
  return "deadlock: " + std::to_string(at_block) + " threads at __syncthreads, " + std::to_string(at_warp) +
         " at warp shuffles" + (at_warp ? " (first: " + first_warp + ")" : "") + ", " + std::to_string(done) +
         " returned";
}

// Runs the current block to its end; false with e.fault set on a fault.
bool run_block(Engine& e, Order order) {
  const size_t n = e.fibers.size();
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), size_t{0});
  if (order == Order::reverse) std::reverse(idx.begin(), idx.end());
  for (;;) {
    if (order == Order::shuffle) std::shuffle(idx.begin(), idx.end(), e.rng);
    for (size_t i : idx) {
      Fiber& f = e.fibers[i];
      if (f.st != St::ready) continue;
      run_fiber(e, f);
      if (!e.fault.empty()) return false;
    }
    if (std::all_of(e.fibers.begin(), e.fibers.end(), [](const Fiber& f) { return f.st == St::done; })) return true;
    const bool warps = release_warps(e);
    if (!e.fault.empty()) return false;
    if (warps) continue;
    if (release_block(e)) continue;
    if (e.fault.empty()) e.fault = stuck(e);
    return false;
  }
}

}  // namespace

const uint3& thread_idx() { return t_engine.cur->tid; }
const uint3& block_idx() { return t_engine.bid; }
const dim3& block_dim() { return t_engine.bdim; }
const dim3& grid_dim() { return t_engine.gdim; }

void syncthreads() {
  Engine& e = t_engine;
  e.cur->st = St::block_bar;
  yield_to_scheduler(e);
}

uint64_t warp_exchange(uint32_t mask, uint64_t bits, int src_lane, const char* what) {
  Engine& e = t_engine;
  Fiber& f = *e.cur;
  const int lane = lane_id();
  if (!(mask >> lane & 1u)) {
    e.fault = thread_name(f) + " calls " + what + " with a mask that does not name its own lane " + std::to_string(lane);
    f.st = St::warp_bar;  // never released: the launch ends on the fault
    yield_to_scheduler(e);
  }
  f.mask = mask;
  f.src_lane = src_lane;
  f.what = what;
  f.deposit = bits;
  f.st = St::warp_bar;
  yield_to_scheduler(e);
  return f.result;
}

void* shared_slot(size_t bytes, size_t align, const char* name) {
  Engine& e = t_engine;
  Fiber& f = *e.cur;
  const size_t k = f.next_slot++;
  if (k == e.slots.size()) {  // the first thread to reach this declaration makes it
    Slot s{bytes, name, std::unique_ptr<unsigned char[]>(new unsigned char[std::max<size_t>(bytes, 1)])};
    std::memset(s.mem.get(), 0xff, bytes);
    e.slots.push_back(std::move(s));
    size_t total = e.dyn_bytes;
    for (const Slot& x : e.slots) total += x.bytes;
    if (total > k_max_shared) {
      e.fault = "shared memory: " + std::to_string(total) + " bytes (static + dynamic) exceed the " +
                std::to_string(k_max_shared) + " a block may have";
      f.st = St::done;
      yield_to_scheduler(e);
    }
  } else if (e.slots[k].bytes != bytes || std::string(e.slots[k].name) != name) {
    e.fault = thread_name(f) + " declares __shared__ " + name + " where another thread declared " + e.slots[k].name;
    f.st = St::done;
    yield_to_scheduler(e);
  }
  (void)align;  // new[] aligns to alignof(std::max_align_t), enough for every type the kernels declare
  return e.slots[k].mem.get();
}

void* dynamic_shared() { return t_engine.dyn.get(); }

void set_max_dynamic_shared(const void* fn, int bytes) {
  if (bytes < 0 || static_cast<size_t>(bytes) > k_max_shared) {
    snap::hostcuda::set_error(cudaErrorInvalidValue, "kernel emulator: cudaFuncSetAttribute(MaxDynamicSharedMemorySize, " +
                                                         std::to_string(bytes) + ") exceeds the " +
                                                         std::to_string(k_max_shared) + " bytes a block may have");
    return;
  }
  std::lock_guard<std::mutex> lock(g_attr_mu);
  attr_table()[fn] = static_cast<size_t>(bytes);
}

void check_pointer_arg(const Site& s, int index, const void* p) {
  if (p == nullptr || snap::hostcuda::is_device(p, 0)) return;
  const std::string what = std::string("kernel emulator: ") + s.kernel + " (" + s.file + ":" + std::to_string(s.line) +
                           "): argument " + std::to_string(index) + " is not device memory";
  std::fprintf(stderr, "%s\n", what.c_str());
  snap::hostcuda::set_error(cudaErrorIllegalAddress, what);
}

void run(const Config& c, const Site& s, const void* fn, void (*body)(void*), void* ctx) {
  Engine& e = t_engine;
  const auto where = std::string(s.kernel) + " (" + s.file + ":" + std::to_string(s.line) + ")";
  auto refuse = [&](cudaError_t code, const std::string& why) {
    const std::string what = "kernel emulator: launch of " + where + " refused: " + why;
    std::fprintf(stderr, "%s\n", what.c_str());
    snap::hostcuda::set_error(code, what);
  };
  if (e.running) {
    refuse(cudaErrorLaunchFailure, "a kernel launched from inside a kernel");
    return;
  }
  const dim3 g = c.grid, b = c.block;
  const uint64_t threads = uint64_t{b.x} * b.y * b.z;
  if (threads == 0 || threads > k_max_threads || b.x > 1024 || b.y > 1024 || b.z > k_max_block_z) {
    refuse(cudaErrorInvalidConfiguration, "block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," +
                                              std::to_string(b.z) + ") is not 1..1024 threads");
    return;
  }
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > k_max_grid_x || g.y > k_max_grid_yz || g.z > k_max_grid_yz) {
    refuse(cudaErrorInvalidConfiguration, "grid (" + std::to_string(g.x) + "," + std::to_string(g.y) + "," +
                                              std::to_string(g.z) + ") is outside 1..2^31-1 x 1..65535 x 1..65535");
    return;
  }
  const size_t dyn_max = max_dynamic_shared(fn);
  if (c.smem > dyn_max) {
    refuse(cudaErrorInvalidValue, std::to_string(c.smem) + " bytes of dynamic shared memory, more than the " +
                                      std::to_string(dyn_max) +
                                      (dyn_max == k_default_dynamic_shared
                                           ? " allowed without cudaFuncAttributeMaxDynamicSharedMemorySize"
                                           : " its cudaFuncAttributeMaxDynamicSharedMemorySize allows"));
    return;
  }
  static const Order order = order_from_env();
  e.running = true;
  e.site = &s;
  e.body = body;
  e.ctx = ctx;
  e.bdim = b;
  e.gdim = g;
  e.fault.clear();
  e.fibers.assign(threads, Fiber{});
  for (unsigned z = 0, i = 0; z < b.z; ++z)
    for (unsigned y = 0; y < b.y; ++y)
      for (unsigned x = 0; x < b.x; ++x) e.fibers[i++].tid = uint3{x, y, z};
  const uint64_t blocks = uint64_t{g.x} * g.y * g.z;
  for (uint64_t n = 0; n < blocks; ++n) {
    const uint64_t k = order == Order::forward ? n : blocks - 1 - n;  // shuffle: reversed blocks too
    e.bid = uint3{static_cast<unsigned>(k % g.x), static_cast<unsigned>(k / g.x % g.y),
                  static_cast<unsigned>(k / (uint64_t{g.x} * g.y))};
    for (Fiber& f : e.fibers) {
      if (f.stack) e.stacks.push_back(f.stack);  // a previous block's fault left it
      const uint3 tid = f.tid;
      f = Fiber{};
      f.tid = tid;
    }
    e.slots.clear();
    e.dyn_bytes = c.smem;
    e.dyn.reset(new unsigned char[std::max<size_t>(c.smem, 1)]);
    std::memset(e.dyn.get(), 0xff, c.smem);
    if (!run_block(e, order)) {
      const std::string what = "kernel emulator: fault in " + where + ", " + block_name(e) + ": " + e.fault;
      std::fprintf(stderr, "%s\n", what.c_str());
      snap::hostcuda::set_error(cudaErrorLaunchFailure, what);
      for (Fiber& f : e.fibers)
        if (f.stack) {
          e.stacks.push_back(f.stack);
          f.stack = nullptr;
        }
      break;
    }
  }
  e.slots.clear();
  e.dyn.reset();
  e.running = false;
}

}  // namespace snap_emu
