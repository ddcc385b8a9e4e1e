// kernels/cpu/topk_select.h — what the CPU top-k indexes share: the selection of the k
// best keys, the layout of the output rows, the query blocks, the statistics and the
// argument checks (ALGORITHMS.md §2.1, §9.2).
//
//   rank    key a above key b  iff  s_a > s_b, or s_a == s_b and a < b   (ties to the smaller index)
//   select  TopkSelector(k): of the (score, key) pairs offered in any order, the k ranked
//           highest, written in ascending key order. A size-k heap whose root is the lowest
//           of the current best k; once it is full a key enters iff it ranks above the root.
//   rows    idx (B, NH, T, k), row (b, h, i) at topk_idx_row: its keys ascending; a row with
//           i + 1 <= k causal keys holds 0..i, then -1 (topk_write_all_keys)
//   blocks  the OpenMP work items: kTopkQueryBlock consecutive queries of one (b, h), the
//           last block first (it sees the most keys; topk_query_rows)
//   stats   TopkStats (kernels/common/attention_params.h), accumulated with +=, only over
//           the rows that search (i + 1 > k)
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/common/attention_params.h"
#include "kernels/cpu/topk_panel.h"

namespace knngpt::cpu {

using knngpt::TopkStats;

constexpr int kTopkQueryBlock = 64;  // queries per OpenMP work item

// a failed argument check: the message, then abort (messages name the public header)
inline void topk_check(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "kernels/cpu/topk_index.h: %s\n", what);
        std::abort();
    }
}

// offset of row (b, h, i) of idx (B, NH, T, k)
inline size_t topk_idx_row(int b, int h, int i, int T, int NH, int k) {
    return (((size_t)b * NH + h) * T + i) * (size_t)k;
}

// ----------------------------------------------------------------------------
// selection

struct TopkCandidate {
    float score;
    int key;
};

// a ranks above b: a larger score, ties to the smaller key index (§2.1)
inline bool topk_ranks_above(const TopkCandidate& a, const TopkCandidate& b) {
    return a.score > b.score || (a.score == b.score && a.key < b.key);
}

// A size-k heap whose root is the lowest-ranked of the current best k.
class TopkSelector {
public:
    explicit TopkSelector(int k) : k_(k), size_(0), heap_((size_t)k) {}
    void clear() { size_ = 0; }
    int size() const { return size_; }
    bool full() const { return size_ == k_; }
    // the current k-th best (valid when full())
    const TopkCandidate& lowest() const { return heap_[0]; }
    // whether a key with this score could enter (a cheap filter before offer)
    bool may_enter(float score) const { return size_ < k_ || score >= heap_[0].score; }

    void offer(float score, int key) {
        const TopkCandidate cand{score, key};
        if (size_ < k_) {  // sift up from the new leaf
            int pos = size_++;
            while (pos > 0) {
                const int parent = (pos - 1) / 2;
                if (!topk_ranks_above(heap_[parent], cand)) break;
                heap_[pos] = heap_[parent];
                pos = parent;
            }
            heap_[pos] = cand;
            return;
        }
        if (!topk_ranks_above(cand, heap_[0])) return;
        // replace the root and sift down
        int pos = 0;
        for (;;) {
            int child = 2 * pos + 1;
            if (child >= k_) break;
            if (child + 1 < k_ && topk_ranks_above(heap_[child], heap_[child + 1])) child++;
            if (!topk_ranks_above(cand, heap_[child])) break;
            heap_[pos] = heap_[child];
            pos = child;
        }
        heap_[pos] = cand;
    }

    // offer keys first_key, first_key + 1, .. with scores[0..n): one comparison per
    // key once the heap is full (a key must score >= the k-th best to enter)
    void offer_range(const float* scores, int n, int first_key) {
        offer_each(scores, n, [first_key](int s) { return first_key + s; });
    }
    // the same for keys[0..n) with scores[0..n)
    void offer_list(const float* scores, const int* keys, int n) {
        offer_each(scores, n, [keys](int s) { return keys[s]; });
    }

    // the selected keys in ascending order into dst[0..size()); returns size()
    int write_sorted(int* dst) const {
        for (int s = 0; s < size_; s++) dst[s] = heap_[s].key;
        std::sort(dst, dst + size_);
        return size_;
    }

private:
    template <class KeyOf>
    void offer_each(const float* scores, int n, KeyOf key_of) {
        int s = 0;
        for (; s < n && !full(); s++) offer(scores[s], key_of(s));
        if (s == n) return;
        float kth = heap_[0].score;
        // eight at a time: most groups have no key reaching the k-th best
        for (; s + kTopkLanes <= n; s += kTopkLanes) {
            int reaching = 0;
            for (int l = 0; l < kTopkLanes; l++) reaching |= scores[s + l] >= kth;
            if (!reaching) continue;
            for (int l = 0; l < kTopkLanes; l++) {
                if (scores[s + l] >= kth) {
                    offer(scores[s + l], key_of(s + l));
                    kth = heap_[0].score;
                }
            }
        }
        for (; s < n; s++) {
            if (scores[s] >= kth) {
                offer(scores[s], key_of(s));
                kth = heap_[0].score;
            }
        }
    }

    int k_, size_;
    std::vector<TopkCandidate> heap_;
};

// a row with i + 1 <= k keys: all of them, then -1
inline void topk_write_all_keys(int* row, int i, int k) {
    for (int s = 0; s < k; s++) row[s] = s <= i ? s : -1;
}

inline void topk_check_shapes(int B, int T, int C, int NH, int k) {
    topk_check(B >= 1 && T >= 1 && NH >= 1, "B, T and NH must be >= 1");
    topk_check(C % NH == 0, "C must be a multiple of NH");
    topk_check(k >= 1, "k must be >= 1");
}

// ----------------------------------------------------------------------------
// query blocks: the OpenMP work items of the brute reference and the ivf probe

inline int topk_num_query_blocks(int T) { return (T + kTopkQueryBlock - 1) / kTopkQueryBlock; }

// rows [i0, i1) of query block blk of (b, h), those from i_search on search
struct TopkQueryRows {
    int i0, i1, i_search;
};

// Query block blk counts from the end (the last blocks see the most keys: they are handed
// out first). Writes the block's rows i < k, which take every key, and returns its rows.
inline TopkQueryRows topk_query_rows(int* idx, int b, int h, int blk, int T, int NH, int k) {
    const int i0 = (topk_num_query_blocks(T) - 1 - blk) * kTopkQueryBlock;
    const int i1 = std::min(i0 + kTopkQueryBlock, T);
    const int i_search = std::max(i0, std::min(k, i1));
    for (int i = i0; i < i_search; i++) topk_write_all_keys(idx + topk_idx_row(b, h, i, T, NH, k), i, k);
    return {i0, i1, i_search};
}

// A counting sort into buckets: count item x at start[bucket(x) + 1], take prefix sums,
// place x at start[bucket(x)]++; that last pass leaves start[u] at the end of bucket u,
// and this moves the entries back to the starts (start has num_buckets + 1 entries).
inline void topk_rewind_bucket_starts(int* start, int num_buckets) {
    for (int u = num_buckets; u > 0; u--) start[u] = start[u - 1];
    start[0] = 0;
}

}  // namespace knngpt::cpu
