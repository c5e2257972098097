// Runs kernels/sampling.cu on the CPU (see cuda_on_cpu.h). Reads rows from stdin:
//   rows vocab words
//   then per row: temperature top_k top_p uniform has_mask, the mask's `words` words if it has
//   one, and `vocab` logits as the hexadecimal bits of f32 values;
// writes one token (or -1) per row to stdout.
#include "cuda_on_cpu.h"
#include "../sampling.cu"

#include <cstdio>
#include <thread>

int main() {
    int rows, vocab, words;
    if (std::scanf("%d %d %d", &rows, &vocab, &words) != 3) return 2;
    std::vector<float> logits((size_t)rows * vocab), temperature(rows), top_p(rows), uniform(rows);
    std::vector<int32_t> top_k(rows), mask_of_row(rows, -1), out(rows, -7);
    std::vector<uint32_t> masks;
    for (int r = 0; r < rows; r++) {
        int has_mask;
        if (std::scanf("%f %d %f %f %d", &temperature[r], &top_k[r], &top_p[r], &uniform[r], &has_mask) != 5) return 2;
        if (has_mask) {
            mask_of_row[r] = (int)(masks.size() / words);
            for (int w = 0; w < words; w++) {
                unsigned x;
                if (std::scanf("%x", &x) != 1) return 2;
                masks.push_back(x);
            }
        }
        for (int i = 0; i < vocab; i++) {
            unsigned bits;
            if (std::scanf("%x", &bits) != 1) return 2;
            std::memcpy(&logits[(size_t)r * vocab + i], &bits, 4);
        }
    }
    if (masks.empty()) masks.push_back(0);
    for (int r = 0; r < rows; r++) {
        Block block;
        block.all = std::make_unique<std::barrier<>>(THREADS);
        for (int w = 0; w < WARPS; w++) block.warps.push_back(std::make_unique<std::barrier<>>(32));
        block.lanes.assign(THREADS, 0);
        g_block = &block;
        std::vector<std::thread> threads;
        for (int t = 0; t < THREADS; t++) {
            threads.emplace_back([&, t] {
                threadIdx.x = t;
                blockIdx.x = r;
                throng_sample_rows(logits.data(), vocab, masks.data(), words, mask_of_row.data(),
                                   temperature.data(), top_k.data(), top_p.data(), uniform.data(),
                                   out.data());
            });
        }
        for (auto& th : threads) th.join();
    }
    for (int r = 0; r < rows; r++) std::printf("%d\n", out[r]);
    return 0;
}
