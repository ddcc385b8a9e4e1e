// tests/test_docs.cpp — the documentation's links (tools/check_links.py): every relative
// link and anchor in the repository's Markdown files resolves, and the checker finds a
// link to a missing file or to a missing heading (so its "all resolve" means something).
// The references to kernels/ALGORITHMS.md's sections are tools/check_section_refs.sh's.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "tests/trainer_test_util.h"

using knngpt_test::RunResult;
using knngpt_test::TempDir;

namespace {

const char* kPython = "/usr/bin/python3";

std::string checker() {
    char cwd[4096];
    return std::string(getcwd(cwd, sizeof cwd) ? cwd : ".") + "/tools/check_links.py";
}

}  // namespace

TEST(Docs, EveryRelativeLinkAndAnchorInTheMarkdownFilesResolves) {
    TempDir tmp;
    RunResult r = knngpt_test::run(std::string(kPython) + " tools/check_links.py", tmp);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("all resolve"), std::string::npos) << r.out;
}

TEST(Docs, TheLinkCheckerFindsMissingFilesAndHeadings) {
    TempDir tmp;
    const std::string repo = tmp.file("repo");
    ASSERT_EQ(std::system(("mkdir -p " + repo + "/sub && git -C " + repo + " init -q").c_str()), 0);
    std::ofstream(repo + "/a.md") << "# Top\n\n"
                                     "[fine](sub/b.md#a-heading-with-code), [also fine](#top), [folder](sub/)\n"
                                     "[gone](missing.md) and ![picture](sub/none.png)\n"
                                     "```\n[in a code block](nowhere.md)\n```\n"
                                     "`[inline code](nowhere.md)` [bad anchor](sub/b.md#no-such-heading)\n"
                                     "[web](https://example.org/x.md) <a href=\"sub/b.md#top-1\">html</a>\n";
    std::ofstream(repo + "/sub/b.md") << "# Top\n\n## A heading with `code`!\n\n# Top\n";
    RunResult r = knngpt_test::run("cd " + repo + " && " + kPython + " " + checker(), tmp);
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_NE(r.out.find("a.md:4: missing.md: missing.md does not exist"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("a.md:4: sub/none.png: sub/none.png does not exist"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("a.md:8: sub/b.md#no-such-heading: no heading of sub/b.md has the anchor #no-such-heading"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(r.out.find("nowhere"), std::string::npos) << "a link inside code was checked: " << r.out;
    EXPECT_NE(r.out.find("markdown links: 3 of 8 do not resolve"), std::string::npos) << r.out;
}
