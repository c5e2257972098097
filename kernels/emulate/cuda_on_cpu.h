// Just enough of CUDA to run kernels/sampling.cu on the CPU, one thread block at a time, with
// one OS thread per CUDA thread: shared memory is function-static, __syncthreads is a barrier
// over the block, warp shuffles exchange through a per-warp buffer between two warp barriers.
// It checks the kernel's logic (src/engine/device_sampling.rs runs it against its mirror); it
// says nothing about speed, and it needs THREADS small (64) to stay quick.
#pragma once
#define THRONG_EMULATED 1

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static

struct Dim3 { unsigned x = 0, y = 0, z = 0; };
inline thread_local Dim3 threadIdx;
inline thread_local Dim3 blockIdx;

struct Block {
    std::unique_ptr<std::barrier<>> all;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    std::vector<uint64_t> lanes;  // one 8-byte slot per thread
};
inline Block* g_block = nullptr;

inline void __syncthreads() { g_block->all->arrive_and_wait(); }

template <typename T>
inline T shfl(T v, int src_lane) {
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    auto& bar = *g_block->warps[warp];
    uint64_t raw = 0;
    std::memcpy(&raw, &v, sizeof(T));
    g_block->lanes[threadIdx.x] = raw;
    bar.arrive_and_wait();
    T out = v;
    if (src_lane >= 0 && src_lane < 32) {
        std::memcpy(&out, &g_block->lanes[warp * 32 + src_lane], sizeof(T));
    }
    bar.arrive_and_wait();
    (void)lane;
    return out;
}

template <typename T>
inline T __shfl_down_sync(unsigned, T v, int o) {
    const int lane = threadIdx.x % 32;
    return lane + o < 32 ? shfl(v, lane + o) : shfl(v, -1);
}

template <typename T>
inline T __shfl_up_sync(unsigned, T v, int o) {
    const int lane = threadIdx.x % 32;
    return lane - o >= 0 ? shfl(v, lane - o) : shfl(v, -1);
}

inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}

inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

inline float __expf(float x) { return std::exp(x); }
inline int min(int a, int b) { return a < b ? a : b; }
using std::ceil;
using std::fmaxf;
using std::isfinite;
