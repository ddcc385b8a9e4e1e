// kernels/cpu/topk_panel_scores.h — the bodies of the panel score routines, written
// once against a lane backend: TopkLaneVec (8 fp32 lanes) and topk_lanes_zero, _load,
// _store, _fma (lane l: acc_l = fma(a, b_l, acc_l), one rounding). topk_panel.h includes
// this file inside each backend's namespace (the AVX/FMA one under its target options
// where the build itself has no FMA); it is not a header of its own: no include guard.
//
//   topk_score_chunk_group<N>  N chunks, one query (q[d * q_step]): N independent chains
//   topk_score_chunks          one query against chunks [c0, c1): groups of 8, 4, then 1
//   topk_score_chunks_4q       four interleaved queries against chunks [0, c1): 2 x 4 chains
//   topk_score_chunk_list      one query against listed chunks: groups of 8, then 1
//   topk_score_chunk_ptrs      one query against chunks by address: groups of 8, 4, then 1
// Each lane's chain is attention_dot's, whatever the grouping (topk_panel.h).

// N independent chains (N chunks in flight keep both fma ports busy): the scores of the
// query q[d * q_step] against the 8 keys of each chunk[u] into out[u * 8 + l]
template <int N>
inline void topk_score_chunk_group(float* out, const float* q, int q_step, const float* const* chunk, int HS) {
    TopkLaneVec acc[N];
    for (int u = 0; u < N; u++) acc[u] = topk_lanes_zero();
    for (int d = 0; d < HS; d++) {
        const float qd = q[d * q_step];
        for (int u = 0; u < N; u++) acc[u] = topk_lanes_fma(qd, topk_lanes_load(chunk[u] + d * kTopkLanes), acc[u]);
    }
    for (int u = 0; u < N; u++) topk_lanes_store(out + u * kTopkLanes, acc[u]);
}

// scores of one query q against chunks [c0, c1) of a panel: out[(c - c0) * 8 + l];
// eight chunks (64 keys) at a time, then four, then one
inline void topk_score_chunks(float* out, const float* q, const float* panel, int c0, int c1, int HS) {
    const size_t chunk_size = (size_t)HS * kTopkLanes;
    const float* chunk[8];
    int c = c0;
    for (; c + 8 <= c1; c += 8) {
        for (int u = 0; u < 8; u++) chunk[u] = panel + (size_t)(c + u) * chunk_size;
        topk_score_chunk_group<8>(out + (size_t)(c - c0) * kTopkLanes, q, 1, chunk, HS);
    }
    for (; c + 4 <= c1; c += 4) {
        for (int u = 0; u < 4; u++) chunk[u] = panel + (size_t)(c + u) * chunk_size;
        topk_score_chunk_group<4>(out + (size_t)(c - c0) * kTopkLanes, q, 1, chunk, HS);
    }
    for (; c < c1; c++) {
        chunk[0] = panel + (size_t)c * chunk_size;
        topk_score_chunk_group<1>(out + (size_t)(c - c0) * kTopkLanes, q, 1, chunk, HS);
    }
}

// scores of four queries against chunks [0, c1): row r at out + r * ld_out. q4 holds
// the queries interleaved, q4[d * 4 + r] = q_r[d] (one pointer keeps the loop in registers).
inline void topk_score_chunks_4q(float* out, size_t ld_out, const float* q4, const float* panel, int c1, int HS) {
    const size_t chunk_size = (size_t)HS * kTopkLanes;
    int c = 0;
    // two chunks x four queries: eight independent chains
    for (; c + 2 <= c1; c += 2) {
        const float* k0 = panel + (size_t)c * chunk_size;
        TopkLaneVec a00 = topk_lanes_zero(), a10 = topk_lanes_zero(), a20 = topk_lanes_zero(), a30 = topk_lanes_zero();
        TopkLaneVec a01 = topk_lanes_zero(), a11 = topk_lanes_zero(), a21 = topk_lanes_zero(), a31 = topk_lanes_zero();
        for (int d = 0; d < HS; d++) {
            const float* qd = q4 + 4 * d;
            const TopkLaneVec x0 = topk_lanes_load(k0 + d * kTopkLanes);
            const TopkLaneVec x1 = topk_lanes_load(k0 + chunk_size + d * kTopkLanes);
            a00 = topk_lanes_fma(qd[0], x0, a00);
            a10 = topk_lanes_fma(qd[1], x0, a10);
            a20 = topk_lanes_fma(qd[2], x0, a20);
            a30 = topk_lanes_fma(qd[3], x0, a30);
            a01 = topk_lanes_fma(qd[0], x1, a01);
            a11 = topk_lanes_fma(qd[1], x1, a11);
            a21 = topk_lanes_fma(qd[2], x1, a21);
            a31 = topk_lanes_fma(qd[3], x1, a31);
        }
        const size_t o = (size_t)c * kTopkLanes;
        topk_lanes_store(out + o, a00);
        topk_lanes_store(out + ld_out + o, a10);
        topk_lanes_store(out + 2 * ld_out + o, a20);
        topk_lanes_store(out + 3 * ld_out + o, a30);
        topk_lanes_store(out + o + kTopkLanes, a01);
        topk_lanes_store(out + ld_out + o + kTopkLanes, a11);
        topk_lanes_store(out + 2 * ld_out + o + kTopkLanes, a21);
        topk_lanes_store(out + 3 * ld_out + o + kTopkLanes, a31);
    }
    if (c < c1) {  // an odd last chunk, one query at a time
        const float* chunk[1] = {panel + (size_t)c * chunk_size};
        for (int r = 0; r < 4; r++)
            topk_score_chunk_group<1>(out + r * ld_out + (size_t)c * kTopkLanes, q4 + r, 4, chunk, HS);
    }
}

// scores of one query against a list of chunks of a panel: out[u * 8 + l] for chunk
// chunk_ids[u], eight chunks at a time, then one at a time
inline void topk_score_chunk_list(float* out, const float* q, const float* panel, const int* chunk_ids, int n,
                                  int HS) {
    const size_t chunk_size = (size_t)HS * kTopkLanes;
    const float* chunk[8];
    int u = 0;
    for (; u + 8 <= n; u += 8) {
        for (int v = 0; v < 8; v++) chunk[v] = panel + (size_t)chunk_ids[u + v] * chunk_size;
        topk_score_chunk_group<8>(out + (size_t)u * kTopkLanes, q, 1, chunk, HS);
    }
    for (; u < n; u++) {
        chunk[0] = panel + (size_t)chunk_ids[u] * chunk_size;
        topk_score_chunk_group<1>(out + (size_t)u * kTopkLanes, q, 1, chunk, HS);
    }
}

// the same for chunks given by address (chunks of several panels): out[u * 8 + l] for
// chunk[u]; eight at a time, then four, then one
inline void topk_score_chunk_ptrs(float* out, const float* q, const float* const* chunk, int n, int HS) {
    int u = 0;
    for (; u + 8 <= n; u += 8) topk_score_chunk_group<8>(out + (size_t)u * kTopkLanes, q, 1, chunk + u, HS);
    for (; u + 4 <= n; u += 4) topk_score_chunk_group<4>(out + (size_t)u * kTopkLanes, q, 1, chunk + u, HS);
    for (; u < n; u++) topk_score_chunk_group<1>(out + (size_t)u * kTopkLanes, q, 1, chunk + u, HS);
}
