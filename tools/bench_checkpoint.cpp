// tools/bench_checkpoint.cpp — what the checkpoint's checksums and fsyncs
// cost: one checkpoint (model file + training state) of a model of P
// parameters written as the trainer writes it (model/checkpoint.h:
// write_checkpoint, XXH64 of both files, fsync of each and of the directory),
// against a baseline measured in the same run: the same bytes written with
// plain fwrite + fclose into the same directory (no checksum, no fsync). Also
// the checksums alone (the bytes write_checkpoint hashes: the parameters, m
// and v, once each) and the hash's speed in GB/s. Medians of the repetitions.
//
//   make build/bench_checkpoint && build/bench_checkpoint [--params P] [--reps N] [--dir DIR]
//   (defaults: 10.8M parameters, the 12L/256 model of the example; 5 reps; DIR build/bench_checkpoint_dir)
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "model/checkpoint.h"

using namespace knngpt;

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

template <class F>
static double ms_of(F f) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int main(int argc, char** argv) {
    long params = 10800000;
    int reps = 5;
    std::string dir = "build/bench_checkpoint_dir";
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string flag = argv[i];
        if (flag == "--params") params = std::atol(argv[i + 1]);
        else if (flag == "--reps") reps = std::atoi(argv[i + 1]);
        else if (flag == "--dir") dir = argv[i + 1];
        else { fprintf(stderr, "bench_checkpoint: unknown flag '%s'\n", flag.c_str()); return 1; }
    }
    // a config of about `params` parameters: C = 256 (vocab 256), as many layers as fit
    GPTConfig c;
    c.channels = 256, c.num_heads = 4, c.max_seq_len = 256, c.vocab_size = 256, c.padded_vocab_size = 256;
    c.num_layers = std::max(1L, (params - 2L * 256 * 256) / (12L * 256 * 256 + 13L * 256));
    const std::vector<float> weights = gpt_random_init(c, 1);
    TrainState st;
    st.m.assign(weights.size(), 0.25f);
    st.v.assign(weights.size(), 0.5f);
    mkdir(dir.c_str(), 0755);
    const std::string model = dir + "/model_00000001.bin", state = dir + "/state_00000001.bin";
    const double mb = (double)(weights.size() * 4 * 3 + 2048) / 1e6;
    printf("checkpoint of %zu parameters (L %d, C 256): %.1f MB (model + state) in %s, %d reps\n", weights.size(),
           c.num_layers, mb, dir.c_str(), reps);

    std::vector<double> plain, ours, hash;
    for (int r = 0; r < reps; r++) {
        plain.push_back(ms_of([&] {
            for (const auto& [path, parts] :
                 {std::pair{model, std::vector<const std::vector<float>*>{&weights}},
                  std::pair{state, std::vector<const std::vector<float>*>{&st.m, &st.v}}}) {
                FILE* f = fopen((path + ".plain").c_str(), "wb");
                int header[HEADER_INTS] = {0};
                fwrite(header, sizeof(header), 1, f);
                for (const auto* p : parts) fwrite(p->data(), sizeof(float), p->size(), f);
                fclose(f);
            }
        }));
        ours.push_back(ms_of([&] { write_checkpoint(model, state, c, weights, st); }));
        uint64_t sink = 0;
        hash.push_back(ms_of([&] {
            sink ^= xxh64(weights.data(), weights.size() * 4);
            sink ^= xxh64(st.m.data(), st.m.size() * 4) ^ xxh64(st.v.data(), st.v.size() * 4);
        }));
        if (sink == 42) printf(" ");
    }
    for (const std::string& p : {model, state, model + ".plain", state + ".plain"}) std::remove(p.c_str());
    const double p = median(plain), o = median(ours), h = median(hash);
    printf("plain fwrite + fclose (baseline): %8.1f ms\n", p);
    printf("write_checkpoint (xxh64 + fsync): %8.1f ms   ratio to baseline %.2f\n", o, o / p);
    printf("of which the checksums:           %8.1f ms   %.1f%% of write_checkpoint, %.2f GB/s\n", h, 100.0 * h / o,
           mb / 1e3 / (h / 1e3));
    return 0;
}
