// kernels/cpu/topk_ivf.h — the approximate causal top-k of an inverted file whose clusters
// are refined as the keys arrive (ALGORITHMS.md §6.4; tie rule of §2.1). Per (b, h):
//
//   epochs   rows i < S_1 = first_epoch score every causal key (brute force); epoch e >= 1
//            holds the rows S_e <= i < S_{e+1} = 2 S_e
//   clusters at each S_e, from the keys 0..S_e - 1 alone (one cluster before S_1): a cluster
//            holding more than cluster_size (1.5 sqrt(S_e)) of them is cut by 2-means
//            bisection (topk_bisect.h) until no piece does, and each centroid becomes the
//            mean of its keys j < S_e; the keys S_e..S_{e+1} - 1 then join the nearest
//            centroid (the largest k . c - ||c||^2 / 2, the first on ties)
//   probe    query block i0..i1 - 1 (64 rows, one epoch): q . c for every cluster (sgemm);
//            each row scores whole clusters' keys j < i0 in decreasing q . c (ties to the
//            earlier cluster) until `budget` are scored (at least k keys in all), then its
//            own block's keys i0..i
//   S_i      the k best scored keys by (attention_dot desc, j asc)
//
// Shapes as in topk_brute.h; nothing is saved for a backward. No CUDA twin. The design
// decision: clusters are only ever cut, each from its own keys, never merged, so what the
// first epochs separate stays separate. Row i's list depends on q_i and keys 0..i only:
// causal, independent of T and of the batch; with budget >= T it is brute force bit for
// bit. Lists and statistics do not depend on the thread count; the centroid scores come
// from sgemm, so they may differ between machines, and a row's independence of T assumes
// that an sgemm entry does not depend on the call's row count (true of OpenBLAS's
// kernels). Cost: §6.4.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/cpu/topk_bisect.h"
#include "kernels/cpu/topk_panel.h"
#include "kernels/cpu/topk_probe.h"
#include "kernels/cpu/topk_select.h"

namespace knngpt::cpu {

constexpr int kTopkIvfGroupBlocks = 4;  // query blocks a work item takes: one sgemm for their centroid scores

struct TopkIvfParams {
    int first_epoch = 1024;  // rows below it are exact; epochs double from there (a multiple of 64)
    int cluster_size = 0;    // at epoch start S a cluster of more keys (of those before S) is cut;
                             // 0: max(16, round(1.5 sqrt(S)))
    int budget = -1;         // keys before the row's query block scored per row; < 0: max(budget_min, budget_per_k k)
    int budget_min = 128;
    int budget_per_k = 4;
    int iters = kTopkBisectIters;  // Lloyd rounds per bisection
};

// the most keys before S a cluster of the epoch starting at S holds (clusters of about
// sqrt(S) keys: about sqrt(S) of them, each a few budgets' worth; a cut keeps at least a
// quarter of this on each side)
inline int topk_ivf_cluster_size(const TopkIvfParams& p, int S) {
    return p.cluster_size > 0 ? p.cluster_size : std::max(16, (int)std::lround(1.5 * std::sqrt((double)S)));
}

inline int topk_ivf_budget(const TopkIvfParams& p, int k) {
    return p.budget >= 0 ? p.budget : std::max(p.budget_min, p.budget_per_k * k);
}

// one epoch's clusters, each with its keys below `end`. Each epoch packs every key before
// its end: about 2 T HS floats a head over all epochs, kept until the probe is done.
struct TopkIvfEpoch {
    int start = 0, end = 0;        // its rows [start, end)
    int num_clusters = 0;
    std::vector<float> centroids;  // (num_clusters, HS)
    std::vector<int> key_start;    // (num_clusters + 1)
    std::vector<int> keys;         // cluster c's at [key_start[c], key_start[c + 1]), ascending
    std::vector<int> chunk_start;  // (num_clusters + 1): cluster c's chunks of the panel
    std::vector<float> panel;      // (chunk_start[num_clusters], HS, 8)
};

// The epochs of one head (keys k_head[j * key_stride ..], j < T), see above.
inline std::vector<TopkIvfEpoch> topk_ivf_head_build(const float* k_head, size_t key_stride, int T, int HS,
                                                     const TopkIvfParams& p) {
    std::vector<TopkIvfEpoch> epochs;
    if (p.first_epoch >= T) return epochs;
    auto key = [&](int j) { return k_head + (size_t)j * key_stride; };
    // the clusters so far: their centroids and each key's cluster (keys below the epoch's end);
    // one cluster of the keys before the first epoch to start with
    int nc = 1;
    std::vector<float> centroid((size_t)HS), next_centroid, half_norm2, dots;
    std::vector<int> cluster_of((size_t)T, 0), start, pos, order;
    std::vector<float> x, scratch, p_side;
    std::vector<char> side;
    for (int S = p.first_epoch, E; S < T; S = E) {
        E = (int)std::min<long long>(2LL * S, T);
        // the keys j < S of each cluster, ascending (a counting sort by cluster)
        start.assign((size_t)nc + 1, 0);
        for (int j = 0; j < S; j++) start[cluster_of[j] + 1]++;
        for (int c = 0; c < nc; c++) start[c + 1] += start[c];
        pos.resize(S);
        for (int j = 0; j < S; j++) pos[start[cluster_of[j]]++] = j;
        topk_rewind_bucket_starts(start.data(), nc);
        // cut the clusters of more than `cut` keys until none has; every cluster's centroid
        // becomes the mean of its keys j < S
        const int cut = topk_ivf_cluster_size(p, S);
        int next_nc = 0;
        next_centroid.clear();
        for (int c = 0; c < nc; c++) {
            const int n = start[c + 1] - start[c];
            int* cpos = pos.data() + start[c];
            x.resize((size_t)n * HS);
            scratch.resize((size_t)n * HS);
            for (int v = 0; v < n; v++) std::copy(key(cpos[v]), key(cpos[v]) + HS, x.begin() + (size_t)v * HS);
            std::vector<std::pair<int, int>> pending{{0, n}};
            while (!pending.empty()) {
                const auto [lo, hi] = pending.back();
                pending.pop_back();
                if (hi - lo > cut) {
                    const int min_side = std::max(1, std::min((hi - lo) / 2, cut / 4));
                    const int mid =
                        topk_bisect(x.data(), cpos, lo, hi, HS, min_side, scratch.data(), p_side, side, order, p.iters);
                    pending.push_back({mid, hi});
                    pending.push_back({lo, mid});
                    continue;
                }
                next_centroid.resize((size_t)(next_nc + 1) * HS);
                topk_mean(next_centroid.data() + (size_t)next_nc * HS, x.data() + (size_t)lo * HS, hi - lo, HS);
                for (int v = lo; v < hi; v++) cluster_of[cpos[v]] = next_nc;
                next_nc++;
            }
        }
        nc = next_nc;
        centroid.swap(next_centroid);
        // the epoch's own keys j in [S, E) join the nearest centroid: the largest
        // k . c - ||c||^2 / 2 (the first on ties), in tiles of keys through sgemm
        half_norm2.resize(nc);
        for (int c = 0; c < nc; c++) {
            const float* cc = centroid.data() + (size_t)c * HS;
            half_norm2[c] = 0.5f * topk_dot_fast(cc, cc, HS);
        }
        constexpr int kTile = 256;
        dots.resize((size_t)kTile * nc);
        for (int j0 = S; j0 < E; j0 += kTile) {
            const int n = std::min(kTile, E - j0);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, nc, HS, 1.0f, key(j0), (int)key_stride,
                        centroid.data(), HS, 0.0f, dots.data(), nc);
            for (int u = 0; u < n; u++) {
                float* row = dots.data() + (size_t)u * nc;
                #pragma omp simd
                for (int c = 0; c < nc; c++) row[c] -= half_norm2[c];
                cluster_of[j0 + u] = topk_first_largest(row, nc);
            }
        }
        // the epoch: each cluster's keys j < E, ascending, packed
        TopkIvfEpoch ep;
        ep.start = S;
        ep.end = E;
        ep.num_clusters = nc;
        ep.centroids = centroid;
        ep.key_start.assign((size_t)nc + 1, 0);
        for (int j = 0; j < E; j++) ep.key_start[cluster_of[j] + 1]++;
        for (int c = 0; c < nc; c++) ep.key_start[c + 1] += ep.key_start[c];
        ep.keys.resize(E);
        for (int j = 0; j < E; j++) ep.keys[ep.key_start[cluster_of[j]]++] = j;
        topk_rewind_bucket_starts(ep.key_start.data(), nc);
        ep.chunk_start.assign((size_t)nc + 1, 0);
        for (int c = 0; c < nc; c++)
            ep.chunk_start[c + 1] = ep.chunk_start[c] + topk_num_chunks(ep.key_start[c + 1] - ep.key_start[c]);
        ep.panel.resize((size_t)ep.chunk_start[nc] * HS * kTopkLanes);
        for (int c = 0; c < nc; c++)
            topk_pack_chunks(ep.panel.data() + (size_t)ep.chunk_start[c] * HS * kTopkLanes,
                             ep.key_start[c + 1] - ep.key_start[c], HS,
                             [&](int u) { return key(ep.keys[ep.key_start[c] + u]); });
        epochs.push_back(std::move(ep));
    }
    return epochs;
}

inline void causal_topk_ivf(int* idx, const float* qkv, int B, int T, int C, int NH, int k,
                            const TopkIvfParams& p = TopkIvfParams(), TopkStats* stats = nullptr) {
    topk_check_shapes(B, T, C, NH, k);
    topk_check(p.first_epoch >= kTopkQueryBlock && p.first_epoch % kTopkQueryBlock == 0,
               "TopkIvfParams.first_epoch must be a positive multiple of 64");
    topk_check(p.cluster_size >= 0, "TopkIvfParams.cluster_size must be >= 0");
    // every row before the first epoch: the exact lists, which brute's sgemm search finds faster
    if (T <= p.first_epoch) return causal_topk_brute(idx, qkv, B, T, C, NH, k, stats);
    const int HS = C / NH;
    const size_t C3 = 3 * (size_t)C;
    const int budget = topk_ivf_budget(p, k);
    std::vector<std::vector<TopkIvfEpoch>> heads((size_t)B * NH);
    #pragma omp parallel for schedule(dynamic)
    for (int bh = 0; bh < B * NH; bh++)
        heads[bh] = topk_ivf_head_build(qkv + (size_t)(bh / NH) * T * C3 + C + (size_t)(bh % NH) * HS, C3, T, HS, p);
    int max_clusters = 1;
    for (const auto& epochs : heads)
        for (const TopkIvfEpoch& ep : epochs) max_clusters = std::max(max_clusters, ep.num_clusters);
    // the work items: per (b, h), runs of at most kTopkIvfGroupBlocks query blocks in one epoch
    // (or all before the first), the last first (they see the most keys)
    struct Group {
        int bh, blk0, blk1, epoch;  // epoch -1: before the first
    };
    const int QB = kTopkQueryBlock;
    const int num_qblocks = topk_num_query_blocks(T);
    std::vector<Group> groups;
    for (int bh = 0; bh < B * NH; bh++) {
        const std::vector<TopkIvfEpoch>& epochs = heads[bh];
        for (int blk = 0; blk < num_qblocks;) {
            int e = -1;
            for (int u = 0; u < (int)epochs.size(); u++)
                if (epochs[u].start <= blk * QB && blk * QB < epochs[u].end) e = u;
            const int end_blk = e < 0 ? std::min(num_qblocks, p.first_epoch / QB) : topk_num_query_blocks(epochs[e].end);
            const int blk1 = std::min(end_blk, blk + kTopkIvfGroupBlocks);
            groups.push_back({bh, blk, blk1, e});
            blk = blk1;
        }
    }
    std::reverse(groups.begin(), groups.end());
    const int G = kTopkIvfGroupBlocks;
    long long scores_computed = 0, blocks_visited = 0, blocks_total = 0;
    #pragma omp parallel reduction(+ : scores_computed, blocks_visited, blocks_total)
    {
        const size_t ld_c = (size_t)(max_clusters + 15) / 16 * 16;
        std::vector<float> cscore((size_t)G * QB * ld_c);      // (rows, clusters): q . c
        std::vector<int32_t> avail(ld_c);                      // one row's, as order keys; INT32_MIN: taken
        std::vector<int> causal((size_t)G * ld_c);             // per block of the group: each cluster's keys j < i0
        std::vector<int> probe_start((size_t)G * QB + 1), probes, rows;
        std::vector<const float*> chunk_ptr;
        std::vector<float> scores, own_panel;
        TopkScoredKeys cand(k, T + QB);
        #pragma omp for schedule(dynamic)
        for (size_t item = 0; item < groups.size(); item++) {
            const auto [bh, blk0, blk1, e] = groups[item];
            const int b = bh / NH, h = bh % NH;
            const TopkIvfEpoch* ep = e >= 0 ? &heads[bh][e] : nullptr;
            const int nc = ep ? ep->num_clusters : 0;
            const float* q_head = qkv + (size_t)b * T * C3 + (size_t)h * HS;
            const int g0 = blk0 * QB, g1 = std::min(T, blk1 * QB);  // the group's rows
            // the rows' own keys, own_base..g1 - 1 in order (before the first epoch: all their keys)
            const int own_base = ep ? g0 : 0;
            own_panel.resize((size_t)topk_num_chunks(g1 - own_base) * HS * kTopkLanes);
            topk_pack_chunks(own_panel.data(), g1 - own_base, HS, [&](int u) { return q_head + C + (size_t)(own_base + u) * C3; });
            if (ep) {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g1 - g0, nc, HS, 1.0f, q_head + (size_t)g0 * C3,
                            (int)C3, ep->centroids.data(), HS, 0.0f, cscore.data(), (int)ld_c);
                for (int blk = blk0; blk < blk1; blk++)
                    for (int c = 0; c < nc; c++) {
                        const int* first = ep->keys.data() + ep->key_start[c];
                        causal[(blk - blk0) * ld_c + c] =
                            (int)(std::lower_bound(first, ep->keys.data() + ep->key_start[c + 1], blk * QB) - first);
                    }
            }
            // each searching row's clusters: whole clusters in centroid order until the budget
            // is spent (at least k keys in all: a short own block leaves more to the clusters)
            rows.clear();
            probes.clear();
            for (int blk = blk0; blk < blk1; blk++) {
                const auto [i0, i1, i_search] = topk_query_rows(idx, b, h, num_qblocks - 1 - blk, T, NH, k);
                const int* causal_blk = causal.data() + (blk - blk0) * ld_c;
                for (int i = i_search; i < i1; i++) {
                    probe_start[rows.size()] = (int)probes.size();
                    rows.push_back(i);
                    if (!ep) continue;
                    const float* cs = cscore.data() + (size_t)(i - g0) * ld_c;
                    for (int c = 0; c < nc; c++) avail[c] = causal_blk[c] > 0 ? topk_order_key(cs[c] + 0.0f) : INT32_MIN;
                    std::fill(avail.begin() + nc, avail.end(), INT32_MIN);
                    const int row_budget = std::max(budget, k - (i + 1 - i0));
                    for (int spent = 0; spent < row_budget;) {
                        const int c = topk_pop_best(avail.data(), (int)ld_c);
                        if (c < 0) break;  // every key before i0 is in
                        probes.push_back(c);
                        spent += causal_blk[c];
                    }
                    blocks_total += nc;
                }
            }
            const int n_rows = (int)rows.size();
            probe_start[n_rows] = (int)probes.size();
            for (int r = 0; r < n_rows; r++) {
                const int i = rows[r], i0 = i / QB * QB, own0 = ep ? i0 : 0;
                const int* causal_blk = causal.data() + (i0 / QB - blk0) * ld_c;
                const float* q = q_head + (size_t)i * C3;
                // one pass over the chunks of its clusters' keys j < i0, then of its own keys own0..i
                chunk_ptr.clear();
                for (int u = probe_start[r]; u < probe_start[r + 1]; u++) {
                    const int c = probes[u];
                    for (int ch = 0; ch < topk_num_chunks(causal_blk[c]); ch++)
                        chunk_ptr.push_back(ep->panel.data() + (size_t)(ep->chunk_start[c] + ch) * HS * kTopkLanes);
                }
                for (int ch = (own0 - own_base) / kTopkLanes; ch < topk_num_chunks(i + 1 - own_base); ch++)
                    chunk_ptr.push_back(own_panel.data() + (size_t)ch * HS * kTopkLanes);
                // padded to whole groups of 8 (the last chunk again): 8 chains in flight cost what
                // a lone chunk's latency does
                const size_t n_chunks = chunk_ptr.size();
                chunk_ptr.resize((n_chunks + 7) / 8 * 8, chunk_ptr.back());
                scores.resize(chunk_ptr.size() * kTopkLanes);
                topk_score_chunk_ptrs(scores.data(), q, chunk_ptr.data(), (int)chunk_ptr.size(), HS);
                // the clusters' keys, then the own ones: by then most fail the k-th best test
                cand.clear();
                const float* sc = scores.data();
                for (int u = probe_start[r]; u < probe_start[r + 1]; u++) {
                    const int c = probes[u], n = causal_blk[c];
                    cand.append(sc, ep->keys.data() + ep->key_start[c], 0, n);
                    if (cand.n >= 2 * k || (cand.kth_order == INT32_MIN && cand.n >= k)) cand.settle();
                    sc += (size_t)topk_num_chunks(n) * kTopkLanes;
                    scores_computed += n;
                }
                cand.append(sc, nullptr, own0, i + 1 - own0);
                scores_computed += i + 1 - own0;
                blocks_visited += probe_start[r + 1] - probe_start[r];
                cand.write(idx + topk_idx_row(b, h, i, T, NH, k));
            }
        }
    }
    if (stats) {
        stats->scores_computed += scores_computed;
        stats->blocks_visited += blocks_visited;
        stats->blocks_total += blocks_total;
    }
}

}  // namespace knngpt::cpu
