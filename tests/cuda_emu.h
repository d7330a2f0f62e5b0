// Just enough of CUDA's execution model to run gated/engine/kernels.cu on the CPU.
//
// CI has no GPU, so the kernels are compiled with g++ against this header and launched
// from tests/cuda_emu.py. A launch walks the grid block by block; the block's blockDim.x
// threads are fibers (ucontext) on one OS thread, run round-robin: each runs until it
// reaches __syncthreads or returns, and the next round starts when all have. So barriers
// behave as on the GPU, __shared__ arrays can be function statics (one block at a time),
// atomicAdd needs no locking, and a barrier that only some threads reach (divergence, a
// hang or worse on a GPU) is reported as an error. Arithmetic is IEEE float32 without
// contraction (-ffp-contract=off), like the GPU build with --fmad=false. What this cannot
// check: NVRTC itself, warp scheduling, timing; the GPU tests cover those on a device.
#pragma once

#include <setjmp.h>
#include <ucontext.h>

#include <atomic>
#include <bit>
#include <cstdlib>
#include <cmath>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

inline dim3 threadIdx{0, 0, 0};
inline dim3 blockIdx{0, 0, 0};
inline dim3 blockDim{1, 1, 1};
inline dim3 gridDim{1, 1, 1};

#define __global__
#define __device__ inline
#define __restrict__ __restrict
#define __shared__ static

namespace emu {
// Fibers start once per launch through ucontext (makecontext/setcontext), and from then
// on switch with _setjmp/_longjmp, which, unlike swapcontext, makes no system call.
constexpr size_t kStack = 64 * 1024;
struct JumpBuf {
    jmp_buf b;
};
inline std::vector<ucontext_t> fibers;
inline std::vector<JumpBuf> resume;  // where each fiber continues
inline JumpBuf scheduler;
inline std::vector<char> stacks, started, finished;
inline void (*kernel)(void**) = nullptr;
inline void** args = nullptr;
inline bool plain = false;  // a kernel without barriers: threads run as a plain loop

inline void yield() {
    if (_setjmp(resume[threadIdx.x].b) == 0) _longjmp(scheduler.b, 1);
}

inline void fiber_main() {
    for (;;) {  // one pass per block; the scheduler sets blockIdx and threadIdx
        kernel(args);
        finished[threadIdx.x] = 1;
        yield();
    }
}

inline void run(unsigned t) {  // run fiber t until its next barrier or its end
    threadIdx = dim3{t, 0, 0};
    if (_setjmp(scheduler.b) != 0) return;
    if (!started[t]) {
        started[t] = 1;
        setcontext(&fibers[t]);
    }
    _longjmp(resume[t].b, 1);
}
}  // namespace emu

inline void __syncthreads() {
    if (emu::plain) std::abort();  // cuda_emu.py launched a barrier kernel as barrier-free
    emu::yield();
}
inline float __int_as_float(unsigned bits) { return std::bit_cast<float>(bits); }
inline float atomicAdd(float* p, float v) { float old = *p; *p = old + v; return old; }
inline double atomicAdd(double* p, double v) { double old = *p; *p = old + v; return old; }

// Runs `kernel(args)` over grid x block; `kernel` is a generated trampoline that unpacks
// the argument pointers into the kernel's typed parameters; kernels that never reach a
// barrier skip the fibers. Returns 0, or -1 when the
// threads of a block disagreed about a barrier (some waited while others had returned).
extern "C" int emu_launch(void (*kernel)(void**), void** args, unsigned grid,
                          unsigned block, int uses_barriers) {
    gridDim = dim3{grid, 1, 1};
    blockDim = dim3{block, 1, 1};
    emu::plain = !uses_barriers;
    if (emu::plain) {  // no thread waits for another: any order is a valid schedule
        for (unsigned b = 0; b < grid; ++b) {
            blockIdx = dim3{b, 0, 0};
            for (unsigned t = 0; t < block; ++t) {
                threadIdx = dim3{t, 0, 0};
                kernel(args);
            }
        }
        return 0;
    }
    emu::kernel = kernel;
    emu::args = args;
    emu::fibers.resize(block);
    emu::resume.resize(block);
    emu::started.assign(block, 0);
    emu::finished.assign(block, 0);
    if (emu::stacks.size() < block * emu::kStack) emu::stacks.resize(block * emu::kStack);
    for (unsigned t = 0; t < block; ++t) {
        ucontext_t& f = emu::fibers[t];
        getcontext(&f);
        f.uc_stack.ss_sp = emu::stacks.data() + t * emu::kStack;
        f.uc_stack.ss_size = emu::kStack;
        f.uc_link = nullptr;
        makecontext(&f, emu::fiber_main, 0);
    }
    for (unsigned b = 0; b < grid; ++b) {
        blockIdx = dim3{b, 0, 0};
        for (unsigned t = 0; t < block; ++t) emu::finished[t] = 0;
        for (;;) {  // one round per barrier phase
            unsigned done = 0;
            for (unsigned t = 0; t < block; ++t) {
                if (emu::finished[t]) { ++done; continue; }
                emu::run(t);
                done += emu::finished[t];
            }
            if (done == block) break;
            if (done != 0) return -1;  // some returned, others wait at a barrier
        }
    }
    return 0;
}
