// The kernel emulator's execution model (kernel_lang.h says what a kernel sees): a launch runs
// its blocks one after another on the calling OS thread; inside a block every CUDA thread is a
// fiber with its own stack, run until it finishes or reaches a barrier. A warp shuffle is
// completed by the last lane of its mask to arrive, which hands every lane its source lane's
// value and lets them go on. A thread that stops at a barrier switches straight to the next
// lane of its own warp, in the pass's order, that can run (so a warp goes on through its
// shuffles with only its lanes' stacks in the cache), else to the pass's next thread that can
// run, without going through the scheduler (half the switches); the scheduler takes over when
// the pass has none left, or the thread returned or faulted. When no thread can run, the
// scheduler releases __syncthreads if every thread of the block waits there, and otherwise
// reports a fault (a barrier some threads never reach, or a deadlock) after unwinding the
// threads that wait.
//   SNAP_EMU_SCHEDULE=forward|reverse|shuffle (default forward) orders the threads of a pass and
// the blocks of a grid: a kernel whose result depends on it has a race (a missing
// __syncthreads, a read of another thread's shared memory before the barrier that orders it);
// the emulated tests run under two orders.
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <deque>
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

// The context switch. On x86-64 (SysV) our own: save the callee-saved registers, MXCSR and the
// x87 control word on the old stack, swap stack pointers, restore — no signal-mask syscall, which
// made swapcontext ~80% of an emulated run. Elsewhere: ucontext.
#if defined(__x86_64__) && !defined(SNAP_EMU_UCONTEXT)
#define SNAP_EMU_ASM_SWITCH 1
extern "C" void snap_emu_switch(void** save_sp, void* to_sp);
extern "C" void snap_emu_trampoline();
asm(R"(
  .text
  .globl snap_emu_switch
  .type snap_emu_switch, @function
snap_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size snap_emu_switch, .-snap_emu_switch
  .globl snap_emu_trampoline
  .type snap_emu_trampoline, @function
snap_emu_trampoline:
  call snap_emu_fiber_main
  ud2
  .size snap_emu_trampoline, .-snap_emu_trampoline
)");
#endif

// A thread's first frame (below); a new thread's context enters it.
extern "C" void snap_emu_fiber_main();

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

enum class St { ready, block_bar, warp_bar, faulted, done };

struct AsyncCopy {
  void* dst;
  const void* src;
  size_t bytes, src_bytes;  // src_bytes < bytes: the rest is zero-filled
};

// Thrown at a suspended thread's barrier after a fault, so that its frames unwind (their
// destructors run) before its stack is reused.
struct Unwind {};

struct Fiber {
  int lane = 0;
#if defined(SNAP_EMU_ASM_SWITCH)
  void* sp = nullptr;  // saved stack pointer while switched out
#else
  ucontext_t ctx{};
#endif
  void* stack = nullptr;
  uint3 tid{};
  St st = St::ready;
  bool started = false;
  int src_lane = 0;            // at a warp barrier: the lane whose deposit it reads
  const char* what = nullptr;  // ... and which intrinsic
  uint64_t deposit = 0, result = 0;
  bool collective = false;  // at a warp-collective operation (warp_collective), not a shuffle
  size_t next_slot = 0;     // the next static __shared__ declaration
  // cp.async (kernel_lang.h): copies issued and not yet committed, then the committed groups,
  // oldest first. A group's bytes land when cp_async_wait lets it complete, not before.
  std::vector<AsyncCopy> async_open;
  std::deque<std::vector<AsyncCopy>> async_groups;

  // The same CUDA thread in the next block: fresh state, the containers' storage kept (a
  // default-constructed deque allocates, and under ASan an allocation per thread per block
  // was a tenth of an emulated GEMV's time).
  void reset() {
#if defined(SNAP_EMU_ASM_SWITCH)
    sp = nullptr;
#endif
    stack = nullptr;
    st = St::ready;
    started = false;
    src_lane = 0;
    what = nullptr;
    deposit = result = 0;
    collective = false;
    next_slot = 0;
    async_open.clear();
    async_groups.clear();
  }
};

// A warp's shuffle in progress: the lanes that have reached it and the mask they name.
struct WarpWait {
  uint32_t mask = 0;
  uint32_t arrived = 0;
};

struct Slot {
  size_t bytes;
  const char* name;
  std::unique_ptr<unsigned char[]> mem;
};

using Order = Schedule;

Order order_from_env() {
  const char* v = std::getenv("SNAP_EMU_SCHEDULE");
  const std::string s = v ? v : "forward";
  if (s == "reverse") return Order::reverse;
  if (s == "shuffle") return Order::shuffle;
  if (s != "forward") {
    std::fprintf(stderr, "snap_emu: SNAP_EMU_SCHEDULE=%s is not forward, reverse or shuffle\n", s.c_str());
    std::exit(2);
  }
  return Order::forward;
}

std::atomic<int>& order_setting() {
  static std::atomic<int> o{static_cast<int>(order_from_env())};
  return o;
}
std::atomic<long long> g_faults{0};

}  // namespace

// One OS thread's emulator state: the launch it is running (if any) and its fiber stacks.
struct Engine {
#if defined(SNAP_EMU_ASM_SWITCH)
  void* sched_sp = nullptr;
#else
  ucontext_t sched{};
#endif
  std::vector<Fiber> fibers;
  Fiber* cur = nullptr;
  uint3 bid{};
  std::vector<size_t> order;  // the pass order of the block's threads
  std::vector<size_t> pos;    // each thread's position in `order`
  std::vector<uint32_t> warp_next;  // each thread's successor among its warp's lanes in `order` (cyclic)
  size_t pass_pos = 0;        // where the running pass is in `order` (the thread running now)
  bool from_scheduler = false;  // the running thread was entered from the scheduler, not a thread
  std::vector<WarpWait> warps;
  std::vector<Slot> slots;
  struct AlignedDelete {
    void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t{128}); }
  };
  std::unique_ptr<unsigned char[], AlignedDelete> dyn;
  size_t dyn_bytes = 0;
  void (*body)(void*) = nullptr;
  void* ctx = nullptr;
  bool running = false;
  bool unwinding = false;  // resuming suspended threads after a fault, to unwind them
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



namespace {

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

void switch_to_scheduler(Engine& e, Fiber& f) {
#if defined(SNAP_EMU_ASM_SWITCH)
  snap_emu_switch(&f.sp, e.sched_sp);
#else
  swapcontext(&f.ctx, &e.sched);
#endif
}

// A thread about to run for the first time: its stack, and a first frame that enters
// snap_emu_fiber_main. (Out of line: its locals' ASan redzones cost every switch otherwise.)
[[gnu::noinline]] void start(Engine& e, Fiber& f) {
  f.stack = take_stack(e);
#if defined(SNAP_EMU_ASM_SWITCH)
  // The frame snap_emu_switch pops: MXCSR + x87 control word (this thread's), six zeroed
  // callee-saved registers, then the trampoline as the return address, placed so that the
  // trampoline's call sees a 16-byte aligned stack as the ABI requires.
  auto top = reinterpret_cast<uintptr_t>(f.stack) + k_stack_bytes - 16;
  top &= ~uintptr_t{15};
  auto* frame = reinterpret_cast<uint64_t*>(top - 64);
  uint32_t mxcsr = 0;
  uint16_t fpucw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  frame[0] = mxcsr | static_cast<uint64_t>(fpucw) << 32;
  for (int r = 1; r <= 6; ++r) frame[r] = 0;
  frame[7] = reinterpret_cast<uint64_t>(&snap_emu_trampoline);
  f.sp = frame;
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack;
  f.ctx.uc_stack.ss_size = k_stack_bytes;
  f.ctx.uc_link = nullptr;
  makecontext(&f.ctx, reinterpret_cast<void (*)()>(&snap_emu_fiber_main), 0);
#endif
  f.started = true;
}

inline void prepare(Engine& e, Fiber& f) {
  if (!f.started) start(e, f);
}

// The thread that runs now: the engine's and the kernel's view of it.
void enter(Engine& e, Fiber& f) {
  e.cur = &f;
  t_current.tid = f.tid;
  t_current.lane = f.lane;
}

// The thread the scheduler would run next in this pass after the running one: the next ready
// thread in `order` (threads before the running one wait for the next pass, as they would).
// Null, with the pass ended, when there is none.
Fiber* next_in_pass(Engine& e) {
  for (size_t p = e.pass_pos + 1; p < e.order.size(); ++p) {
    Fiber& g = e.fibers[e.order[p]];
    if (g.st == St::ready) {
      e.pass_pos = p;
      return &g;
    }
  }
  e.pass_pos = e.order.size() - 1;
  return nullptr;
}

// The thread to run after f, which stopped at a barrier: the next lane of its own warp in the
// pass order (cyclic) that can run, so that a warp goes on through its shuffles while its lanes
// can, with only its 32 threads' stacks in the cache, rather than every warp of the block taking
// one step per pass; when none can, the pass's next thread.
Fiber* next_after_barrier(Engine& e, const Fiber& f) {
  const auto i = static_cast<uint32_t>(&f - e.fibers.data());
  for (uint32_t j = e.warp_next[i]; j != i; j = e.warp_next[j]) {
    if (e.fibers[j].st == St::ready) {
      e.pass_pos = e.pos[j];
      return &e.fibers[j];
    }
  }
  return next_in_pass(e);
}

// The running thread stops (a barrier, the end of the thread, a fault). At a barrier it hands
// the OS thread straight to the next thread that can run (next_after_barrier), if any;
// otherwise back to the scheduler.
void yield_to_scheduler(Engine& e) {
  Fiber* f = e.cur;
  const bool at_barrier = f->st == St::warp_bar || f->st == St::block_bar;
  Fiber* g = at_barrier && !e.unwinding && e.fault.empty() ? next_after_barrier(e, *f) : nullptr;
  if (g != nullptr) {
    prepare(e, *g);
    enter(e, *g);
  }
#if defined(SNAP_EMU_ASAN)
  void* fake = nullptr;
  if (g != nullptr) {
    e.from_scheduler = false;
    __sanitizer_start_switch_fiber(&fake, g->stack, k_stack_bytes);
  } else {
    __sanitizer_start_switch_fiber(f->st == St::done ? nullptr : &fake, e.main_stack_bottom, e.main_stack_size);
  }
#endif
  if (g == nullptr) {
    switch_to_scheduler(e, *f);
  } else {
#if defined(SNAP_EMU_ASM_SWITCH)
    snap_emu_switch(&f->sp, g->sp);
#else
    swapcontext(&f->ctx, &g->ctx);
#endif
  }
#if defined(SNAP_EMU_ASAN)
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  if (e.unwinding) throw Unwind{};
}

// A fault found by the running thread: the launch ends, and this thread is unwound with the
// others (yield_to_scheduler throws Unwind when it is resumed); never returns.
void fault_here(Engine& e, std::string why) {
  e.fault = std::move(why);
  e.cur->st = St::faulted;
  yield_to_scheduler(e);
}

}  // namespace
}  // namespace snap_emu

// A fiber's first frame (the trampoline calls it on the fiber's stack); it never returns.
extern "C" void snap_emu_fiber_main() {
  using namespace snap_emu;
  Engine& e = *t_current.engine;
#if defined(SNAP_EMU_ASAN)
  // The stack we came from: the scheduler's (kept: threads switch back to it), or a thread's.
  const void* from_bottom = nullptr;
  size_t from_size = 0;
  __sanitizer_finish_switch_fiber(nullptr, &from_bottom, &from_size);
  if (e.from_scheduler) {
    e.main_stack_bottom = from_bottom;
    e.main_stack_size = from_size;
  }
#endif
  try {
    e.body(e.ctx);
  } catch (const Unwind&) {  // the launch faulted while this thread waited
  }
  e.cur->st = St::done;
  yield_to_scheduler(e);  // never resumed
  std::abort();
}

namespace snap_emu {
namespace {

// The scheduler runs thread f until the OS thread comes back to it: when f, or a thread f (or
// one after it) handed over to, returns, faults, or stops at a barrier with the pass done.
void run_fiber(Engine& e, Fiber& f) {
  prepare(e, f);
  enter(e, f);
  e.from_scheduler = true;
#if defined(SNAP_EMU_ASAN)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack, k_stack_bytes);
#endif
#if defined(SNAP_EMU_ASM_SWITCH)
  snap_emu_switch(&e.sched_sp, f.sp);
#else
  swapcontext(&e.sched, &f.ctx);
#endif
#if defined(SNAP_EMU_ASAN)
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  Fiber* last = e.cur;  // the thread that switched back (only a thread that returned is done)
  e.cur = nullptr;
  if (last->st == St::done) {
    e.stacks.push_back(last->stack);
    last->stack = nullptr;
  }
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

// Why no thread can go on: a shuffle whose mask names a lane that returned, or a deadlock.
std::string explain_stuck(const Engine& e) {
  for (size_t w = 0; w < e.warps.size(); ++w) {
    const WarpWait& ww = e.warps[w];
    if (ww.arrived == 0) continue;
    for (int l = 0; l < 32; ++l)
      if ((ww.mask >> l & 1u) && !(ww.arrived >> l & 1u) && e.fibers[w * 32 + static_cast<size_t>(l)].st == St::done)
        return "warp " + std::to_string(w) + ": a shuffle's mask names lane " + std::to_string(l) +
               ", which has returned";
  }
  return stuck(e);
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

// pos and warp_next for the order the pass runs in: one walk of `order`, each lane linked to the
// next lane of its warp met after it, the warp's last lane back to its first.
void link_order(Engine& e) {
  const size_t n = e.order.size(), warps = (n + 31) / 32;
  constexpr uint32_t k_none = ~uint32_t{0};
  e.pos.resize(n);
  e.warp_next.resize(n);
  uint32_t first[k_max_threads / 32], last[k_max_threads / 32];  // per warp (run() checked the block size)
  std::fill_n(first, warps, k_none);
  for (size_t p = 0; p < n; ++p) {
    const auto i = static_cast<uint32_t>(e.order[p]);
    e.pos[i] = p;
    const size_t w = i / 32;
    if (first[w] == k_none) first[w] = i;
    else e.warp_next[last[w]] = i;
    last[w] = i;
  }
  for (size_t w = 0; w < warps; ++w) e.warp_next[last[w]] = first[w];
}

// Runs the current block to its end; false with e.fault set on a fault.
bool run_block(Engine& e, Order order) {
  std::vector<size_t>& idx = e.order;  // set up by run() for the launch
  for (;;) {
    if (order == Order::shuffle) {
      std::shuffle(idx.begin(), idx.end(), e.rng);
      link_order(e);
    }
    bool ran = false;
    // pass_pos is shared with the threads: one that stops at a barrier runs the next itself.
    for (e.pass_pos = 0; e.pass_pos < idx.size(); ++e.pass_pos) {
      Fiber& f = e.fibers[idx[e.pass_pos]];
      if (f.st != St::ready) continue;
      run_fiber(e, f);
      ran = true;
      if (!e.fault.empty()) return false;
    }
    if (ran) continue;  // a shuffle's last lane may have released lanes this pass had passed
    if (std::all_of(e.fibers.begin(), e.fibers.end(), [](const Fiber& f) { return f.st == St::done; })) return true;
    if (release_block(e)) continue;  // warps release themselves (warp_exchange)
    if (e.fault.empty()) e.fault = explain_stuck(e);
    return false;
  }
}

}  // namespace


void syncthreads() {
  Engine& e = *t_current.engine;
  e.cur->st = St::block_bar;
  yield_to_scheduler(e);
}

namespace {
// What is wrong with lane f's arrival at a warp barrier, as a fault (warp_arrive found
// something). Out of line: the messages' strings would give warp_arrive a large stack frame,
// whose ASan redzones it would set and clear at every shuffle.
[[gnu::noinline, gnu::cold]] void warp_fault(Engine& e, Fiber& f, size_t w, uint32_t mask, int src_lane,
                                             const char* what) {
  const int lane = f.lane;
  const WarpWait& ww = e.warps[w];
  const size_t lanes_here = std::min<size_t>(32, e.fibers.size() - w * 32);
  if (!(mask >> lane & 1u))
    fault_here(e, thread_name(f) + " calls " + what + " with a mask that does not name its own lane " + std::to_string(lane));
  if (lanes_here < 32 && (mask >> lanes_here) != 0)
    fault_here(e, "warp " + std::to_string(w) + ": " + what + "'s mask names lanes this block (" +
                      std::to_string(e.fibers.size()) + " threads) does not have");
  if (ww.arrived != 0 && ww.mask != mask)
    fault_here(e, "warp " + std::to_string(w) + ": lanes wait at shuffles with different masks");
  if (src_lane < 0 || src_lane >= 32 || !(mask >> src_lane & 1u))
    fault_here(e, "warp " + std::to_string(w) + ": lane " + std::to_string(lane) + "'s " + what + " reads lane " +
                      std::to_string(src_lane) + ", outside the mask");
  const int first = std::countr_zero(ww.arrived);
  fault_here(e, "warp " + std::to_string(w) + ": lane " + std::to_string(lane) + " is at " + what + " while lane " +
                    std::to_string(first) + " waits at " + e.fibers[w * 32 + static_cast<size_t>(first)].what);
}

// The last lane of a collective runs fn over every lane's deposit.
[[gnu::noinline]] void run_collective(Engine& e, const Fiber* base, size_t w, uint32_t mask, const char* what,
                                      WarpCollectiveFn fn) {
  void* args[32] = {};
  for (int l = 0; l < 32; ++l)
    if (mask >> l & 1u) args[l] = reinterpret_cast<void*>(base[l].deposit);
  if (const char* err = fn(args, mask); err != nullptr) fault_here(e, "warp " + std::to_string(w) + ": " + what + ": " + err);
}

// A lane arrives at a warp barrier (a shuffle, or a collective when fn is set) with `bits`.
// The last lane of the mask to arrive completes it: a collective's fn runs once over every
// lane's deposit, then each lane gets its source lane's deposit and goes on.
uint64_t warp_arrive(uint32_t mask, uint64_t bits, int src_lane, const char* what, WarpCollectiveFn fn) {
  Engine& e = *t_current.engine;
  Fiber& f = *e.cur;
  const int lane = f.lane;
  const size_t w = static_cast<size_t>(&f - e.fibers.data()) / 32;
  WarpWait& ww = e.warps[w];
  Fiber* base = &e.fibers[w * 32];
  const size_t lanes_here = std::min<size_t>(32, e.fibers.size() - w * 32);
  bool bad = !(mask >> lane & 1u) || (lanes_here < 32 && (mask >> lanes_here) != 0) ||
             (ww.arrived != 0 && ww.mask != mask) || src_lane < 0 || src_lane >= 32 || !(mask >> src_lane & 1u);
  if (!bad && ww.arrived != 0) {  // a collective meets only the same collective
    const Fiber& first = base[std::countr_zero(ww.arrived)];
    bad = (fn != nullptr || first.collective) && std::strcmp(first.what, what) != 0;
  }
  if (bad) warp_fault(e, f, w, mask, src_lane, what);  // does not come back
  ww.mask = mask;
  ww.arrived |= 1u << lane;
  f.src_lane = src_lane;
  f.what = what;
  f.deposit = bits;
  f.collective = fn != nullptr;
  if (ww.arrived != mask) {  // wait for the others; the last to arrive completes the exchange
    f.st = St::warp_bar;
    yield_to_scheduler(e);
    return f.result;
  }
  if (fn != nullptr) run_collective(e, base, w, mask, what, fn);
  for (int l = 0; l < 32; ++l) {
    if (!(mask >> l & 1u)) continue;
    Fiber& g = base[l];
    g.result = base[g.src_lane].deposit;
    if (&g != &f) g.st = St::ready;
  }
  ww.arrived = 0;
  return f.result;
}
}  // namespace

uint64_t warp_exchange(uint32_t mask, uint64_t bits, int src_lane, const char* what) {
  return warp_arrive(mask, bits, src_lane, what, nullptr);
}

void warp_collective(uint32_t mask, void* arg, WarpCollectiveFn fn, const char* what) {
  warp_arrive(mask, reinterpret_cast<uint64_t>(arg), lane_id(), what, fn);
}

void* shared_slot(size_t bytes, size_t align, const char* name) {
  Engine& e = *t_current.engine;
  Fiber& f = *e.cur;
  const size_t k = f.next_slot++;
  if (k == e.slots.size()) {  // the first thread to reach this declaration makes it
    Slot s{bytes, name, std::unique_ptr<unsigned char[]>(new unsigned char[std::max<size_t>(bytes, 1)])};
    std::memset(s.mem.get(), 0xff, bytes);
    e.slots.push_back(std::move(s));
    size_t total = e.dyn_bytes;
    for (const Slot& x : e.slots) total += x.bytes;
    if (total > k_max_shared)
      fault_here(e, "shared memory: " + std::to_string(total) + " bytes (static + dynamic) exceed the " +
                        std::to_string(k_max_shared) + " a block may have");
  } else if (e.slots[k].bytes != bytes || std::string(e.slots[k].name) != name) {
    fault_here(e, thread_name(f) + " declares __shared__ " + name + " where another thread declared " +
                      e.slots[k].name);
  }
  (void)align;  // new[] aligns to alignof(std::max_align_t), enough for every type the kernels declare
  return e.slots[k].mem.get();
}

bool is_shared(const void* p, size_t bytes) {
  const Engine& e = *t_current.engine;
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto inside = [&](const void* base, size_t n) {
    const auto b = reinterpret_cast<uintptr_t>(base);
    return a >= b && a - b <= n && bytes <= n - (a - b);
  };
  if (e.dyn && inside(e.dyn.get(), e.dyn_bytes)) return true;
  for (const Slot& s : e.slots)
    if (inside(s.mem.get(), s.bytes)) return true;
  return false;
}

void cp_async(void* dst, const void* src, size_t bytes, size_t src_bytes) {
  Engine& e = *t_current.engine;
  Fiber& f = *e.cur;
  const auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  if ((bytes != 4 && bytes != 8 && bytes != 16) || src_bytes > bytes)
    fault_here(e, thread_name(f) + ": cp.async of " + std::to_string(bytes) + " bytes (" + std::to_string(src_bytes) +
                      " from global); PTX allows 4, 8 or 16, and no more source bytes than that");
  if (d % bytes != 0 || s % bytes != 0)
    fault_here(e, thread_name(f) + ": cp.async of " + std::to_string(bytes) + " bytes with an address not aligned to it");
  if (!is_shared(dst, bytes))
    fault_here(e, thread_name(f) + ": cp.async destination is not this block's shared memory");
  if (src_bytes > 0 && !snap::hostcuda::is_device(src, src_bytes))
    fault_here(e, thread_name(f) + ": cp.async source is not device memory of " + std::to_string(src_bytes) + " bytes");
  f.async_open.push_back(AsyncCopy{dst, src, bytes, src_bytes});
}

void cp_async_commit() {
  Fiber& f = *t_current.engine->cur;
  f.async_groups.push_back(std::move(f.async_open));
  f.async_open.clear();
}

void cp_async_wait(int pending) {
  Fiber& f = *t_current.engine->cur;
  while (f.async_groups.size() > static_cast<size_t>(pending < 0 ? 0 : pending)) {
    for (const AsyncCopy& c : f.async_groups.front()) {
      if (c.src_bytes > 0) std::memcpy(c.dst, c.src, c.src_bytes);
      std::memset(static_cast<unsigned char*>(c.dst) + c.src_bytes, 0, c.bytes - c.src_bytes);
    }
    f.async_groups.pop_front();
  }
}

void set_schedule(Schedule s) { order_setting().store(static_cast<int>(s)); }
Schedule schedule() { return static_cast<Schedule>(order_setting().load()); }
long long faults() { return g_faults.load(); }

void* dynamic_shared() { return t_current.engine->dyn.get(); }

cudaError_t set_max_dynamic_shared(const void* fn, int bytes) {
  if (bytes < 0 || static_cast<size_t>(bytes) > k_max_shared) {
    snap::hostcuda::set_error(cudaErrorInvalidValue, "kernel emulator: cudaFuncSetAttribute(MaxDynamicSharedMemorySize, " +
                                                         std::to_string(bytes) + ") exceeds the " +
                                                         std::to_string(k_max_shared) + " bytes a block may have");
    return cudaErrorInvalidValue;
  }
  std::lock_guard<std::mutex> lock(g_attr_mu);
  attr_table()[fn] = static_cast<size_t>(bytes);
  return cudaSuccess;
}

bool check_pointer_arg(const Site& s, int index, const void* p) {
  if (p == nullptr || snap::hostcuda::is_device(p, 0)) return true;
  const std::string what = std::string("kernel emulator: ") + s.kernel + " (" + s.file + ":" + std::to_string(s.line) +
                           "): argument " + std::to_string(index) + " is not device memory";
  std::fprintf(stderr, "%s\n", what.c_str());
  snap::hostcuda::set_error(cudaErrorIllegalAddress, what);
  return false;
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
  const Order order = static_cast<Order>(order_setting().load());
  e.running = true;
  e.body = body;
  e.ctx = ctx;
  t_current.engine = &e;
  t_current.bdim = b;
  t_current.gdim = g;
  e.fault.clear();
  e.fibers.resize(threads);  // reset below, per block
  for (unsigned z = 0, i = 0; z < b.z; ++z)
    for (unsigned y = 0; y < b.y; ++y)
      for (unsigned x = 0; x < b.x; ++x, ++i) {
        e.fibers[i].tid = uint3{x, y, z};
        e.fibers[i].lane = static_cast<int>(i % 32);
      }
  e.warps.assign((threads + 31) / 32, WarpWait{});
  e.order.resize(threads);
  std::iota(e.order.begin(), e.order.end(), size_t{0});
  if (order == Order::reverse) std::reverse(e.order.begin(), e.order.end());
  link_order(e);
  const uint64_t blocks = uint64_t{g.x} * g.y * g.z;
  for (uint64_t n = 0; n < blocks; ++n) {
    const uint64_t k = order == Order::forward ? n : blocks - 1 - n;  // shuffle: reversed blocks too
    e.bid = uint3{static_cast<unsigned>(k % g.x), static_cast<unsigned>(k / g.x % g.y),
                  static_cast<unsigned>(k / (uint64_t{g.x} * g.y))};
    t_current.bid = e.bid;
    std::fill(e.warps.begin(), e.warps.end(), WarpWait{});
    for (Fiber& f : e.fibers) {
      if (f.stack) e.stacks.push_back(f.stack);  // a fault may leave one
      f.reset();
    }
    e.slots.clear();
    e.dyn_bytes = c.smem;
    // 128-byte aligned, as a GPU's dynamic shared memory is at least (WMMA needs 32).
    e.dyn.reset(new (std::align_val_t{128}) unsigned char[std::max<size_t>(c.smem, 1)]);
    std::memset(e.dyn.get(), 0xff, c.smem);
    if (!run_block(e, order)) {
      const std::string what = "kernel emulator: fault in " + where + ", " + block_name(e) + ": " + e.fault;
      std::fprintf(stderr, "%s\n", what.c_str());
      snap::hostcuda::set_error(cudaErrorLaunchFailure, what);
      g_faults.fetch_add(1);
      e.unwinding = true;  // every suspended thread throws Unwind from its barrier and ends
      for (Fiber& f : e.fibers)
        if (f.started && f.st != St::done) run_fiber(e, f);
      e.unwinding = false;
      break;
    }
  }
  e.slots.clear();
  e.dyn.reset();
  e.running = false;
}

}  // namespace snap_emu
