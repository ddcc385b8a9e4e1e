// train/train_gpt.cpp — the knngpt trainer. One main for every backend: the
// CPU build is train_gpt_cpu, the CUDA build (-DKNNGPT_CUDA, nvcc) train_gpt,
// and the CUDA build under the CPU emulator build/train_gpt_emu; the model and
// its ops come from model/ and the backend chosen in model/backend.h.
//
// Flags follow llm.c's train_gpt2.cu where they mean the same thing (single
// letters), with long names for the rest; `-h` lists them all.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "data/bpe.h"
#include "data/dataloader.h"
#include "data/tokenizer.h"
#include "kernels/common/draws.h"
#include "kernels/common/rng.h"
#include "model/checkpoint.h"
#include "model/checkpoint_dir.h"
#include "model/comm.h"
#include "model/comm_watchdog.h"
#include "model/gpt.h"
#include "model/lr_schedule.h"
#include "train/attention_flags.h"
#include "train/duration.h"
#include "train/flag_values.h"
#include "train/omp_threads.h"

using namespace knngpt;

// ----------------------------------------------------------------------------
// Options and their parsing

struct Options {
    std::string train_pattern = "data/tinyshakespeare_train.bin";  // -i
    std::string val_pattern = "data/tinyshakespeare_val.bin";      // -j
    std::string init;                    // -e: model file or "dN"; empty = random init from the shape flags
    std::string output_dir;              // -o
    int B = 12;                          // -b
    int T = 64;                          // -t
    long total_batch_tokens = -1;        // -d
    float lr = 1e-3f;                    // -l
    int warmup = 0;                      // -u
    float final_lr_frac = 0.1f;          // -q
    float weight_decay = 0.0f;           // -c
    std::string schedule = "cosine";     // -k
    long max_steps = -1;                 // -x
    int val_every = 250;                 // -v
    int val_max_steps = 20;              // -m
    int sample_every = 500;              // -s
    int gen_tokens = 128;                // -g
    int checkpoint_every = 0;            // -n
    int keep_last = 0;                   // -nk
    int major_every = 0;                 // -nm
    int verify_checksum = 1;             // --verify-checksum
    int skip_nonfinite = 0;              // --skip-nonfinite
    int inject_nan_step = 0;             // --inject-nan STEP[:LAYER] (testing)
    int inject_nan_layer = 0;
    int resume = 0;                      // -y
    int overfit_single_batch = 0;        // -a
    int eval_only = 0;                   // --eval-only
    uint64_t seed = 1337;                // --seed
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;  // --beta1 --beta2 --eps
    float grad_clip = 1.0f;              // --grad-clip
    int shuffle = 0;                     // --shuffle
    int layers = -1, heads = -1, channels = -1, max_seq_len = -1, vocab = -1;  // shape flags
    std::string tokenizer;               // --tokenizer
    std::string gpt2_vocab;              // --gpt2-vocab
    std::string prompt, prompt_file;     // --prompt, --prompt-file
    AttnFlags attn;                      // --attn*: train/attention_flags.h
    int zero_stage = 0;                  // -z
    CommOptions comm;                    // -pi -pn -pr -pg -ps -pp: model/comm.h
    float comm_timeout_s = 600;          // --comm-timeout: model/comm_watchdog.h
};

#if defined(KNNGPT_CUDA)
#define KNNGPT_PROGRAM "train_gpt"
#else
#define KNNGPT_PROGRAM "train_gpt_cpu"
#endif

static const char* USAGE_DATA_AND_MODEL = "usage: " KNNGPT_PROGRAM R"( [options]

Data
  -i PATTERN       train token shards, a file or glob (default data/tinyshakespeare_train.bin)
  -j PATTERN       validation token shards (default data/tinyshakespeare_val.bin)
  --shuffle 0|1    shuffle shards and batches each epoch (default 0: file order, like llm.c)
Model
  -e INIT          llm.c model file (version 3 fp32 or 5 bf16) to start from, or a depth
                   descriptor dN (d6, d12, d24, d36, d48) for a random GPT-2 of that depth;
                   default: random init from the shape flags below
  --layers N       number of layers (default 4, or from -e dN)
  --heads N        attention heads (default 4, or from -e dN)
  --channels N     embedding width (default 128, or from -e dN)
  --max-seq-len N  max context (default: T, or 1024 with -e dN)
  --vocab N        vocabulary size (default 256 byte-level, or 50257 with -e dN)
  --seed N         seed of the initialisation and of sampling (default 1337)
)";

static const char* USAGE_TRAINING = R"(Optimisation
  -b B             micro-batch size in sequences, per process (default 12)
  -t T             sequence length (default 64)
  -d TOKENS        total batch size in tokens, over all processes; gradients accumulate over
                   TOKENS / (B*T*processes) micro-batches (default -1: B*T*processes)
  -l LR            peak learning rate (default 1e-3)
  -u STEPS         linear warmup steps (default 0)
  -k SCHEDULE      cosine, linear or constant (default cosine)
  -q FRAC          final learning rate as a fraction of LR (default 0.1)
  -c WD            AdamW weight decay on 2-D weights and embeddings (default 0.0)
  --beta1 X        AdamW beta1 (default 0.9)
  --beta2 X        AdamW beta2 (default 0.95)
  --eps X          AdamW epsilon (default 1e-8)
  --grad-clip X    clip the global gradient norm to X; 0 = off (default 1.0)
  -x STEPS         number of optimizer steps (default -1: one epoch of the train data)
  -a 0|1           overfit a single batch (default 0)
Evaluation, sampling, output
  -v N             validation loss every N steps and at the end (default 250; 0 = only at the end)
  -m N             validation batches per evaluation (default 20; -1 = all)
  -s N             print a generated sample every N steps and at the end (default 500; 0 = only at the end)
  -g N             tokens per sample (default 128)
  --tokenizer FILE llm.c tokenizer file to decode samples (default: byte-level when vocab <= 256)
  --gpt2-vocab DIR GPT-2's encoder.json and vocab.bpe (tools/fetch_gpt2_vocab.sh): encode --prompt with
                   GPT-2's BPE (vocab 50257 models), and decode samples when --tokenizer is not given
  --prompt TEXT    samples continue TEXT (after the end-of-text token where the tokenizer has one;
                   byte-level: TEXT's bytes; GPT-2: needs --gpt2-vocab); default: no prompt
  --prompt-file F  the same with the contents of file F
  -o DIR           output directory for main.log and checkpoints (default: none)
  -n N             write a checkpoint every N steps, and at the end (needs -o; default 0 = only at the end)
  -nk N            keep only the latest N checkpoints, removing older ones (default 0: keep all)
  -nm M            with -nk, also keep every checkpoint whose step is a multiple of M, for good (default 0: none)
  -y 0|1           resume from the latest checkpoint in -o (default 0)
  --verify-checksum 0|1  check the checksums of model and state files read (default 1); 0 loads a file
                   whose checksum does not match (files without one, as llm.c writes, load either way)
  --eval-only 0|1  1: no training: the validation loss of the model (-e) under the attention flags
                   (and --attn-eval), one summary line; no train data, sample or files (default 0)
  -h, --help       this help
Faults
  --skip-nonfinite 0|1  a step whose loss or gradient norm is NaN or inf: 0 stops the run with one line
                   naming the step (exit status 1), 1 skips that update and goes on (default 0)
  --inject-nan STEP[:LAYER]  testing: write a NaN into layer LAYER's attention output (default 0) in
                   the first forward of step STEP
  SIGINT, SIGTERM  finish the step, write a checkpoint (with -o), print one line, exit status 75;
                   a second signal exits at once (status 128 + signal)
Several processes (data parallel; start them with mpirun or srun, README "Several processes")
  -z 0|1           ZeRO stage: 0 all-reduces the gradients, 1 also shards the AdamW state (default 0)
  -pi METHOD       how the processes meet: mpi (default under mpirun/srun with PMIx); for the
                   CUDA trainer also fs (a shared directory) or tcp (rank 0's address)
  -pn N            number of processes, with -pi fs|tcp (default $SLURM_NTASKS)
  -pr R            this process's rank, with -pi fs|tcp (default $SLURM_PROCID)
  -pg G            GPUs per node, with -pi fs|tcp: local rank = R % G (default $SLURM_NTASKS_PER_NODE or 8)
  -ps HOST[:PORT]  rank 0's address for -pi tcp (port default 29500)
  -pp DIR          the shared directory for -pi fs
  --comm-timeout S a collective that waits more than S seconds for the other ranks (one stopped,
                   froze or died) ends the run with one line naming this rank (default 600; 0: never)
)";

// --help: the flags in groups, the core attention flags after the model's and the
// experimental ones last (train/attention_flags.h writes both from the registry)
static std::string usage() {
    return USAGE_DATA_AND_MODEL + attention_help(false) + USAGE_TRAINING + attention_help(true) +
           "Threads: every core, fewer while other processes use them; OMP_NUM_THREADS fixes the count (per\n"
           "process). The count never changes a result.\n";
}

// ----------------------------------------------------------------------------
// Errors, in one process or many. Each stops the run with one line on stderr and
// exit status 1, on every rank, never leaving one waiting:
// - before the processes have met (flags): every rank finds the same error and
//   exits; the launcher's rank 0 prints it;
// - during set-up (files, shapes): every rank reaches agree_on_setup, which
//   stops all of them when any failed, the lowest failing rank printing its line;
// - while training: the failing rank prints its line and aborts every rank
//   (MPI_Abort), or, for what every rank finds at once (a non-finite loss),
//   die_everywhere: rank 0 prints and all exit.

static std::unique_ptr<Comm> g_comm;  // null until the processes have met
static std::unique_ptr<ThreadsFollowingLoad> g_threads;  // how many OpenMP threads, by the load
static bool g_in_setup = false;       // die() throws for agree_on_setup instead of stopping

// What an error line starts with; rank < 0: it names no rank.
static std::string error_prefix(int rank) {
    return rank >= 0 ? "train_gpt: error: rank " + std::to_string(rank) + ": " : std::string("train_gpt: error: ");
}

static void print_error(const std::string& msg, int rank) {
    fprintf(stderr, "%s%s\n", error_prefix(rank).c_str(), one_line(msg).c_str());
    fflush(stderr);
}

[[noreturn]] static void die(const std::string& msg) {
    if (g_in_setup) throw std::runtime_error(msg);
    if (!g_comm) {
        if (launcher_rank() == 0) print_error(msg, -1);
        exit(1);
    }
    print_error(msg, g_comm->world() > 1 ? g_comm->rank() : -1);
    if (g_comm->world() > 1) g_comm->abort(1);
    exit(1);
}

// An error every rank finds at the same point: one line, every rank exits.
[[noreturn]] static void die_everywhere(const std::string& msg) {
    g_comm->barrier();
    if (g_comm->rank() == 0) print_error(msg, -1);
    g_comm.reset();  // MPI_Finalize
    exit(1);
}

// The end of set-up: every rank says whether it failed (error != nullptr).
static void agree_on_setup(const std::string* error) {
    g_in_setup = false;
    const int world = g_comm->world(), rank = g_comm->rank();
    const int first_failed = (int)g_comm->all_reduce_host(error ? rank : world, ReduceOp::Min);
    if (first_failed == world) return;
    if (error && rank == first_failed) print_error(*error, world > 1 ? rank : -1);
    g_comm.reset();
    exit(1);
}

// ----------------------------------------------------------------------------
// Stopping on a signal (SIGINT, SIGTERM: Ctrl-C, a scheduler's preemption).
// The first sets a flag; at the end of each step the ranks agree on it (a
// max over the ranks, so a signal that reaches one rank stops them all at the
// same step), write the step's checkpoint and exit with STOPPED_BY_SIGNAL. A
// second signal exits at once, unless the checkpoint is written: then the run is
// already on its way out (a launcher ends the ranks still running once one has exited).

constexpr int STOPPED_BY_SIGNAL = 75;  // EX_TEMPFAIL: not finished, resume with -y 1
static volatile sig_atomic_t g_stop_signal = 0;
static volatile sig_atomic_t g_stopped = 0;  // the stop's checkpoint is written

static void on_stop_signal(int sig) {
    if (g_stopped) return;
    if (g_stop_signal) {
        static const char msg[] = "train_gpt: second signal: exiting now, without a checkpoint\n";
        if (write(WatchedComm::unheld_stderr(), msg, sizeof(msg) - 1)) {}
        _exit(128 + sig);
    }
    g_stop_signal = sig;
    WatchedComm::note_stop_signal();  // a collective that then never completes: a peer is gone
}

static void catch_stop_signals() {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // a write or read under way goes on
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
}

// A flag's number, or one line and exit 1 (flag_values.h).
static long parse_long(const std::string& flag, const char* s) {
    try {
        return parse_flag_long(flag, s);
    } catch (const std::exception& e) {
        die(e.what());
    }
}
static float parse_float(const std::string& flag, const char* s) {
    try {
        return parse_flag_float(flag, s);
    } catch (const std::exception& e) {
        die(e.what());
    }
}

static Options parse_args(int argc, char** argv) {
    Options o;
    auto integer = [](int* dst) { return [dst](const std::string& f, const char* v) { *dst = (int)parse_long(f, v); }; };
    auto integer_l = [](long* dst) { return [dst](const std::string& f, const char* v) { *dst = parse_long(f, v); }; };
    auto real = [](float* dst) { return [dst](const std::string& f, const char* v) { *dst = parse_float(f, v); }; };
    auto text = [](std::string* dst) { return [dst](const std::string&, const char* v) { *dst = v; }; };
    std::map<std::string, std::function<void(const std::string&, const char*)>> flags = {
        {"-i", text(&o.train_pattern)}, {"-j", text(&o.val_pattern)}, {"-e", text(&o.init)},
        {"-o", text(&o.output_dir)}, {"-b", integer(&o.B)}, {"-t", integer(&o.T)},
        {"-d", integer_l(&o.total_batch_tokens)}, {"-l", real(&o.lr)}, {"-u", integer(&o.warmup)},
        {"-q", real(&o.final_lr_frac)}, {"-c", real(&o.weight_decay)}, {"-k", text(&o.schedule)},
        {"-x", integer_l(&o.max_steps)}, {"-v", integer(&o.val_every)}, {"-m", integer(&o.val_max_steps)},
        {"-s", integer(&o.sample_every)}, {"-g", integer(&o.gen_tokens)}, {"-n", integer(&o.checkpoint_every)},
        {"-nk", integer(&o.keep_last)}, {"-nm", integer(&o.major_every)},
        {"--verify-checksum", integer(&o.verify_checksum)}, {"--skip-nonfinite", integer(&o.skip_nonfinite)},
        {"--inject-nan", [&o](const std::string& f, const char* v) {
             const std::string value = v;
             const size_t colon = value.find(':');
             o.inject_nan_step = (int)parse_long(f, value.substr(0, colon).c_str());
             if (colon != std::string::npos) o.inject_nan_layer = (int)parse_long(f, value.substr(colon + 1).c_str());
         }},
        {"-y", integer(&o.resume)}, {"-a", integer(&o.overfit_single_batch)},
        {"--eval-only", integer(&o.eval_only)},
        {"--seed", [&o](const std::string& f, const char* v) { o.seed = (uint64_t)parse_long(f, v); }},
        {"--beta1", real(&o.beta1)}, {"--beta2", real(&o.beta2)}, {"--eps", real(&o.eps)},
        {"--grad-clip", real(&o.grad_clip)}, {"--shuffle", integer(&o.shuffle)},
        {"--layers", integer(&o.layers)}, {"--heads", integer(&o.heads)}, {"--channels", integer(&o.channels)},
        {"--max-seq-len", integer(&o.max_seq_len)}, {"--vocab", integer(&o.vocab)},
        {"--tokenizer", text(&o.tokenizer)}, {"--gpt2-vocab", text(&o.gpt2_vocab)},
        {"--prompt", text(&o.prompt)}, {"--prompt-file", text(&o.prompt_file)}, {"--attn", text(&o.attn.mode)}, {"--attn-k", integer(&o.attn.k)},
        {"--attn-tail", integer(&o.attn.tail)}, {"--attn-index", text(&o.attn.index)},
        {"--attn-window", integer(&o.attn.window)}, {"--attn-sinks", integer(&o.attn.sinks)},
        {"--attn-grad", text(&o.attn.grad)}, {"--attn-grad-samples", integer(&o.attn.grad_samples)},
        {"--attn-grad-source", text(&o.attn.grad_source)}, {"--attn-grad-dv", text(&o.attn.grad_dv)},
        {"--attn-gumbel-groups", integer(&o.attn.gumbel_groups)},
        {"--attn-gumbel-samples", integer(&o.attn.gumbel_samples)},
        {"--attn-kmv-threshold", text(&o.attn.kmv_threshold)}, {"--attn-kmv-levels", integer(&o.attn.kmv_levels)},
        {"--attn-kmv-alpha", real(&o.attn.kmv_alpha)},
        {"--attn-seed", [&o](const std::string& f, const char* v) { o.attn.seed = (uint64_t)parse_long(f, v); }},
        {"--attn-eval", text(&o.attn.eval)}, {"--attn-warmup", integer(&o.attn.warmup)},
        {"-z", integer(&o.zero_stage)}, {"-pi", text(&o.comm.init_method)}, {"-pn", integer(&o.comm.num_processes)},
        {"-pr", integer(&o.comm.process_rank)}, {"-pg", integer(&o.comm.gpus_per_node)},
        {"-ps", text(&o.comm.server_ip)}, {"-pp", text(&o.comm.fs_path)},
        {"--comm-timeout", real(&o.comm_timeout_s)},
    };
    for (int i = 1; i < argc; i++) {
        std::string flag = argv[i];
        if (flag == "-h" || flag == "--help") {
            fputs(usage().c_str(), stdout);
            exit(0);
        }
        auto it = flags.find(flag);
        if (it == flags.end()) die("unknown flag '" + flag + "' (see -h)");
        if (i + 1 >= argc) die(flag + ": missing value");
        it->second(flag, argv[++i]);
    }
    // value checks: one line each
    if (o.B < 1) die("-b: batch size must be >= 1");
    if (o.T < 1) die("-t: sequence length must be >= 1");
    if (o.lr < 0) die("-l: learning rate must be >= 0");
    if (o.warmup < 0) die("-u: warmup must be >= 0");
    if (o.final_lr_frac < 0) die("-q: final fraction must be >= 0");
    if (o.weight_decay < 0) die("-c: weight decay must be >= 0");
    if (o.beta1 < 0 || o.beta1 >= 1) die("--beta1 must be in [0, 1)");
    if (o.beta2 < 0 || o.beta2 >= 1) die("--beta2 must be in [0, 1)");
    if (o.eps <= 0) die("--eps must be > 0");
    if (o.grad_clip < 0) die("--grad-clip must be >= 0");
    if (o.shuffle != 0 && o.shuffle != 1) die("--shuffle takes 0 or 1");
    if (o.resume != 0 && o.resume != 1) die("-y takes 0 or 1");
    if (o.overfit_single_batch != 0 && o.overfit_single_batch != 1) die("-a takes 0 or 1");
    if (o.eval_only != 0 && o.eval_only != 1) die("--eval-only takes 0 or 1");
    if (o.attn.warmup < 0) die("--attn-warmup must be >= 0, got " + std::to_string(o.attn.warmup));
    if (o.eval_only && (o.resume || !o.output_dir.empty())) die("--eval-only 1 trains nothing: drop -o and -y");
    if (o.val_every < 0 || o.sample_every < 0 || o.checkpoint_every < 0) die("-v, -s and -n must be >= 0");
    if (o.gen_tokens < 1) die("-g: sample length must be >= 1");
    if (o.max_steps == 0 || o.max_steps < -1) die("-x: number of steps must be >= 1 (or -1 for one epoch)");
    if (o.resume && o.output_dir.empty()) die("-y 1 needs -o DIR to resume from");
    if (o.zero_stage != 0 && o.zero_stage != 1) die("-z takes 0 or 1 (ZeRO stage)");
    if (!(o.comm_timeout_s >= 0)) die("--comm-timeout: give seconds >= 0 (0: no limit)");
    if (o.keep_last < 0 || o.major_every < 0) die("-nk and -nm must be >= 0");
    if (o.verify_checksum != 0 && o.verify_checksum != 1) die("--verify-checksum takes 0 or 1");
    if (o.skip_nonfinite != 0 && o.skip_nonfinite != 1) die("--skip-nonfinite takes 0 or 1");
    if (o.inject_nan_step < 0 || o.inject_nan_layer < 0) die("--inject-nan: STEP and LAYER must be >= 0");
    if (!o.prompt.empty() && !o.prompt_file.empty()) die("--prompt and --prompt-file: give one of them");
    return o;
}

// ----------------------------------------------------------------------------
// Building the model: from a checkpoint, a depth descriptor, or shape flags

struct ModelSource {
    GPTConfig config;
    std::vector<float> params;
    std::string description;
    bool has_checksum = false;  // a file that records its parameter checksum
    uint64_t checksum = 0;
};

static GPTConfig config_from_descriptor(const std::string& d, const Options& o) {
    int depth = (int)parse_long("-e", d.c_str() + 1);
    std::map<int, std::pair<int, int>> shapes = {{6, {384, 6}}, {12, {768, 12}}, {24, {1024, 16}},
                                                 {36, {1280, 20}}, {48, {1600, 25}}};
    auto it = shapes.find(depth);
    if (it == shapes.end()) die("-e: unknown depth descriptor '" + d + "' (known: d6, d12, d24, d36, d48)");
    GPTConfig c;
    c.num_layers = o.layers > 0 ? o.layers : depth;
    c.channels = o.channels > 0 ? o.channels : it->second.first;
    c.num_heads = o.heads > 0 ? o.heads : it->second.second;
    c.max_seq_len = o.max_seq_len > 0 ? o.max_seq_len : 1024;
    c.vocab_size = o.vocab > 0 ? o.vocab : 50257;
    c.padded_vocab_size = padded_vocab(c.vocab_size);
    return c;
}

static ModelSource model_source(const Options& o, const std::string& resume_model) {
    ModelSource src;
    std::string path = !resume_model.empty() ? resume_model : o.init;
    bool is_descriptor = resume_model.empty() && o.init.size() >= 2 && o.init[0] == 'd' &&
                         o.init.find_first_not_of("0123456789", 1) == std::string::npos;
    if (!path.empty() && !is_descriptor) {
        ModelFile mf = read_model_file(path, o.verify_checksum != 0);
        // shape flags may restate the checkpoint's shape (as a resumed command does), never change it
        const std::pair<const char*, std::pair<int, int>> shape_flags[] = {
            {"--layers", {o.layers, mf.config.num_layers}},       {"--heads", {o.heads, mf.config.num_heads}},
            {"--channels", {o.channels, mf.config.channels}},     {"--max-seq-len", {o.max_seq_len, mf.config.max_seq_len}},
            {"--vocab", {o.vocab, mf.config.vocab_size}}};
        for (const auto& [flag, values] : shape_flags)
            if (values.first > 0 && values.first != values.second)
                die(std::string(flag) + " " + std::to_string(values.first) + " differs from " +
                    std::to_string(values.second) + " in " + path);
        src.config = mf.config;
        src.params = std::move(mf.params);
        src.description = path + " (llm.c version " + std::to_string(mf.version) + ")";
        src.has_checksum = mf.has_checksum;
        src.checksum = mf.checksum;
        return src;
    }
    if (is_descriptor) {
        src.config = config_from_descriptor(o.init, o);
        src.description = "random init, descriptor " + o.init + ", seed " + std::to_string(o.seed);
    } else {
        src.config.num_layers = o.layers > 0 ? o.layers : 4;
        src.config.num_heads = o.heads > 0 ? o.heads : 4;
        src.config.channels = o.channels > 0 ? o.channels : 128;
        src.config.max_seq_len = o.max_seq_len > 0 ? o.max_seq_len : o.T;
        src.config.vocab_size = o.vocab > 0 ? o.vocab : 256;
        src.config.padded_vocab_size = padded_vocab(src.config.vocab_size);
        src.description = "random init, seed " + std::to_string(o.seed);
    }
    validate_config(src.config, "model shape");
    src.params = gpt_random_init(src.config, o.seed);
    return src;
}

// ----------------------------------------------------------------------------
// Sampling

// The tokens of --prompt / --prompt-file: GPT-2's BPE when `bpe` is given
// (a literal <|endoftext|> is that token), else the bytes (a byte-level model).
static std::vector<int> prompt_tokens(const Options& o, const GPTConfig& cfg, const Gpt2Bpe* bpe) {
    std::string text = o.prompt;
    const std::string flag = o.prompt_file.empty() ? "--prompt" : "--prompt-file " + o.prompt_file;
    if (!o.prompt_file.empty()) {
        FILE* f = fopen(o.prompt_file.c_str(), "rb");
        if (!f) die(o.prompt_file + ": cannot open: " + strerror(errno));
        char buf[4096];
        for (size_t n; (n = fread(buf, 1, sizeof(buf), f)) > 0;) text.append(buf, n);
        const bool bad = ferror(f);
        fclose(f);
        if (bad) die(o.prompt_file + ": read error");
        if (text.empty()) die(flag + ": empty file");
    }
    if (text.empty()) return {};
    std::vector<int> tokens;
    if (bpe) {
        for (uint16_t t : bpe->encode(text)) tokens.push_back(t);
    } else {
        if (cfg.vocab_size > 256)
            die(flag + ": the model's vocab is " + std::to_string(cfg.vocab_size) +
                ", not byte-level: give --gpt2-vocab DIR to encode the prompt with GPT-2's BPE");
        for (unsigned char b : text) {
            if (b >= cfg.vocab_size)
                die(flag + ": byte " + std::to_string(b) + " is outside the model's vocab of " + std::to_string(cfg.vocab_size));
            tokens.push_back(b);
        }
    }
    return tokens;
}

// A sample: the prompt (if any), then n_tokens drawn one at a time. Its
// context starts with the end-of-text token where the tokenizer has one, else
// with the prompt, or '\n' without a prompt.
static std::string generate(GPT& model, const Tokenizer* tok, Rng& rng, int n_tokens, const std::vector<int>& prompt) {
    const GPTConfig& c = model.config;
    std::vector<int> tokens;
    if (tok && tok->eot_token() >= 0) tokens.push_back(tok->eot_token());
    else if (prompt.empty()) tokens.push_back(c.vocab_size > '\n' ? '\n' : 0);
    tokens.insert(tokens.end(), prompt.begin(), prompt.end());
    std::vector<float> logits(c.padded_vocab_size);
    std::vector<double> probs(c.vocab_size);
    std::string text;
    for (int t : prompt) text += tok ? tok->decode_printable(t) : std::to_string(t) + " ";
    for (int i = 0; i < n_tokens; i++) {
        int ctx = std::min((int)tokens.size(), model.T);  // sliding window over the last T tokens
        const int* window = tokens.data() + tokens.size() - ctx;
        gpt_forward(model, window, nullptr, 1, ctx, sampling_draw_step(i));
        gpt_logits_at(model, 0, ctx - 1, logits.data());
        double mx = logits[0], sum = 0.0;
        for (int v = 1; v < c.vocab_size; v++) mx = std::max(mx, (double)logits[v]);
        for (int v = 0; v < c.vocab_size; v++) sum += probs[v] = std::exp(logits[v] - mx);
        double u = rng.uniform() * sum, acc = 0.0;
        int next = c.vocab_size - 1;
        for (int v = 0; v < c.vocab_size; v++) {
            acc += probs[v];
            if (u < acc) { next = v; break; }
        }
        tokens.push_back(next);
        text += tok ? tok->decode_printable(next) : std::to_string(next) + " ";
    }
    return text;
}

// ----------------------------------------------------------------------------

// How many batches a validation reads: the first max_batches (-1: all).
static int validation_batches(const DataLoader& loader, int max_batches) {
    int n = (int)loader.batches_per_epoch();
    return max_batches >= 0 ? std::min(n, max_batches) : n;
}

// The mean validation loss over the first max_batches batches (every rank
// reads its own rows of each, so the mean over the ranks is the whole batches').
static double evaluate(GPT& model, DataLoader& loader, int max_batches, std::vector<int>& inputs, std::vector<int>& targets,
                       Comm& comm) {
    loader.reset();
    const int n = validation_batches(loader, max_batches);
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        loader.next_batch(inputs.data(), targets.data());
        gpt_forward(model, inputs.data(), targets.data(), model.B, model.T, evaluation_draw_step(i), 0.0f,
                    (int)draw_batch0(0, comm.world(), comm.rank(), model.B));
        sum += model.mean_loss;
    }
    return n > 0 ? comm.all_reduce_host(sum / n, ReduceOp::Mean) : NAN;
}

static int run(const Options& o) {
    using clock = std::chrono::steady_clock;
    Comm& comm = *g_comm;
    const int world = comm.world(), rank = comm.rank();
    if (rank != 0 && !freopen("/dev/null", "w", stdout)) die("cannot silence the output of rank " + std::to_string(rank));
    // ---- everything that can fail on bad input happens before anything is written;
    // die() throws until agree_on_setup, so that every rank learns of any rank's error
    g_in_setup = true;
    LrSchedule schedule = parse_lr_schedule(o.schedule);
    AttnConfig attn = attn_config_from_flags(o.attn);
    auto eval_attns = parse_attn_eval(o.attn.eval, attn);

    int resume_step = -1;
    if (o.resume) {
        resume_step = latest_checkpoint(o.output_dir);
        if (resume_step < 0) die("-y 1: no checkpoint (model_*.bin + state_*.bin) in " + o.output_dir);
    }
    ModelSource src = model_source(o, resume_step >= 0 ? checkpoint_path(o.output_dir, "model", resume_step) : "");
    const GPTConfig& cfg = src.config;
    if (o.inject_nan_step > 0 && o.inject_nan_layer >= cfg.num_layers)
        die("--inject-nan: layer " + std::to_string(o.inject_nan_layer) + " does not exist (the model has " +
            std::to_string(cfg.num_layers) + ")");
    if (o.T > cfg.max_seq_len)
        die("-t " + std::to_string(o.T) + " exceeds the model's max context " + std::to_string(cfg.max_seq_len) + " (" +
            src.description + ")");
    long tokens_per_micro = (long)o.B * o.T;                // one rank's micro-batch
    long tokens_per_global_micro = tokens_per_micro * world;  // all ranks' together
    long total_batch = o.total_batch_tokens > 0 ? o.total_batch_tokens : tokens_per_global_micro;
    if (total_batch % tokens_per_global_micro != 0)
        die("-d " + std::to_string(total_batch) + " is not a multiple of B*T*processes = " + std::to_string(o.B) + "*" +
            std::to_string(o.T) + "*" + std::to_string(world));
    int accum_steps = (int)(total_batch / tokens_per_global_micro);
    // the micro-batches of every rank draw as consecutive rows of the step's whole batch
    if (!draw_rows_fit(draw_batch0(accum_steps, world, 0, o.B), o.T))
        die("-d " + std::to_string(total_batch) + ": the rows of one step times T pass the 2^32 draw rows of the "
            "attention (kernels/common/draws.h)");

    std::unique_ptr<Gpt2Bpe> bpe;  // --gpt2-vocab
    if (!o.gpt2_vocab.empty()) {
        if (cfg.vocab_size != GPT2_VOCAB_SIZE)
            die("--gpt2-vocab: the model's vocab is " + std::to_string(cfg.vocab_size) + ", not GPT-2's " +
                std::to_string(GPT2_VOCAB_SIZE));
        bpe = std::make_unique<Gpt2Bpe>(Gpt2Bpe::load(o.gpt2_vocab));
    }
    std::unique_ptr<Tokenizer> tokenizer;
    if (!o.tokenizer.empty()) tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_llmc_file(o.tokenizer));
    else if (bpe) tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_pieces(bpe->all_token_bytes(), bpe->eot_token(), o.gpt2_vocab));
    else if (cfg.vocab_size <= 256) tokenizer = std::make_unique<Tokenizer>(Tokenizer::byte_level());
    const std::vector<int> prompt = prompt_tokens(o, cfg, bpe.get());

    // --eval-only: no train data, zero steps (the loop below validates once and stops)
    std::optional<DataLoader> train_loader;
    if (!o.eval_only) train_loader.emplace(o.train_pattern, o.B, o.T, rank, world, o.shuffle != 0, o.seed, cfg.vocab_size);
    DataLoader val_loader(o.val_pattern, o.B, o.T, rank, world, false, o.seed, cfg.vocab_size);
    long train_steps = o.eval_only ? 0
                       : o.max_steps > 0 ? o.max_steps
                                         : (long)(train_loader->batches_per_epoch() / accum_steps);
    if (!o.eval_only && train_steps < 1) die("the train data holds fewer batches than one optimizer step needs");
    if ((double)train_steps >= (double)kSamplingDrawStep)
        die("-x " + std::to_string(train_steps) + " steps pass the 2^30 training steps of the attention draws "
            "(kernels/common/draws.h)");

    GPT model;
    model.attn = attn;
    gpt_build(model, cfg, src.params, o.B, o.T, DataParallel{&comm, o.zero_stage});
    for (const auto& eval : eval_attns) gpt_set_attention(model, eval.second);  // allocate the largest lists once
    gpt_set_attention(model, attn);
    src.params.clear();
    src.params.shrink_to_fit();

    Rng sample_rng(o.seed);
    int start_step = 0;
    if (resume_step >= 0) {
        const std::string state_path = checkpoint_path(o.output_dir, "state", resume_step);
        TrainState st = read_state_file(state_path, model.num_parameters, o.verify_checksum != 0);
        if (st.step != resume_step) die("state file step " + std::to_string(st.step) + " does not match its name");
        if (o.verify_checksum && st.has_checksum && src.has_checksum && st.model_checksum != src.checksum)
            die(state_path + ": belongs to another model file (it records parameter checksum " +
                hex64(st.model_checksum) + ", " + checkpoint_path(o.output_dir, "model", resume_step) + " has " +
                hex64(src.checksum) + "; --verify-checksum 0 resumes anyway)");
        if (st.global_rows != 0 && st.global_rows != world * o.B)
            die("-y 1: the checkpoint trained with " + std::to_string(st.global_rows) + " rows per micro-batch over its " +
                std::to_string(st.world) + " process(es), this run has B*processes = " + std::to_string(o.B) + "*" +
                std::to_string(world) + ": its data position would not carry over (choose -b to match)");
        gpt_set_optimizer_state(model, st);
        sample_rng.state = st.rng_state;
        train_loader->restore({st.data_epoch, st.data_shard_pos, st.data_batch_pos});
        start_step = st.step;
        if (!st.attn_note.empty()) printf("note: %s\n", st.attn_note.c_str());
        if (attn_description(st.attn) != attn_description(attn))
            printf("note: the checkpoint trained with attention '%s'; continuing with '%s'\n",
                   attn_description(st.attn).c_str(), attn_description(attn).c_str());
    }

    agree_on_setup(nullptr);
    for (const std::string& note : experimental_notes(attn)) printf("note: %s\n", note.c_str());

    // ---- header
    auto row = [](const char* key, const std::string& value) { printf("| %-13s | %-58s |\n", key, value.c_str()); };
    auto fmt = [](const char* f, auto... args) {
        char buf[256];
        snprintf(buf, sizeof(buf), f, args...);
        return std::string(buf);
    };
    const char* rule = "+---------------+------------------------------------------------------------+\n";
    printf("%s", rule);
    row("backend", ops::BACKEND_NAME);
    row("threads", omp_threads_description(*g_threads, world));
    row("processes", !comm.carries_collectives() ? std::string("1") :
                     fmt("%d (%s), ZeRO-%d", world, comm.name(), o.zero_stage));
    row("model", src.description);
    row("shape", fmt("L %d, NH %d, C %d, maxT %d, V %d (Vp %d)", cfg.num_layers, cfg.num_heads, cfg.channels,
                     cfg.max_seq_len, cfg.vocab_size, cfg.padded_vocab_size));
    row("parameters", std::to_string(model.num_parameters));
    row("attention", attn_description(attn) +
                         (o.attn.warmup > 0 ? fmt(" after %d exact steps", o.attn.warmup) : std::string()));
    for (const auto& [spec, a] : eval_attns) row("also evaluated", attn_description(a));
    row("train data", o.eval_only ? std::string("none (evaluation only)")
                                  : fmt("%s (%zu tokens)", o.train_pattern.c_str(), train_loader->num_tokens()));
    row("val data", fmt("%s (%zu tokens)", o.val_pattern.c_str(), val_loader.num_tokens()));
    row("batch", world == 1 ? fmt("B %d, T %d, accumulation %d -> %ld tokens/step", o.B, o.T, accum_steps, total_batch)
                            : fmt("B %d x %d processes, T %d, accumulation %d -> %ld tokens/step", o.B, world, o.T,
                                  accum_steps, total_batch));
    row("steps", o.eval_only ? std::string("0 (evaluation only)") : fmt("%ld (from step %d)", train_steps, start_step));
    row("schedule", fmt("lr %.2e, %s, warmup %d, final frac %.3g", o.lr, lr_schedule_name(schedule), o.warmup,
                        o.final_lr_frac));
    row("AdamW", fmt("beta1 %g, beta2 %g, eps %g, weight decay %g, clip %g", o.beta1, o.beta2, o.eps,
                     o.weight_decay, o.grad_clip));
    printf("%s", rule);
    if (g_threads->threads() < g_threads->cores())
        printf("note: other processes are running: %d of %d threads to start\n", g_threads->threads(),
               g_threads->cores());
    fflush(stdout);

    FILE* log = nullptr;
    if (!o.output_dir.empty() && rank == 0) {
        mkdir(o.output_dir.c_str(), 0755);
        std::string log_path = o.output_dir + "/main.log";
        log = fopen(log_path.c_str(), o.resume ? "a" : "w");
        if (!log) die(log_path + ": cannot open for writing");
        // the temporary files of a write that was killed before its rename
        for (const std::string& name : remove_unfinished_writes(o.output_dir))
            printf("removed %s/%s (an unfinished checkpoint write)\n", o.output_dir.c_str(), name.c_str());
    }
    // every rank calls it (a sharded optimizer state is gathered); rank 0 writes
    auto save_checkpoint = [&](int step) {
        if (o.output_dir.empty()) return;
        TrainState st;
        st.step = step;
        st.world = world;
        st.global_rows = world * o.B;
        st.shuffle = o.shuffle != 0;
        st.rng_state = sample_rng.state;
        DataLoaderState ds = train_loader->state();
        st.data_epoch = ds.epoch;
        st.data_shard_pos = ds.shard_pos;
        st.data_batch_pos = ds.batch_pos;
        st.attn = attn;
        gpt_get_optimizer_state(model, st);
        if (rank != 0) return;
        // model first, state second: a state file only ever exists beside its model
        write_checkpoint(checkpoint_path(o.output_dir, "model", step), checkpoint_path(o.output_dir, "state", step), cfg,
                         gpt_host_parameters(model), st);
        printf("checkpoint: %s\n", checkpoint_path(o.output_dir, "model", step).c_str());
        remove_old_checkpoints(o.output_dir, step, o.keep_last, o.major_every);
    };

    std::vector<int> inputs((size_t)o.B * o.T), targets((size_t)o.B * o.T);
    std::vector<int> val_inputs(inputs.size()), val_targets(targets.size());
    AdamWConfig opt{o.beta1, o.beta2, o.eps, o.weight_decay, o.grad_clip};
    double total_ms = 0.0, last_train_loss = NAN, last_val_loss = NAN;
    // MFU: model FLOPs of a step over the device's peak (printed where the peak is known)
    const double peak_flops = ops::device_peak_flops();
    const double flops_per_step = gpt_flops_per_token(cfg, o.T) * (double)total_batch;
    auto mfu_text = [&](double ms) {
        if (peak_flops <= 0.0 || ms <= 0.0) return std::string();
        char buf[32];
        snprintf(buf, sizeof(buf), " | mfu %.1f%%", 100.0 * flops_per_step / (ms / 1000.0) / peak_flops);
        return std::string(buf);
    };
    int timed_steps = 0;
    auto run_start = clock::now();
    if (o.overfit_single_batch && !o.eval_only) train_loader->next_batch(inputs.data(), targets.data());

    int skipped_updates = 0;
    for (int step = start_step; step <= train_steps; step++) {
        bool last_step = step == train_steps;
        if (g_threads->update() && rank == 0)
            printf("note: step %d: %d of %d threads (other processes used %.1f cores)\n", step, g_threads->threads(),
                   g_threads->cores(), g_threads->others());
        // a stop signal during the last step, on any rank: this step's checkpoint, then stop. The
        // validation is left to the resumed run (it changes nothing); the sample is drawn, as its
        // RNG state goes into the checkpoint
        const int stop_signal = step > start_step && !last_step && !o.eval_only
                                    ? (int)comm.all_reduce_host((double)g_stop_signal, ReduceOp::Max)
                                    : 0;
        if (!stop_signal && ((o.val_every > 0 && step % o.val_every == 0) || last_step)) {
            gpt_set_attention(model, attn);  // the configured attention, also while --attn-warmup trains exact
            last_val_loss = evaluate(model, val_loader, o.val_max_steps, val_inputs, val_targets, comm);
            printf("val loss %.6f | perplexity %.4f | step %d\n", last_val_loss, std::exp(last_val_loss), step);
            if (log) fprintf(log, "s:%d tel:%f\n", step, last_val_loss);
            for (const auto& [spec, eval_attn] : eval_attns) {
                gpt_set_attention(model, eval_attn);
                double loss = evaluate(model, val_loader, o.val_max_steps, val_inputs, val_targets, comm);
                printf("val loss %.6f | perplexity %.4f | step %d | attention %s\n", loss, std::exp(loss), step,
                       spec.c_str());
                if (log) fprintf(log, "s:%d tel[%s]:%f\n", step, spec.c_str(), loss);
            }
            gpt_set_attention(model, attn);
        }
        // (step > start_step: a resumed run does not repeat the sample its checkpoint step already drew)
        const bool sample_now =
            !o.eval_only && ((o.sample_every > 0 && step > start_step && step % o.sample_every == 0) || last_step);
        if (rank == 0 && sample_now) {
            gpt_set_attention(model, attn);  // samples too run the configured attention (see the validation)
            std::string text = generate(model, tokenizer.get(), sample_rng, o.gen_tokens, prompt);
            printf("---- sample (step %d) ----\n%s\n-------------------------\n", step, text.c_str());
        }
        fflush(stdout);
        const bool checkpoint_now =
            step > start_step && ((o.checkpoint_every > 0 && step % o.checkpoint_every == 0) || last_step || stop_signal);
        if (checkpoint_now) save_checkpoint(step);
        if (stop_signal) {
            if (world > 1) comm.wait_for_rank0();  // every rank exits once rank 0 has written
            g_stopped = 1;
            const std::string by = g_stop_signal == stop_signal ? (stop_signal == SIGINT ? "SIGINT" : "SIGTERM")
                                                                : "a signal to another rank";
            if (o.output_dir.empty())
                printf("stopped by %s after step %d of %ld (no -o: nothing saved)\n", by.c_str(), step, train_steps);
            else
                printf("stopped by %s after step %d of %ld: checkpoint %s, resume with -y 1\n", by.c_str(), step,
                       train_steps, checkpoint_path(o.output_dir, "model", step).c_str());
            fflush(stdout);
            if (log) fclose(log);
            return STOPPED_BY_SIGNAL;
        }
        if (last_step) break;
        // rank 0 alone sampled or wrote files: the others wait for it here, where a stop signal
        // that reaches every rank meanwhile is no sign of a dead peer (model/comm_watchdog.h)
        if (world > 1 && (sample_now || (checkpoint_now && !o.output_dir.empty()))) comm.wait_for_rank0();

        // ---- one optimizer step: accum_steps micro-batches, then AdamW
        auto t0 = clock::now();
        gpt_zero_grad(model);
        if (o.attn.warmup > 0) gpt_set_attention(model, attn_for_step(attn, o.attn.warmup, step));
        double loss_sum = 0.0;
        std::string fault_at;  // where the first non-finite loss of this step came from (this rank's view)
        for (int micro = 0; micro < accum_steps; micro++) {
            if (!o.overfit_single_batch) train_loader->next_batch(inputs.data(), targets.data());
            // the forward also writes the classifier's dlogits (fused), for the dloss the backward gets
            // the weight of a token in the mean over every rank's every micro-batch
            const float dloss = 1.0f / (float)(tokens_per_micro * accum_steps * world);
            model.poison_layer = step + 1 == o.inject_nan_step && micro == 0 ? o.inject_nan_layer : -1;
            gpt_forward(model, inputs.data(), targets.data(), o.B, o.T, training_draw_step(step), dloss,
                        (int)draw_batch0(micro, world, rank, o.B));
            model.poison_layer = -1;
            if (!std::isfinite(model.mean_loss) && fault_at.empty())
                fault_at = "first non-finite activation: " + gpt_first_nonfinite_activation(model) + " (micro-batch " +
                           std::to_string(micro) + (world > 1 ? ", rank " + std::to_string(rank) : "") + ")";
            gpt_backward(model, dloss, micro == accum_steps - 1);
            loss_sum += model.mean_loss;
        }
        last_train_loss = comm.all_reduce_host(loss_sum / accum_steps, ReduceOp::Mean);
        float lr = learning_rate_at(schedule, o.lr, step, o.warmup, (int)train_steps, o.final_lr_frac);
        // a non-finite loss or gradient norm (the same on every rank) never reaches the parameters
        const float norm = gpt_reduce_gradients(model);
        const bool finite = std::isfinite(last_train_loss) && std::isfinite(norm);
        if (finite) gpt_apply_update(model, lr, opt, step + 1, norm);
        else if (fault_at.empty()) {
            const std::string where = gpt_first_nonfinite_gradient(model);
            if (!where.empty()) fault_at = "first non-finite gradient: " + where;
        }
        ops::device_synchronize();  // the step's queued kernels belong to its time
        double ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
        if (step > start_step) { total_ms += ms; timed_steps++; }  // the first step warms caches
        double mean_ms = timed_steps ? total_ms / timed_steps : ms;
        printf("step %5d/%ld | loss %.6f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s%s | eta %s\n", step + 1,
               train_steps, last_train_loss, lr, norm, ms, total_batch / (ms / 1000.0), mfu_text(ms).c_str(),
               format_duration(mean_ms * (train_steps - step - 1) / 1000.0).c_str());
        if (log) fprintf(log, "s:%d trl:%f\n", step + 1, last_train_loss), fflush(log);
        if (!finite) {
            char what[160];
            snprintf(what, sizeof(what), "step %d: loss %g, gradient norm %g: not finite", step + 1, last_train_loss,
                     (double)norm);
            std::string msg = what + (fault_at.empty() ? std::string() : "; " + fault_at);
            if (!o.skip_nonfinite) die_everywhere(msg + "; stopped (--skip-nonfinite 1 skips such updates)");
            printf("%s; update skipped\n", msg.c_str());
            if (log) fprintf(log, "s:%d skipped\n", step + 1), fflush(log);
            skipped_updates++;
        }
    }
    double wall = std::chrono::duration<double>(clock::now() - run_start).count();
    const double mean_ms = timed_steps ? total_ms / timed_steps : 0.0;
    if (o.eval_only) {
        printf("done: evaluation only in %.1f s | %d val batches | val loss %.6f | perplexity %.4f\n", wall,
               validation_batches(val_loader, o.val_max_steps), last_val_loss, std::exp(last_val_loss));
        return 0;
    }
    printf("done: %ld steps in %.1f s | mean %.1f ms/step | %.0f tok/s%s | final train loss %.6f | val loss %.6f | "
           "perplexity %.4f%s\n",
           train_steps - start_step, wall, mean_ms, mean_ms > 0 ? total_batch / (mean_ms / 1000.0) : 0.0,
           mfu_text(mean_ms).c_str(), last_train_loss, last_val_loss, std::exp(last_val_loss),
           skipped_updates ? (" | " + std::to_string(skipped_updates) + " update(s) skipped (not finite)").c_str() : "");
    if (log) fclose(log);
    return 0;
}

int main(int argc, char** argv) {
    settle_omp_wait_policy(argv);  // may execute the trainer again, with a short spin
    g_threads = std::make_unique<ThreadsFollowingLoad>();
    Options o = parse_args(argc, argv);
    try {
        g_comm = watch_collectives(make_comm(o.comm), o.comm_timeout_s, error_prefix);
    } catch (const std::exception& e) {
        // the processes have not met: each rank names itself
        print_error(e.what(), launcher_rank());
        return 1;
    }
#if defined(KNNGPT_CUDA)
    // a CUDA error names its rank like every other error of a run of many
    if (g_comm->world() > 1) cuda::cuda_error_prefix() = error_prefix(g_comm->rank());
#endif
    catch_stop_signals();  // after MPI's set-up, so that these handlers are the ones in force
    int status = 1;
    try {
        status = run(o);
    } catch (const std::exception& e) {
        if (g_in_setup) {
            const std::string msg = e.what();
            agree_on_setup(&msg);  // does not return
        }
        die(e.what());
    }
    g_comm.reset();  // MPI_Finalize
    return status;
}
