// The fake driver (see emu.h). Only the calls the backend and cudarc make.

#include <ucontext.h>

// The kernels above read these through macros; here they are plain names.
#undef threadIdx
#undef blockIdx
#undef blockDim
#undef gridDim

#include <chrono>
#include <map>
#include <mutex>
#include <string>

namespace emu {
Dim3 threadIdx, blockIdx, blockDim, gridDim;

// ---- coroutines: a minimal context switch (x86-64: callee-saved registers
// and the stack pointer; elsewhere ucontext, slower) ----
#if defined(__x86_64__)
extern "C" void emu_switch(void** save_sp, void* load_sp);
asm(R"(
.text
.p2align 4
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
)");
struct Ctx {
    void* sp = nullptr;
};
static void ctx_init(Ctx& c, char* stack, size_t size, void (*entry)()) {
    // A frame that `emu_switch` pops into `entry` (6 registers, the return
    // address), with the stack aligned as after a call.
    uintptr_t top = ((uintptr_t)(stack + size)) & ~(uintptr_t)15;
    void** sp = (void**)top;
    *--sp = nullptr;          // alignment slot: entry sees rsp % 16 == 8
    *--sp = (void*)entry;     // return address
    for (int i = 0; i < 6; i++) *--sp = nullptr;
    c.sp = sp;
}
static void ctx_switch(Ctx& from, Ctx& to) { emu_switch(&from.sp, to.sp); }
#else
struct Ctx {
    ucontext_t uc;
};
static void ctx_init(Ctx& c, char* stack, size_t size, void (*entry)()) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = size;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
}
static void ctx_switch(Ctx& from, Ctx& to) { swapcontext(&from.uc, &to.uc); }
#endif

struct Thread {
    Ctx ctx;
    bool done = false;
};

static Ctx sched_ctx;
static std::vector<Thread> threads;
static unsigned current = 0;
static void (*body)(void**) = nullptr;
static void** body_params = nullptr;
// Coroutine stacks, allocated once and reused by every block (kernels keep
// a few hundred bytes of locals).
static const size_t STACK = 64 * 1024;
static std::vector<char*> stacks;

// Barriers as generation counters: the last live member to arrive opens it;
// a thread that exits counts as arrived (CUDA's rule for exited threads).
struct Barrier {
    unsigned alive = 0, arrived = 0;
    unsigned long long gen = 0;
    void open_if_complete() {
        if (arrived > 0 && arrived >= alive) {
            arrived = 0;
            gen++;
        }
    }
};
static Barrier block_bar;
static std::vector<Barrier> warp_bar;
// Warp exchange slots, two sets used by alternate barrier generations: a
// lane can write set p again only after the next generation opened, i.e.
// after every lane has read set p, so one barrier per exchange suffices.
static std::vector<unsigned long long> warp_slot;      // 2 x 32 per warp
static std::vector<unsigned char> gather_slot;         // 2 x 32 x 64 bytes per warp

// Runs the next live thread after `current` (cyclic order, as a round-robin
// scheduler would), switching straight from `from`: a barrier costs one
// switch per waiting thread, not two through a scheduler. With no other
// live thread it returns to the scheduler (when `from` has exited) or to
// the caller.
static void switch_to_next(Ctx& from, bool from_done) {
    const unsigned n = (unsigned)threads.size();
    for (unsigned i = 1; i <= n; i++) {
        const unsigned t = (current + i) % n;
        if (threads[t].done) continue;
        if (t == current) return;  // the only live thread: go on running it
        current = t;
        threadIdx = Dim3{t, 0, 0};
        ctx_switch(from, threads[t].ctx);
        return;
    }
    if (from_done) ctx_switch(from, sched_ctx);
}

static void yield() {
    const unsigned me = current;
    switch_to_next(threads[me].ctx, false);
    // Resumed (by another thread's switch): `current` and threadIdx are
    // already ours.
}

static void wait(Barrier& b) {
    const unsigned long long g = b.gen;
    b.arrived++;
    b.open_if_complete();
    while (b.gen == g) yield();
}

void sync_block() { wait(block_bar); }

unsigned long long warp_exchange(unsigned long long v, unsigned src_lane) {
    const unsigned w = current / 32;
    unsigned long long* set = &warp_slot[(w * 2 + (warp_bar[w].gen & 1)) * 32];
    set[current % 32] = v;
    wait(warp_bar[w]);  // every lane has published
    return set[src_lane];
}

void warp_gather(const void* mine, unsigned bytes, void* all) {
    const unsigned w = current / 32;
    unsigned char* set = &gather_slot[(w * 2 + (warp_bar[w].gen & 1)) * 32 * 64];
    std::memcpy(&set[(current % 32) * 64], mine, bytes);
    wait(warp_bar[w]);  // every lane has published
    for (unsigned l = 0; l < 32; l++)
        std::memcpy((unsigned char*)all + l * bytes, &set[l * 64], bytes);
}

static void trampoline() {
    body(body_params);
    Thread& me = threads[current];
    me.done = true;
    block_bar.alive--;
    block_bar.open_if_complete();
    Barrier& wb = warp_bar[current / 32];
    wb.alive--;
    wb.open_if_complete();
    // The next live thread, or the scheduler when this was the last.
    switch_to_next(me.ctx, true);
    std::abort();  // a finished coroutine is never resumed
}

// Runs one block to completion: thread 0 first, then each thread switches
// to the next live one at a barrier or on exit; the last to exit returns
// here.
static void run_block(unsigned n) {
    threads.assign(n, Thread());
    const unsigned warps = (n + 31) / 32;
    warp_bar.assign(warps, Barrier());
    for (unsigned w = 0; w < warps; w++) warp_bar[w].alive = min(32u, n - 32 * w);
    warp_slot.assign(warps * 2 * 32, 0);
    gather_slot.assign(warps * 2 * 32 * 64, 0);
    block_bar = Barrier();
    block_bar.alive = n;
    while (stacks.size() < n) stacks.push_back((char*)std::malloc(STACK));
    for (unsigned t = 0; t < n; t++) ctx_init(threads[t].ctx, stacks[t], STACK, trampoline);
    current = 0;
    threadIdx = Dim3{0, 0, 0};
    ctx_switch(sched_ctx, threads[0].ctx);
}

// One launch at a time in the process (test threads share the emulator).
static std::mutex launch_lock;

void launch(void (*k)(void**), void** params, Dim3 grid, Dim3 block) {
    std::lock_guard<std::mutex> guard(launch_lock);
    body = k;
    body_params = params;
    gridDim = grid;
    blockDim = block;
    for (unsigned y = 0; y < grid.y; y++)
        for (unsigned x = 0; x < grid.x; x++) {
            blockIdx = Dim3{x, y, 0};
            run_block(block.x * block.y * block.z);
        }
}

// ---- kernel registry: name -> invoker unpacking the parameter array ----
template <typename... A, size_t... I>
static void call(void (*k)(A...), void** p, std::index_sequence<I...>) {
    k(*(typename std::remove_reference<A>::type*)p[I]...);
}

template <auto K>
struct Invoker;

template <typename... A, void (*K)(A...)>
struct Invoker<K> {
    static void run(void** p) { call(K, p, std::index_sequence_for<A...>{}); }
};

typedef void (*Run)(void**);
static std::map<std::string, Run>& registry() {
    static std::map<std::string, Run> r;
    return r;
}
struct Reg {
    Reg(const char* n, Run f) { registry()[n] = f; }
};
}  // namespace emu

#define REG(name) static emu::Reg reg_##name(#name, &emu::Invoker<&name>::run);
// The registrations, `REG(name) ARITY(name)` for every kernel, are appended
// by tests/cuda_emu/mod.rs from the kernel list (src/backend/kernels.rs).

// ---- the driver API subset ----
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
struct Func { emu::Run run; unsigned n_args; };
struct Launch { emu::Run run; std::vector<unsigned long long> args; Dim3 grid, block; };
struct Graph { std::vector<Launch> list; };
// Capture is per thread (the backend captures in thread-local mode).
static thread_local bool capturing = false;
static thread_local Graph* capture = nullptr;
static int device_integrated = 0;

#define API extern "C" __attribute__((visibility("default")))

API CUresult cuInit(unsigned) {
    const char* e = std::getenv("DS4_CUDA_EMU_INTEGRATED");
    device_integrated = e && e[0] == '1';
    return 0;
}
API CUresult cuDeviceGetCount(int* n) { *n = 1; return 0; }
API CUresult cuDeviceGet(int* d, int o) { if (o != 0) return 101; *d = 0; return 0; }
API CUresult cuDeviceGetName(char* s, int len, int) { std::snprintf(s, len, "ds4 CUDA emulator (host)"); return 0; }
API CUresult cuDeviceTotalMem_v2(size_t* b, int) { *b = (size_t)16 << 30; return 0; }
API CUresult cuDeviceGetAttribute(int* v, int a, int) {
    switch (a) {
        case 75: *v = 8; break;   // compute capability 8.0
        case 76: *v = 0; break;
        case 16: *v = 1; break;   // one "SM"
        case 18: *v = device_integrated; break;
        case 19: *v = 1; break;
        case 88: *v = device_integrated; break;
        default: *v = 0;
    }
    return 0;
}
static int ctx_token;
API CUresult cuDevicePrimaryCtxRetain(void** c, int) { *c = &ctx_token; return 0; }
API CUresult cuDevicePrimaryCtxRelease_v2(int) { return 0; }
API CUresult cuCtxSetCurrent(void*) { return 0; }
static int stream_token;
API CUresult cuStreamCreate(void** s, unsigned) { *s = &stream_token; return 0; }
API CUresult cuStreamDestroy_v2(void*) { return 0; }
API CUresult cuStreamSynchronize(void*) { return 0; }
API CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
    void* m = std::aligned_alloc(256, (n + 255) / 256 * 256);
    if (!m) return 2;
    std::memset(m, 0xAB, n);  // never zero by accident
    *p = (CUdeviceptr)m;
    return 0;
}
API CUresult cuMemFree_v2(CUdeviceptr p) { std::free((void*)p); return 0; }
API CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void* s, size_t n) { std::memcpy((void*)d, s, n); return 0; }
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* s, size_t n, void*) {
    if (capturing) return 900;  // the backend writes step parameters outside capture
    std::memcpy((void*)d, s, n);
    return 0;
}
API CUresult cuMemcpyDtoH_v2(void* d, CUdeviceptr s, size_t n) { std::memcpy(d, (void*)s, n); return 0; }
API CUresult cuMemHostRegister_v2(void*, size_t, unsigned) { return 0; }
API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* d, void* h, unsigned) { *d = (CUdeviceptr)h; return 0; }
API CUresult cuMemHostUnregister(void*) { return 0; }
static int module_token;
API CUresult cuModuleLoadData(void** m, const void* image) {
    // The PTX NVRTC produced is checked for its header only; the host build
    // of the same source runs instead.
    if (!std::strstr((const char*)image, ".version")) return 200;
    *m = &module_token;
    return 0;
}
API CUresult cuModuleUnload(void*) { return 0; }
API CUresult cuModuleGetFunction(void** f, void*, const char* name) {
    auto it = emu::registry().find(name);
    if (it == emu::registry().end()) return 500;
    *f = (void*)it->second;
    return 0;
}
static unsigned n_params(emu::Run r);
API CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned shared, void*, void** params, void** extra) {
    if (extra || gz != 1 || by != 1 || bz != 1 || bx == 0 || bx > 1024 || shared > 48 * 1024) return 1;
    Launch l{(emu::Run)f, {}, Dim3{gx, gy, 1}, Dim3{bx, 1, 1}};
    // Every parameter is at most 8 bytes: copy them (the caller's array is
    // gone by the time a captured graph replays).
    const unsigned n = n_params(l.run);
    for (unsigned i = 0; i < n; i++) {
        unsigned long long v = 0;
        std::memcpy(&v, params[i], 8);
        l.args.push_back(v);
    }
    if (capturing) {
        capture->list.push_back(l);
        return 0;
    }
    std::vector<void*> ptrs;
    for (auto& a : l.args) ptrs.push_back(&a);
    emu::launch(l.run, ptrs.data(), l.grid, l.block);
    return 0;
}
API CUresult cuStreamBeginCapture_v2(void*, int) {
    if (capturing) return 900;
    capturing = true;
    capture = new Graph();
    return 0;
}
API CUresult cuStreamEndCapture(void*, void** g) {
    if (!capturing) return 900;
    capturing = false;
    *g = capture;
    capture = nullptr;
    return 0;
}
API CUresult cuGraphInstantiateWithFlags(void** exec, void* g, unsigned long long) {
    *exec = new Graph(*(Graph*)g);
    return 0;
}
API CUresult cuGraphLaunch(void* exec, void*) {
    for (auto& l : ((Graph*)exec)->list) {
        std::vector<void*> ptrs;
        for (auto& a : l.args) ptrs.push_back(&a);
        emu::launch(l.run, ptrs.data(), l.grid, l.block);
    }
    return 0;
}
API CUresult cuGraphDestroy(void* g) { delete (Graph*)g; return 0; }
API CUresult cuGraphExecDestroy(void* g) { delete (Graph*)g; return 0; }
// Events: launches run synchronously here, so an event is the wall-clock
// time at which it was recorded.
struct Event { std::chrono::steady_clock::time_point t; };
API CUresult cuEventCreate(void** e, unsigned) { *e = new Event(); return 0; }
API CUresult cuEventDestroy_v2(void* e) { delete (Event*)e; return 0; }
API CUresult cuEventRecord(void* e, void*) {
    if (capturing) return 900;
    ((Event*)e)->t = std::chrono::steady_clock::now();
    return 0;
}
API CUresult cuEventSynchronize(void*) { return 0; }
API CUresult cuEventElapsedTime(float* ms, void* a, void* b) {
    *ms = std::chrono::duration<float, std::milli>(((Event*)b)->t - ((Event*)a)->t).count();
    return 0;
}
API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void*) {
    if (capturing) return 900;
    std::memcpy((void*)d, (const void*)s, n);
    return 0;
}
API CUresult cuGetErrorString(CUresult, const char** s) { *s = "emulator error"; return 0; }
API CUresult cuGetErrorName(CUresult, const char** s) { *s = "CUDA_ERROR_EMULATOR"; return 0; }

// Parameter counts per kernel (from the registry's invokers' signatures).
template <typename T> struct Arity;
template <typename... A> struct Arity<void (*)(A...)> { static const unsigned n = sizeof...(A); };
static std::map<emu::Run, unsigned>& arity() {
    static std::map<emu::Run, unsigned> a;
    return a;
}
struct ArityReg {
    ArityReg(emu::Run r, unsigned n) { arity()[r] = n; }
};
#define ARITY(name) static ArityReg ar_##name(&emu::Invoker<&name>::run, Arity<decltype(&name)>::n);
static unsigned n_params(emu::Run r) { return arity()[r]; }
