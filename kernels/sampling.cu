// Grammar masks and token sampling on the device, so that a step downloads one token id per
// sampled row instead of a row of logits (400 agents x 128k vocabulary x 4 bytes = 200 MB).
//
// One thread block of THREADS threads per row. Thread t owns the contiguous index range
// [t * chunk, (t + 1) * chunk) of the vocabulary and walks it in order, so that "in index
// order" (ties broken by the lowest id, the inverse-CDF walk) is a per-thread walk plus a
// block-wide scan. Everything that decides which token is drawn is computed in integers
// (fixed-point weights, radix selection), so a row's result does not depend on the order in
// which threads happen to run: the same logits, parameters and uniform draw give the same token.
//
// Semantics (src/engine/cuda_sampling.rs mirrors them on the host for the tests):
// - a token is a candidate if the row's mask (if any) allows it and its logit is finite;
// - greedy (temperature <= 0 or top_k == 1): the candidate with the largest logit, the lowest
//   id among equals;
// - otherwise scores s = logit * (1 / temperature); top_k keeps the k largest (ties at the k-th
//   value by lowest id); top_p then keeps the smallest set of highest scores whose probability
//   reaches top_p (all tokens tied at the boundary score stay); a token is drawn from what is
//   kept with probability proportional to exp(s - max), by walking the kept tokens in id order
//   until the running weight exceeds uniform * total.
// The output is the token id, or -1 when no token is a candidate.

#ifndef THRONG_EMULATED
#include <stdint.h>
#endif

#ifndef THREADS
#define THREADS 1024
#endif
#define WARPS (THREADS / 32)
// Weights exp(s - max) in (0, 1] as fixed point: 2^40 per unit. A row of 2^17 tokens sums
// below 2^57, inside 64 bits; a weight below 2^-40 of the best counts as 0.
#define WEIGHT_ONE 1099511627776.0

typedef unsigned long long u64;

__device__ __forceinline__ uint32_t order_key(float s) {
    // Larger float -> larger key, over all finite floats.
    uint32_t u = __float_as_uint(s);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ u64 weight(float s, float max) {
    return (u64)(__expf(s - max) * WEIGHT_ONE);
}

struct Row {
    const float* logits;
    const uint32_t* mask;  // null: no mask
    int vocab;
    float inv_t;
};

__device__ __forceinline__ bool candidate(const Row& r, int i, float* score) {
    float l = r.logits[i];
    if (r.mask != nullptr && !((r.mask[i >> 5] >> (i & 31)) & 1u)) return false;
    if (!isfinite(l)) return false;
    *score = l * r.inv_t;
    return true;
}

// Block-wide reductions and scans over THREADS threads (every thread must call them).
__device__ u64 block_sum(u64 x, u64* scratch) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    if (warp == 0) {
        x = lane < WARPS ? scratch[lane] : 0;
        for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
        if (lane == 0) scratch[0] = x;
    }
    __syncthreads();
    u64 total = scratch[0];
    __syncthreads();
    return total;
}

// Exclusive prefix sum over threads in thread order; `*total` gets the sum of all.
__device__ u64 block_exclusive_scan(u64 x, u64* scratch, u64* total) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    u64 inclusive = x;
    for (int o = 1; o < 32; o <<= 1) {
        u64 y = __shfl_up_sync(0xffffffffu, inclusive, o);
        if (lane >= o) inclusive += y;
    }
    __syncthreads();
    if (lane == 31) scratch[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
        u64 w = lane < WARPS ? scratch[lane] : 0;
        u64 wi = w;
        for (int o = 1; o < 32; o <<= 1) {
            u64 y = __shfl_up_sync(0xffffffffu, wi, o);
            if (lane >= o) wi += y;
        }
        if (lane < WARPS) scratch[lane] = wi - w;  // exclusive over warps
        if (lane == WARPS - 1) scratch[WARPS] = wi;
    }
    __syncthreads();
    u64 result = scratch[warp] + inclusive - x;
    *total = scratch[WARPS];
    __syncthreads();
    return result;
}

__device__ float block_max(float x, float* scratch) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_down_sync(0xffffffffu, x, o));
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    if (warp == 0) {
        x = lane < WARPS ? scratch[lane] : -INFINITY;
        for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_down_sync(0xffffffffu, x, o));
        if (lane == 0) scratch[0] = x;
    }
    __syncthreads();
    float m = scratch[0];
    __syncthreads();
    return m;
}

// Which tokens the top-k cut keeps: keys above `above_key`, and the first `ties_kept` tokens
// (in id order) whose key equals it. Each thread walks its chunk in order and counts the ties
// it has seen after `tie_base` ties in the chunks before it.
struct TopK {
    bool active;
    uint32_t key;
    u64 ties_kept;
};

__device__ __forceinline__ bool kept_by_k(const TopK& k, uint32_t key, u64* ties_seen) {
    if (!k.active || key > k.key) return true;
    if (key < k.key) return false;
    return (*ties_seen)++ < k.ties_kept;
}

extern "C" __global__ void throng_sample_rows(
    const float* __restrict__ logits,       // (rows, vocab), row-major
    int vocab,
    const uint32_t* __restrict__ masks,     // (mask_rows, words): bit i of a row allows token i
    int words,
    const int32_t* __restrict__ mask_of_row,  // (rows,): a row of `masks`, or -1 for none
    const float* __restrict__ temperature,  // (rows,): <= 0 is greedy
    const int32_t* __restrict__ top_k,      // (rows,): 0 keeps all
    const float* __restrict__ top_p,        // (rows,): 1 keeps all
    const float* __restrict__ uniform,      // (rows,): the row's draw in [0, 1)
    int32_t* __restrict__ out)              // (rows,): the token, or -1
{
    __shared__ u64 scratch[WARPS + 1];
    __shared__ float fscratch[WARPS];
    __shared__ u64 hist[256];
    __shared__ int best_index[WARPS];
    __shared__ float best_value[WARPS];

    const int row = blockIdx.x;
    const int tid = threadIdx.x;
    const int chunk = (vocab + THREADS - 1) / THREADS;
    const int lo = min(tid * chunk, vocab), hi = min(lo + chunk, vocab);

    Row r;
    r.logits = logits + (size_t)row * vocab;
    r.mask = mask_of_row[row] >= 0 ? masks + (size_t)mask_of_row[row] * words : nullptr;
    r.vocab = vocab;
    const float t = temperature[row];
    const int k = top_k[row];
    const bool greedy = t <= 0.0f || k == 1;
    r.inv_t = greedy ? 1.0f : 1.0f / t;

    // 1. The best candidate (greedy) or the largest score, and how many candidates there are.
    float best = -INFINITY;
    int best_i = -1;
    u64 count = 0;
    for (int i = lo; i < hi; i++) {
        float s;
        if (!candidate(r, i, &s)) continue;
        count++;
        if (s > best) { best = s; best_i = i; }
    }
    const u64 candidates = block_sum(count, scratch);
    if (candidates == 0) {
        if (tid == 0) out[row] = -1;
        return;
    }
    if (greedy) {
        // Largest value, then lowest index: chunks are in index order and each thread kept
        // its first maximum, so the lowest index among equal maxima wins the reduction.
        float v = best_i >= 0 ? best : -INFINITY;
        int idx = best_i >= 0 ? best_i : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1) {
            float v2 = __shfl_down_sync(0xffffffffu, v, o);
            int i2 = __shfl_down_sync(0xffffffffu, idx, o);
            if (v2 > v || (v2 == v && i2 < idx)) { v = v2; idx = i2; }
        }
        int warp = tid / 32, lane = tid % 32;
        if (lane == 0) { best_value[warp] = v; best_index[warp] = idx; }
        __syncthreads();
        if (tid == 0) {
            float bv = best_value[0];
            int bi = best_index[0];
            for (int w = 1; w < WARPS; w++) {
                if (best_value[w] > bv || (best_value[w] == bv && best_index[w] < bi)) {
                    bv = best_value[w];
                    bi = best_index[w];
                }
            }
            out[row] = bi;
        }
        return;
    }
    const float max = block_max(best_i >= 0 ? best : -INFINITY, fscratch);

    // 2. top-k: the k-th largest key by radix selection, 8 bits at a time from the top.
    TopK cut;
    cut.active = k > 0 && (u64)k < candidates;
    cut.key = 0;
    cut.ties_kept = 0;
    u64 tie_base = 0;
    if (cut.active) {
        uint32_t prefix = 0, prefix_mask = 0;
        u64 above = 0;  // keys greater than the selected prefix range
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int b = tid; b < 256; b += THREADS) hist[b] = 0;
            __syncthreads();
            for (int i = lo; i < hi; i++) {
                float s;
                if (!candidate(r, i, &s)) continue;
                uint32_t key = order_key(s);
                if ((key & prefix_mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1ull);
            }
            __syncthreads();
            if (tid == 0) {
                int b = 255;
                for (; b > 0; b--) {
                    if (above + hist[b] >= (u64)k) break;
                    above += hist[b];
                }
                scratch[0] = (u64)b;
                scratch[1] = above;
            }
            __syncthreads();
            prefix |= (uint32_t)scratch[0] << shift;
            prefix_mask |= 255u << shift;
            above = scratch[1];
            __syncthreads();
        }
        cut.key = prefix;
        cut.ties_kept = (u64)k - above;
        // Ties at the cut are kept in id order: each thread's first tie rank.
        u64 ties = 0;
        for (int i = lo; i < hi; i++) {
            float s;
            if (candidate(r, i, &s) && order_key(s) == cut.key) ties++;
        }
        u64 total_ties;
        tie_base = block_exclusive_scan(ties, scratch, &total_ties);
    }

    // 3. The kept weight after top-k.
    u64 mass = 0;
    {
        u64 seen = tie_base;
        for (int i = lo; i < hi; i++) {
            float s;
            if (!candidate(r, i, &s)) continue;
            if (kept_by_k(cut, order_key(s), &seen)) mass += weight(s, max);
        }
    }
    const u64 kept_mass = block_sum(mass, scratch);

    // 4. top-p: the score at which the weight of higher-or-equal scores first reaches
    //    top_p of the kept weight, by radix selection over weights.
    uint32_t p_key = 0;
    const float p = top_p[row];
    if (p < 1.0f) {
        double goal_f = ceil((double)p * (double)kept_mass);
        u64 goal = goal_f < 1.0 ? 1 : (u64)goal_f;
        uint32_t prefix = 0, prefix_mask = 0;
        u64 above = 0;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int b = tid; b < 256; b += THREADS) hist[b] = 0;
            __syncthreads();
            u64 seen = tie_base;
            for (int i = lo; i < hi; i++) {
                float s;
                if (!candidate(r, i, &s)) continue;
                uint32_t key = order_key(s);
                if (!kept_by_k(cut, key, &seen)) continue;
                if ((key & prefix_mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], weight(s, max));
            }
            __syncthreads();
            if (tid == 0) {
                int b = 255;
                for (; b > 0; b--) {
                    if (above + hist[b] >= goal) break;
                    above += hist[b];
                }
                scratch[0] = (u64)b;
                scratch[1] = above;
            }
            __syncthreads();
            prefix |= (uint32_t)scratch[0] << shift;
            prefix_mask |= 255u << shift;
            above = scratch[1];
            __syncthreads();
        }
        p_key = prefix;
    }

    // 5. The draw: walk the kept tokens in id order until the running weight passes
    //    uniform * total.
    u64 mine = 0;
    int last_kept = -1;
    {
        u64 seen = tie_base;
        for (int i = lo; i < hi; i++) {
            float s;
            if (!candidate(r, i, &s)) continue;
            uint32_t key = order_key(s);
            if (!kept_by_k(cut, key, &seen) || key < p_key) continue;
            mine += weight(s, max);
            last_kept = i;
        }
    }
    u64 total;
    const u64 base = block_exclusive_scan(mine, scratch, &total);
    u64 target = (u64)((double)uniform[row] * (double)total);
    if (target >= total) target = total - 1;
    if (target >= base && target < base + mine) {
        u64 running = base;
        u64 seen = tie_base;
        for (int i = lo; i < hi; i++) {
            float s;
            if (!candidate(r, i, &s)) continue;
            uint32_t key = order_key(s);
            if (!kept_by_k(cut, key, &seen) || key < p_key) continue;
            running += weight(s, max);
            if (running > target) {
                out[row] = i;
                return;
            }
        }
        // Not reached: the chunk's weights sum past the target. Kept as a safe answer.
        out[row] = last_kept;
    }
}
