// tests/test_attention_registry.cpp — the one registry of attention modes, gradients and
// top-k indexes (model/attention_registry.h) and what reads it: its rows are consistent
// (ids and names unique, a build's entry present exactly where the row lists the build),
// every name parses back to its row, a retired index's name stops with one line naming its
// replacement and a checkpoint naming one loads as the replacement and says so, --help
// lists the core rows first and the experimental ones in their own block, and an
// experimental choice yields its note. The CUDA build's side of the entries is checked in
// test_cuda_model (the same registry compiled against kernels/cuda).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "model/attention_registry.h"
#include "model/checkpoint.h"
#include "tests/test_util.h"
#include "train/attention_flags.h"

using namespace knngpt;

TEST(AttentionRegistry, IdsAndNamesAreUniqueAndRetiredOnesStayReserved) {
    std::set<int> ids;
    std::set<std::string> names;
    for (const TopkIndexInfo& row : kTopkIndexes) {
        EXPECT_TRUE(ids.insert((int)row.id).second) << row.name;
        EXPECT_TRUE(names.insert(row.name).second) << row.name;
        EXPECT_EQ(&topk_index_info(row.id), &row) << row.name;
        EXPECT_GT(std::string(row.help).size(), 10u) << row.name;
        EXPECT_GT(std::string(row.verdict).size(), 10u) << row.name;
    }
    for (const RetiredTopkIndex& row : kRetiredTopkIndexes) {
        EXPECT_TRUE(ids.insert(row.id).second) << row.name << ": its checkpoint id was given to another index";
        EXPECT_TRUE(names.insert(row.name).second) << row.name;
        EXPECT_NE(find_topk_index((int)row.replacement), nullptr) << row.name << ": its replacement has no row";
    }
    std::set<int> mode_ids;
    for (const AttnModeInfo& row : kAttnModes) {
        EXPECT_TRUE(mode_ids.insert((int)row.id).second) << row.name;
        EXPECT_EQ(&attn_mode_info(row.id), &row) << row.name;
    }
    EXPECT_EQ(mode_ids.size(), 5u);  // exact, knn, knn-tail, gumbel, kmv
    EXPECT_EQ(attn_grad_info(AttnGrad::Exact).tier, Tier::Core);
    EXPECT_EQ(attn_grad_info(AttnGrad::Sampled).tier, Tier::Experimental);
    // the exact index is core, and the only exact one is brute
    EXPECT_EQ(exact_topk_index_names(), "brute");
    EXPECT_EQ(topk_index_info(TopkIndex::Brute).tier, Tier::Core);
}

TEST(AttentionRegistry, ThisBuildHasAnEntryExactlyWhereItsRowSaysSo) {
    for (const TopkIndexInfo& row : kTopkIndexes) {
        EXPECT_TRUE(row.builds & kBuildCpu) << row.name << ": the CPU build is the reference, it has every index";
        EXPECT_EQ(row.entry != nullptr, in_this_build(row.builds)) << row.name;
    }
    for (const AttnModeInfo& row : kAttnModes) EXPECT_TRUE(in_this_build(row.builds)) << row.name;
}

TEST(AttentionRegistry, EveryNameParsesToItsRow) {
    for (const TopkIndexInfo& row : kTopkIndexes) EXPECT_EQ(parse_attn_index(row.name), row.id) << row.name;
    for (const AttnModeInfo& row : kAttnModes) EXPECT_EQ(parse_attn_mode(row.name), row.id) << row.name;
    for (const AttnGradInfo& row : kAttnGrads) EXPECT_EQ(parse_attn_grad(row.name), row.id) << row.name;
    // --attn-eval takes index names from the same table
    AttnConfig base;
    const auto evals = parse_attn_eval("knn:index=heavy,knn:index=ivf", base);
    ASSERT_EQ(evals.size(), 2u);
    EXPECT_EQ(evals[0].second.index, TopkIndex::Heavy);
    EXPECT_EQ(evals[1].second.index, TopkIndex::Ivf);
}

TEST(AttentionRegistry, ARetiredIndexNameStopsWithItsReplacement) {
    for (const RetiredTopkIndex& row : kRetiredTopkIndexes) {
        try {
            parse_attn_index(row.name);
            ADD_FAILURE() << row.name << " parsed";
        } catch (const std::runtime_error& e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find(std::string("--attn-index ") + row.name + " is retired: use --attn-index " +
                               attn_index_name(row.replacement)),
                      std::string::npos)
                << msg;
            EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
        }
        AttnConfig base;
        EXPECT_THROW(parse_attn_eval(std::string("knn:index=") + row.name, base), std::runtime_error) << row.name;
    }
    try {
        parse_attn_index("kdtree");
        ADD_FAILURE() << "kdtree parsed";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("(known: " + registry_names(kTopkIndexes) + ")"), std::string::npos)
            << e.what();
    }
}

// A state file stores the index as its id; one written with a retired id (files from
// before the retirement) loads with the replacement and a note naming both.
TEST(AttentionRegistry, ACheckpointNamingARetiredIndexLoadsAsItsReplacementAndSaysSo) {
    knngpt_test::TempDir tmp;
    TrainState st;
    st.step = 3;
    st.m.assign(10, 0.5f);
    st.v.assign(10, 0.25f);
    st.attn.mode = AttnMode::Knn;
    st.attn.k = 7;
    for (const TopkIndexInfo& row : kTopkIndexes) {
        st.attn.index = row.id;
        write_state_file(tmp.file("state.bin"), st);
        const TrainState back = read_state_file(tmp.file("state.bin"), 10);
        EXPECT_EQ(back.attn.index, row.id) << row.name;
        EXPECT_TRUE(back.attn_note.empty()) << back.attn_note;
    }
    for (const RetiredTopkIndex& row : kRetiredTopkIndexes) {
        st.attn.index = TopkIndex::Brute;
        write_state_file(tmp.file("old.bin"), st);
        std::string bytes = knngpt_test::read_bytes(tmp.file("old.bin"));
        ASSERT_GT(bytes.size(), 54 * sizeof(int));
        const int id = row.id;
        std::memcpy(&bytes[53 * sizeof(int)], &id, sizeof id);  // header slot 53: the index id
        knngpt_test::write_bytes(tmp.file("old.bin"), bytes);
        // the edit breaks the file's own checksum, as any header edit would: read unverified
        const TrainState back = read_state_file(tmp.file("old.bin"), 10, false);
        EXPECT_EQ(back.attn.index, row.replacement) << row.name;
        EXPECT_EQ(back.attn.k, 7);
        EXPECT_NE(back.attn_note.find(std::string("the top-k index ") + row.name + ", since retired: read as " +
                                      attn_index_name(row.replacement)),
                  std::string::npos)
            << back.attn_note;
    }
    // an id no index ever had is refused
    st.attn.index = TopkIndex::Brute;
    write_state_file(tmp.file("bad.bin"), st);
    std::string bytes = knngpt_test::read_bytes(tmp.file("bad.bin"));
    const int unknown = 9;
    std::memcpy(&bytes[53 * sizeof(int)], &unknown, sizeof unknown);
    knngpt_test::write_bytes(tmp.file("bad.bin"), bytes);
    EXPECT_THROW(read_state_file(tmp.file("bad.bin"), 10, false), std::runtime_error);
}

TEST(AttentionRegistry, HelpListsCoreRowsFirstAndExperimentalOnesInTheirBlock) {
    const std::string core = attention_help(false), experimental = attention_help(true);
    for (const TopkIndexInfo& row : kTopkIndexes) {
        const std::string as_core = std::string("    ") + row.name + " ";
        const std::string as_experimental = std::string("  --attn-index ") + row.name + " ";
        if (row.tier == Tier::Core) {
            EXPECT_NE(core.find(as_core), std::string::npos) << row.name;
            EXPECT_EQ(experimental.find(as_experimental), std::string::npos) << row.name;
        } else {
            EXPECT_EQ(core.find(as_core), std::string::npos) << row.name;
            EXPECT_NE(experimental.find(as_experimental), std::string::npos) << row.name;
        }
    }
    for (const AttnModeInfo& row : kAttnModes) {
        const bool in_core = core.find(std::string("    ") + row.name + " ") != std::string::npos;
        const bool in_experimental = experimental.find(std::string("  --attn ") + row.name + " ") != std::string::npos;
        EXPECT_EQ(in_core, row.tier == Tier::Core) << row.name;
        EXPECT_EQ(in_experimental, row.tier == Tier::Experimental) << row.name;
    }
    for (const RetiredTopkIndex& row : kRetiredTopkIndexes) {  // not offered as a choice
        EXPECT_EQ(core.find(std::string("\n    ") + row.name + " "), std::string::npos) << row.name;
        EXPECT_EQ(experimental.find(std::string("--attn-index ") + row.name + " "), std::string::npos) << row.name;
    }
    // every line fits 100 columns
    for (const std::string& text : {core, experimental}) {
        size_t start = 0;
        for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1)
            EXPECT_LE(end - start, 100u) << text.substr(start, end - start);
    }
}

TEST(AttentionRegistry, ExperimentalChoicesEachGiveOneNoteWithTheirFigure) {
    AttnConfig core;
    core.mode = AttnMode::KnnTail;
    core.tail = 4;
    core.index = TopkIndex::Ivf;
    EXPECT_TRUE(experimental_notes(core).empty());
    AttnConfig gumbel;
    gumbel.mode = AttnMode::Gumbel;
    gumbel.grad = AttnGrad::Sampled;
    const auto notes = experimental_notes(gumbel);
    ASSERT_EQ(notes.size(), 2u);
    EXPECT_EQ(notes[0], std::string("--attn gumbel is experimental: ") + attn_mode_info(AttnMode::Gumbel).verdict);
    EXPECT_EQ(notes[1], std::string("--attn-grad sampled is experimental: ") + attn_grad_info(AttnGrad::Sampled).verdict);
    // an index only counts where the configuration searches one
    AttnConfig exact_on_lsh;
    exact_on_lsh.index = TopkIndex::Lsh;
    EXPECT_TRUE(experimental_notes(exact_on_lsh).empty());
    exact_on_lsh.mode = AttnMode::Knn;
    ASSERT_EQ(experimental_notes(exact_on_lsh).size(), 1u);
    EXPECT_NE(experimental_notes(exact_on_lsh)[0].find("--attn-index lsh is experimental"), std::string::npos);
}
