// tests/fuzz/fuzz_train_args.cpp — libFuzzer target: the trainer's command
// line (train/train_gpt.cpp's parse_args), then the checks its run() makes of
// the flags before it opens any file: the learning-rate schedule, the
// attention settings and the --attn-eval list, and the model shape a depth
// descriptor (-e dN) or the shape flags give. The input is the arguments,
// separated by NUL bytes. Every command line is taken or refused with one line
// as the trainer prints it (its die() throws while set-up is under way, as for
// every rank of a run). -h and --help print the usage and exit, so inputs with them are
// skipped.
#include <cstdio>

#define main train_gpt_main
#include "train/train_gpt.cpp"
#undef main
#include "tests/fuzz/fuzz_util.h"

using namespace knngpt_fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::vector<std::string> args = {"train_gpt_cpu"};
    std::string arg;
    for (size_t i = 0; i < size; i++) {
        if (data[i] == 0) args.push_back(arg), arg.clear();
        else arg += (char)data[i];
    }
    if (!arg.empty()) args.push_back(arg);
    std::vector<char*> argv;
    for (std::string& a : args) {
        if (a == "-h" || a == "--help") return 0;
        argv.push_back(a.data());
    }
    argv.push_back(nullptr);
    AllocationWatch watch(size);
    g_in_setup = true;
    try {
        const Options o = parse_args((int)args.size(), argv.data());
        parse_lr_schedule(o.schedule);
        const AttnConfig attn = attn_config_from_flags(o.attn);
        parse_attn_eval(o.attn.eval, attn);
        const bool is_descriptor = o.init.size() >= 2 && o.init[0] == 'd' &&
                                   o.init.find_first_not_of("0123456789", 1) == std::string::npos;
        if (is_descriptor) validate_config(config_from_descriptor(o.init, o), "model shape");
        if (o.B < 1 || o.T < 1 || o.gen_tokens < 1 || (o.max_steps < 1 && o.max_steps != -1))
            fail("parse_args took a value its checks refuse");
    } catch (const std::runtime_error& e) {
        check_error_line(one_line(e.what()));  // as print_error prints it
    }
    watch.check();
    return 0;
}
