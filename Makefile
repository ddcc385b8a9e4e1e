# knngpt — `make help` lists the targets.
#
# Everything is header-only C++17 (kernels/, model/, data/); each program and
# each test is one translation unit, so `make -j2` is always safe.

CXX       ?= g++
ARCHFLAGS ?= -march=native
# make test-portable builds with these in place of ARCHFLAGS; empty means the
# compiler's default target, on Debian plain x86-64 (SSE2: no AVX, no FMA)
PORTABLE_ARCHFLAGS ?=
OPT       ?= -O3
CXXFLAGS  += $(OPT) $(ARCHFLAGS) -std=c++17 -fopenmp -Wall -Wextra -I.
MULTIARCH := $(shell $(CXX) -print-multiarch 2>/dev/null)
# OpenBLAS, the OpenMP build (Debian's libopenblas-openmp-dev): it shares the
# OpenMP thread pool of our own kernels instead of spinning up a second pool.
BLAS_DIR  ?= /usr/lib/$(MULTIARCH)/openblas-openmp
BLAS_LIBS ?= -L$(BLAS_DIR) -Wl,-rpath,$(BLAS_DIR) -lopenblas
LDLIBS    += $(BLAS_LIBS) -lm
GTEST_LIBS ?= -lgtest -lgtest_main -pthread
# MPI (Debian's OpenMPI: openmpi-bin, libopenmpi-dev) for training on several
# processes, found through mpicxx. Without it every program still builds, for
# one process only (a run started by mpirun then says so and stops). The C API
# only: the deprecated C++ bindings are kept out (OMPI_SKIP_MPICXX).
MPICC     ?= mpicc
MPI_CFLAGS := $(shell $(MPICC) --showme:compile 2>/dev/null)
MPI_LIBS   := $(shell $(MPICC) --showme:link 2>/dev/null)
ifneq ($(strip $(MPI_LIBS)),)
MPI_DEFS  := -DKNNGPT_MPI -DOMPI_SKIP_MPICXX=1 -DMPICH_SKIP_MPICXX=1 $(MPI_CFLAGS)
CXXFLAGS  += $(MPI_DEFS)
LDLIBS    += $(MPI_LIBS)
endif

# The CUDA build: the same sources through nvcc for sm_80 (A100) and sm_90
# (H100/H200). Under the CPU emulator the CUDA sources build with $(CXX)
# instead (EMU_FLAGS), which is how `make test` runs them without a GPU.
NVCC       ?= nvcc
CUDA_ARCHS ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
NVCCFLAGS  ?= -O3 -std=c++17 $(CUDA_ARCHS) -Xcompiler -fopenmp,-Wall -I.
# extra nvcc flags, e.g. NVCC_EXTRA="-Xptxas -v" (registers, spills and shared memory per kernel)
NVCC_EXTRA ?=
NVCCFLAGS  += $(NVCC_EXTRA)
CUDA_LIBS  ?= -lcublasLt -lcublas -lgomp
EMU_FLAGS  := -DKNNGPT_CUDA -DKNNGPT_CUDA_EMU
# PRECISION=fp32 builds train_gpt with fp32 matmuls (default: bf16 operands, fp32 accumulation)
PRECISION  ?= bf16
PRECISION_FLAGS := $(if $(filter fp32,$(PRECISION)),-DKNNGPT_FP32,)
NEED_NVCC   = @command -v $(NVCC) >/dev/null 2>&1 || { echo "make $@: $(NVCC) not found: install the CUDA toolkit (nvcc on PATH, or NVCC=/path/to/nvcc); the CPU trainer is make train_gpt_cpu"; exit 1; }

# make test SANITIZE=1: everything the suite runs (tests, trainers,
# prepare_data) built with AddressSanitizer and UBSan into build/sanitize, its
# own directory, so the normal build stays as it is. tools/sanitize.supp lists
# what the leak checker is told to ignore, and why.
SANITIZE  ?= 0
# (GCC's maybe-uninitialized warning misfires under -fsanitize, in libstdc++'s <regex>)
SANITIZE_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined \
                  -Wno-maybe-uninitialized
ifeq ($(SANITIZE),1)
CXXFLAGS  += $(SANITIZE_FLAGS)
BUILD     := build/sanitize
# the programs the tests run live beside the tests, not in the repository root
PROGRAMS  := $(BUILD)/
SANITIZE_ENV := KNNGPT_BIN_DIR=$(BUILD) ASAN_OPTIONS=detect_leaks=1 \
                LSAN_OPTIONS=suppressions=$(CURDIR)/tools/sanitize.supp:print_suppressions=0 \
                UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
else
BUILD     := build
PROGRAMS  :=
SANITIZE_ENV :=
endif
TEST_SRCS := $(wildcard tests/test_*.cpp)
TEST_BINS := $(patsubst tests/%.cpp,$(BUILD)/tests/%,$(TEST_SRCS))
# the kernel tests of kernels/cuda, built again with nvcc to run on a GPU
NATIVE_TEST_SRCS := $(filter-out tests/test_cuda_trainer.cpp,$(wildcard tests/test_cuda_*.cpp))
NATIVE_TEST_BINS := $(patsubst tests/%.cpp,$(BUILD)/native/%,$(NATIVE_TEST_SRCS))
# The portable build (make test-portable): the bit-identity tests, and the
# programs test_cuda_trainer runs, again with PORTABLE_ARCHFLAGS in place of
# ARCHFLAGS, in a directory of their own so the main build stays as it is.
PORTABLE  := $(BUILD)/portable
PORTABLE_TESTS := test_topk_index test_philox test_draw_margin test_gumbel_attention test_sampled_grad test_sparse_attention \
                  test_cuda_knn test_cuda_gumbel test_cuda_sampled_grad test_cuda_trainer
PORTABLE_TEST_BINS := $(addprefix $(PORTABLE)/tests/,$(PORTABLE_TESTS))
PORTABLE_PROGRAMS  := $(addprefix $(PORTABLE)/,train_gpt_cpu prepare_data train_gpt_emu train_gpt_emu_bf16)
PYTHON    ?= /usr/bin/python3

# Header dependencies, generated: every compile (g++ and nvcc alike) writes
# $(DEPDIR)/<target>.d with -MMD -MP, the headers that target included (each
# also as an empty rule, so a deleted header does not stop make), and make
# reads them all back below. So touching a header rebuilds only the binaries
# that include it. Every binary also depends on its .d: one without (never
# built, or built before .d files existed) is rebuilt once.
DEPDIR    := $(BUILD)/deps
DEPFLAGS   = -MMD -MP -MF $(DEPDIR)/$@.d
MKDIRS     = @mkdir -p $(dir $@) $(dir $(DEPDIR)/$@)

.PHONY: all help test test-portable fuzz fuzz-bins test-native native-test-bins bench bench-train bench-attention bench-model bench-attention-long bench-model-long bench-model-64k bench-parallel bench-bpe compare-long clean reference

all: train_gpt_cpu prepare_data $(BUILD)/attn_meter

help:
	@echo "knngpt targets:"
	@echo "  make train_gpt_cpu   the CPU trainer (fp32, OpenMP + OpenBLAS)"
	@echo "  make train_gpt       the CUDA trainer (nvcc, sm_80 + sm_90, bf16 matmuls; PRECISION=fp32 for all fp32)"
	@echo "  make prepare_data    text file -> llm.c token shards (byte-level, or GPT-2's BPE)"
	@echo "  make test           build and run every test (GoogleTest); CUDA kernels under the emulator,"
	@echo "                      and natively too where a GPU and nvcc exist"
	@echo "  make test-portable  the bit-identity tests (and the programs test_cuda_trainer runs) built again"
	@echo "                      into $(PORTABLE)/ with PORTABLE_ARCHFLAGS in place of ARCHFLAGS, and run"
	@echo "  make test-native    the CUDA kernel tests built with nvcc, run on the GPU"
	@echo "  make build/bench_attention_cuda  exact attention TFLOP/s on a GPU (tools/gpu_check.sh runs it)"
	@echo "  make build/bench_checkpoint  a checkpoint's checksums and fsyncs against plain writes"
	@echo "  make build/kmv_stats  how much of each attention row kmv's heavy keys hold, on a trained model"
	@echo "  make build/compare_attention  attention settings trained and cross-evaluated against exact attention"
	@echo "  make compare-long   compare_attention --preset long on BENCH_TEXT: T = 1024, exact vs knn k 8..64,"
	@echo "                      knn-tail, heavy, sampled and stratified grads, dense-then-sparse, local window"
	@echo "                      and sinks, the window recipe; 2 seeds, ~20-60 min per run on 2 cores"
	@echo "                      (LONG_STEPS, LONG_SEEDS, LONG_OUT)"
	@echo "  make build/attn_meter  per layer and head: each mode's error against exact attention vs k, top-k mass,"
	@echo "                      kmv's heavy keys, assumption A's c vs T (trained and random init)"
	@echo "  make test SANITIZE=1  the whole suite built with ASan + UBSan into build/sanitize"
	@echo "  make fuzz           the libFuzzer targets of tests/fuzz (clang), each for FUZZ_SECONDS (30)"
	@echo "                      or FUZZ_RUNS inputs; FUZZ_TARGETS=\"fuzz_model_file ...\" picks some"
	@echo "  make reference      regenerate the PyTorch reference tensors (needs python3-torch)"
	@echo "  make bench          both benchmarks below"
	@echo "  make bench-train    training-step benchmark: ms/step, tok/s, ratio to plain-loop matmuls"
	@echo "  make bench-parallel one process of 2 threads vs two MPI processes of 1 (ZeRO-0, ZeRO-1): tok/s, bytes per step"
	@echo "  make bench-attention  every attention mode vs exact (one thread): time, ratio, recall, errors, slope,"
	@echo "                      n = 1K..16K, k = 32 and sqrt(n), uniform, clustered and trained-model inputs,"
	@echo "                      and the seed paper's forward and gradient experiments (BENCH_TEXT: the text)"
	@echo "  make bench-model    the small model bench-attention takes its trained-model inputs from"
	@echo "  make bench-attention-long  every mode on the q, k, v of a model trained at T = 16384 (n = 1K..16K)"
	@echo "  make bench-model-long  that model: 2 layers, 2 heads of 64, 200 steps (~12 min on 2 cores)"
	@echo "  make bench-model-64k   the same shape at T = 65536, trained with knn k = 32 on the heavy index (~3 min)"
	@echo "  make bench-bpe      GPT-2 BPE encoding vs js-tiktoken (node), one thread and more: ms, MB/s, ratio"
	@echo "  make clean          remove build outputs"
	@echo "variables: ARCHFLAGS (default -march=native), PORTABLE_ARCHFLAGS (default empty: plain x86-64,"
	@echo "           no AVX or FMA), OPT, CXX, BLAS_LIBS, NVCC, CUDA_ARCHS, PRECISION (bf16|fp32)"

# The trainer variants: all of them train/train_gpt.cpp, through one rule per
# compiler; TRAINER_FLAGS_<name> are a variant's own flags.
#   train_gpt_cpu              the CPU trainer
#   build/train_gpt_cpu_loops  the benchmark's baseline: plain-loop matmuls
#   build/train_gpt_emu        the CUDA trainer on the CPU emulator, fp32, and
#   build/train_gpt_emu_bf16   the default bf16 (test_cuda_trainer runs both against train_gpt_cpu)
#   train_gpt                  the CUDA trainer, nvcc, PRECISION
#   build/native/train_gpt_fp32, build/native/train_gpt_bf16
#                              both precisions, for the native trainer comparison
#   build/portable/train_gpt_cpu, train_gpt_emu, train_gpt_emu_bf16
#                              the same with PORTABLE_ARCHFLAGS, for make test-portable
TRAINER_FLAGS_train_gpt_cpu       :=
TRAINER_FLAGS_train_gpt_cpu_loops := -DKNNGPT_MATMUL_LOOPS
TRAINER_FLAGS_train_gpt_emu       := $(EMU_FLAGS) -DKNNGPT_FP32
TRAINER_FLAGS_train_gpt_emu_bf16  := $(EMU_FLAGS)
TRAINER_FLAGS_train_gpt           := -DKNNGPT_CUDA $(PRECISION_FLAGS)
TRAINER_FLAGS_train_gpt_fp32      := -DKNNGPT_CUDA -DKNNGPT_FP32
TRAINER_FLAGS_train_gpt_bf16      := -DKNNGPT_CUDA
CXX_TRAINERS  := train_gpt_cpu $(BUILD)/train_gpt_cpu_loops $(BUILD)/train_gpt_emu $(BUILD)/train_gpt_emu_bf16 \
                 $(PORTABLE)/train_gpt_cpu $(PORTABLE)/train_gpt_emu $(PORTABLE)/train_gpt_emu_bf16 \
                 $(if $(PROGRAMS),$(PROGRAMS)train_gpt_cpu)
NVCC_TRAINERS := train_gpt $(BUILD)/native/train_gpt_fp32 $(BUILD)/native/train_gpt_bf16

$(CXX_TRAINERS): %: train/train_gpt.cpp $(DEPDIR)/%.d
	$(MKDIRS)
	$(CXX) $(CXXFLAGS) $(TRAINER_FLAGS_$(notdir $@)) $(DEPFLAGS) -o $@ $< $(filter %/bpe.o,$^) $(LDLIBS) $(BPE_LIBS)

# compiled (-x cu) and linked in two steps: -x cu would also take bpe.o for CUDA source
$(NVCC_TRAINERS): %: train/train_gpt.cpp $(DEPDIR)/%.d
	$(NEED_NVCC)
	$(MKDIRS)
	@mkdir -p $(BUILD)/nvcc_obj
	$(NVCC) -x cu $(NVCCFLAGS) $(MPI_DEFS) $(TRAINER_FLAGS_$(notdir $@)) $(DEPFLAGS) -MT $@ -c \
	  -o $(BUILD)/nvcc_obj/$(notdir $@).o $<
	$(NVCC) $(NVCCFLAGS) -o $@ $(BUILD)/nvcc_obj/$(notdir $@).o $(filter %/bpe.o,$^) \
	  $(CUDA_LIBS) -lnccl $(MPI_LIBS) $(BPE_LIBS)

prepare_data $(PORTABLE)/prepare_data $(if $(PROGRAMS),$(PROGRAMS)prepare_data): %: data/prepare_data.cpp $(DEPDIR)/%.d
	$(MKDIRS)
	$(CXX) $(CXXFLAGS) $(DEPFLAGS) -o $@ $< $(filter %/bpe.o,$^) $(LDLIBS) $(BPE_LIBS)

# GPT-2's BPE (data/bpe.cpp), compiled once per build directory and linked into
# the programs that encode text: PCRE2 (Debian's libpcre2-dev) runs its
# pattern, nlohmann-json reads encoder.json.
BPE_LIBS := -lpcre2-8
$(BUILD)/bpe.o $(PORTABLE)/bpe.o: %/bpe.o: data/bpe.cpp $(DEPDIR)/%/bpe.o.d
	@printf '#include <pcre2.h>\n' | $(CXX) $(CXXFLAGS) -DPCRE2_CODE_UNIT_WIDTH=8 -fsyntax-only -x c++ - 2>/dev/null || \
	  { echo "make $@: PCRE2's headers not found (Debian/Ubuntu: apt-get install libpcre2-dev; bash tools/install_deps.sh" \
	         "installs everything). Or build the GPU programs elsewhere: tools/gpu_bundle.sh"; exit 1; }
	$(MKDIRS)
	$(CXX) $(CXXFLAGS) $(DEPFLAGS) -c -o $@ $<
train_gpt_cpu prepare_data $(BUILD)/train_gpt_cpu_loops $(BUILD)/train_gpt_emu $(BUILD)/train_gpt_emu_bf16 \
  $(if $(PROGRAMS),$(PROGRAMS)train_gpt_cpu $(PROGRAMS)prepare_data) \
  $(NVCC_TRAINERS) $(BUILD)/tests/test_bpe $(BUILD)/bench_bpe: $(BUILD)/bpe.o
$(PORTABLE)/train_gpt_cpu $(PORTABLE)/train_gpt_emu $(PORTABLE)/train_gpt_emu_bf16 $(PORTABLE)/prepare_data: $(PORTABLE)/bpe.o
$(BUILD)/tests/test_bpe: LDLIBS += $(BUILD)/bpe.o $(BPE_LIBS)

CXX_TEST   = $(CXX) $(CXXFLAGS) $(DEPFLAGS) -o $@ $< $(LDLIBS) $(GTEST_LIBS)
$(TEST_BINS): $(BUILD)/tests/%: tests/%.cpp $(DEPDIR)/$(BUILD)/tests/%.d
	$(MKDIRS)
	$(CXX_TEST)
$(PORTABLE_TEST_BINS): $(PORTABLE)/tests/%: tests/%.cpp $(DEPDIR)/$(PORTABLE)/tests/%.d
	$(MKDIRS)
	$(CXX_TEST)

# everything in the portable build: PORTABLE_ARCHFLAGS for ARCHFLAGS, whatever
# ARCHFLAGS the main build is given (environment or command line)
$(PORTABLE)/%: override ARCHFLAGS = $(PORTABLE_ARCHFLAGS)

$(NATIVE_TEST_BINS): $(BUILD)/native/%: tests/%.cpp $(DEPDIR)/$(BUILD)/native/%.d
	$(NEED_NVCC)
	$(MKDIRS)
	$(NVCC) -x cu $(NVCCFLAGS) -DKNNGPT_CUDA_NATIVE $(DEPFLAGS) -o $@ $< -L$(BLAS_DIR) -Xlinker -rpath,$(BLAS_DIR) -lopenblas \
	  $(CUDA_LIBS) -lgtest -lgtest_main -lpthread

# PyTorch reference tensors for the whole-model test; skipped (and the test
# reports the skip) where Debian's python3-torch is not installed.
reference: $(BUILD)/reference/expected.bin
$(BUILD)/reference/expected.bin: tests/reference/gpt2_reference.py
	@mkdir -p $(dir $@)
	@if $(PYTHON) -c "import torch" 2>/dev/null; then \
	  $(PYTHON) tests/reference/gpt2_reference.py --out $(BUILD)/reference; \
	else echo "python3-torch not found: PyTorch reference tests will be skipped"; fi

# Where nvcc exists, make test also builds train_gpt and the GPU attention
# benchmark (compile and link), so a renamed kernel cannot break them unseen. The
# native CUDA tests run where nvidia-smi lists a GPU and nvcc exists;
# elsewhere make test says they were skipped and why.
test: $(TEST_BINS) $(PROGRAMS)train_gpt_cpu $(PROGRAMS)prepare_data reference $(BUILD)/train_gpt_emu \
      $(BUILD)/train_gpt_emu_bf16 $(BUILD)/compare_attention $(BUILD)/attn_meter
	@bash tools/check_section_refs.sh
	@$(PYTHON) tools/check_links.py
	@KNNGPT_BUILD=$(BUILD) $(SANITIZE_ENV) sh tools/run_tests.sh $(TEST_BINS)
	@if [ "$(SANITIZE)" = 1 ]; then echo "train_gpt: not built in the sanitized suite (nvcc code is not sanitized; make test builds it)"; \
	elif command -v $(NVCC) >/dev/null 2>&1; then \
	  $(MAKE) --no-print-directory train_gpt $(BUILD)/bench_attention_cuda && \
	    echo "train_gpt, bench_attention_cuda: compiled and linked with nvcc"; \
	else echo "train_gpt: not built (no nvcc here)"; fi
	@if nvidia-smi -L 2>/dev/null | grep -q '^GPU' && command -v $(NVCC) >/dev/null 2>&1; then \
	  $(MAKE) --no-print-directory test-native; \
	else echo "cuda kernels run natively: 0 (native CUDA tests skipped: no GPU here, nvidia-smi lists none; tools/gpu_check.sh runs them on a GPU machine)"; fi

# The portable build, run: the tests find its programs through KNNGPT_BIN_DIR
# (train_gpt_cpu, prepare_data) and KNNGPT_BUILD (the emulated CUDA trainers).
test-portable: $(PORTABLE_TEST_BINS) $(PORTABLE_PROGRAMS)
	@echo "portable build, $(PORTABLE)/: PORTABLE_ARCHFLAGS='$(PORTABLE_ARCHFLAGS)' in place of ARCHFLAGS"
	@KNNGPT_BUILD=$(PORTABLE) KNNGPT_BIN_DIR=$(PORTABLE) KNNGPT_KERNEL_COVERAGE=0 sh tools/run_tests.sh $(PORTABLE_TEST_BINS)

native-test-bins: $(NATIVE_TEST_BINS) $(BUILD)/native/train_gpt_fp32 $(BUILD)/native/train_gpt_bf16

test-native: $(NATIVE_TEST_BINS) $(BUILD)/native/train_gpt_fp32 $(BUILD)/native/train_gpt_bf16 \
             $(BUILD)/tests/test_cuda_trainer train_gpt_cpu prepare_data
	@KNNGPT_BUILD=$(BUILD) KNNGPT_CUDA_TRAINER=$(BUILD)/native/train_gpt_fp32 \
	  KNNGPT_CUDA_TRAINER_BF16=$(BUILD)/native/train_gpt_bf16 \
	  sh tools/run_tests.sh $(NATIVE_TEST_BINS) $(BUILD)/tests/test_cuda_trainer

# exact attention TFLOP/s on a GPU (tools/gpu_check.sh runs it)
$(BUILD)/bench_attention_cuda: tools/bench_attention_cuda.cu $(DEPDIR)/$(BUILD)/bench_attention_cuda.d
	$(NEED_NVCC)
	$(MKDIRS)
	$(NVCC) $(NVCCFLAGS) $(DEPFLAGS) -o $@ $< $(CUDA_LIBS)

$(BUILD)/bench_attention: tools/bench_attention.cpp $(DEPDIR)/$(BUILD)/bench_attention.d
	$(MKDIRS)
	$(CXX) $(CXXFLAGS) $(DEPFLAGS) -o $@ $< $(LDLIBS)

# what a checkpoint's checksums and fsyncs cost, against plain writes (tools/bench_checkpoint.cpp)
$(BUILD)/bench_checkpoint: tools/bench_checkpoint.cpp $(DEPDIR)/$(BUILD)/bench_checkpoint.d
	$(MKDIRS)
	$(CXX) $(CXXFLAGS) $(DEPFLAGS) -o $@ $< $(LDLIBS)

# GPT-2 BPE encoding speed against js-tiktoken, side by side (tools/bench_bpe.cpp)
$(BUILD)/bench_bpe: tools/bench_bpe.cpp $(DEPDIR)/$(BUILD)/bench_bpe.d
	$(MKDIRS)
	$(CXX) $(CXXFLAGS) $(DEPFLAGS) -o $@ $< $(BUILD)/bpe.o $(BPE_LIBS)

bench-bpe: $(BUILD)/bench_bpe
	$(BUILD)/bench_bpe

# attention settings against exact attention, trained and cross-evaluated by the
# trainer (tools/compare_attention.cpp; needs nlohmann-json3-dev, no BLAS)
$(BUILD)/compare_attention: tools/compare_attention.cpp $(DEPDIR)/$(BUILD)/compare_attention.d
	$(MKDIRS)
	$(CXX) $(CXXFLAGS) $(DEPFLAGS) -o $@ $<

# the attention meters of a model file (tools/attn_meter.cpp; nlohmann-json3-dev)
$(BUILD)/attn_meter: tools/attn_meter.cpp $(DEPDIR)/$(BUILD)/attn_meter.d
	$(MKDIRS)
	$(CXX) $(CXXFLAGS) $(DEPFLAGS) -o $@ $< $(LDLIBS)

# kmv's heavy keys on a trained model (tools/kmv_stats.cpp)
$(BUILD)/kmv_stats: tools/kmv_stats.cpp $(DEPDIR)/$(BUILD)/kmv_stats.d
	$(MKDIRS)
	$(CXX) $(CXXFLAGS) $(DEPFLAGS) -o $@ $< $(LDLIBS)

# libFuzzer targets (tests/fuzz/fuzz_*.cpp), one per reader of outside bytes,
# built with Debian's clang (tools/install_deps.sh --fuzz) under ASan + UBSan
# into build/fuzz. make fuzz builds and runs each for FUZZ_SECONDS, or for
# FUZZ_RUNS inputs when that is set, from its seed corpus tests/fuzz/corpus/NAME
# (tools/run_fuzz.sh; FUZZ_TARGETS picks some).
FUZZ_CXX     ?= clang++
FUZZ_FLAGS   ?= -g -O2 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer \
                -Wno-pass-failed
FUZZ_SECONDS ?= 30
FUZZ_RUNS    ?=
FUZZ_DIR     := build/fuzz
FUZZ_BINS    := $(patsubst tests/fuzz/%.cpp,$(FUZZ_DIR)/%,$(wildcard tests/fuzz/fuzz_*.cpp))
FUZZ_TARGETS ?= $(notdir $(FUZZ_BINS))

fuzz-bins: $(FUZZ_BINS)
fuzz: $(FUZZ_BINS)
	@FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_RUNS=$(FUZZ_RUNS) FUZZ_DIR=$(FUZZ_DIR) sh tools/run_fuzz.sh $(FUZZ_TARGETS)

$(FUZZ_BINS): $(FUZZ_DIR)/%: tests/fuzz/%.cpp $(DEPDIR)/$(FUZZ_DIR)/%.d
	@command -v $(FUZZ_CXX) >/dev/null 2>&1 || { echo "make $@: $(FUZZ_CXX) not found: bash tools/install_deps.sh --fuzz"; exit 1; }
	$(MKDIRS)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -std=c++17 -fopenmp -Wall -Wextra -I. $(DEPFLAGS) -o $@ $< $(FUZZ_EXTRA_$(notdir $@)) \
	  $(BLAS_LIBS) -lm

# the targets that include prepare_data's or the trainer's source also need GPT-2's BPE
FUZZ_EXTRA_fuzz_prepare_data := data/bpe.cpp $(BPE_LIBS)
FUZZ_EXTRA_fuzz_train_args   := data/bpe.cpp $(BPE_LIBS)

bench: bench-train bench-attention bench-parallel

bench-train: train_gpt_cpu prepare_data $(BUILD)/train_gpt_cpu_loops
	bash tools/bench_train.sh

bench-parallel: train_gpt_cpu
	bash tools/bench_parallel.sh

# bench-attention's trained-model inputs: a GPT of 2 layers and 2 heads of size 64
# trained for 400 steps at its context T = 1024 on BENCH_TEXT (about 10 minutes on one
# core), once; the bench takes the q, k, v of each of its layers at n = 1024.
BENCH_TEXT  ?= $(or $(KNNGPT_TEXT),data/tinyshakespeare.txt)
BENCH_MODEL := $(BUILD)/bench_model/model_00000400.bin
# $(call train_bench_model,DIR,FLAGS): the bench models' recipe, the shape shared and FLAGS
# (context, batch, steps, schedule) their own
define train_bench_model
	@test -f "$(BENCH_TEXT)" || { echo "make $@: no text at BENCH_TEXT=$(BENCH_TEXT) (tools/quickstart.sh fetches tinyshakespeare there; or pass BENCH_TEXT=FILE)"; exit 1; }
	./prepare_data --input "$(BENCH_TEXT)" --out-dir $(1) --name text
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-$$(nproc)} ./train_gpt_cpu -i $(1)/text_train.bin -j $(1)/text_val.bin \
	  --layers 2 --heads 2 --channels 128 $(2) --shuffle 1 -v 0 -m 8 -s 0 -o $(1)
endef
$(BENCH_MODEL): | train_gpt_cpu prepare_data
	$(call train_bench_model,$(BUILD)/bench_model,-t 1024 -b 4 -x 400 -l 2e-3 -u 40)
bench-model: $(BENCH_MODEL)

# The same shape trained at its context T = 16384 (B 1, 200 steps, 3.3M tokens: about
# 12 minutes on 2 cores), once: the issue's n = 16K targets on real attention.
# bench-attention-long benchmarks each of its layers at n = 1K .. 16K (the first n tokens
# of its window), every mode.
BENCH_LONG_MODEL := $(BUILD)/bench_model_16k/model_00000200.bin
$(BENCH_LONG_MODEL): | train_gpt_cpu prepare_data
	$(call train_bench_model,$(BUILD)/bench_model_16k,-t 16384 -b 1 -x 200 -l 2e-3 -u 20)
bench-model-long: $(BENCH_LONG_MODEL)

# the slope to n = 64K on trained attention: exact attention would take hours a run at this
# context on a CPU, so this model trains with the heavy index (knn k = 32); 50 steps are the
# 16K model's 3.3M tokens (100 steps already overfit: val loss 2.69 at 50, 2.71 at 100)
BENCH_64K_MODEL := $(BUILD)/bench_model_64k/model_00000050.bin
$(BENCH_64K_MODEL): | train_gpt_cpu prepare_data
	$(call train_bench_model,$(BUILD)/bench_model_64k,-t 65536 -b 1 -x 50 -l 2e-3 -u 5 --attn knn --attn-k 32 --attn-index heavy)
bench-model-64k: $(BENCH_64K_MODEL)

bench-attention-long: $(BUILD)/bench_attention $(BENCH_LONG_MODEL)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BUILD)/bench_attention --csv $(BUILD)/bench_attention_long.csv \
	  --from-checkpoint $(BENCH_LONG_MODEL) --data "$(BENCH_TEXT)" --inputs model --no-paper

# one thread unless OMP_NUM_THREADS says otherwise (the figures README quotes are one thread's)
bench-attention: $(BUILD)/bench_attention $(BENCH_MODEL)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BUILD)/bench_attention --csv $(BUILD)/bench_attention.csv \
	  --from-checkpoint $(BENCH_MODEL) --data "$(BENCH_TEXT)"

# Long context on a CPU (tools/README.md): compare_attention's long preset, T = 1024 with
# the baby shape, B 4, LONG_STEPS steps (3000: about an hour per run on 2 cores), two
# seeds. It resumes where it stopped (rerun the same command); LONG_OUT holds
# results.md and the plots.
LONG_STEPS ?= 3000
LONG_SEEDS ?= 1337,1
LONG_OUT   ?= $(BUILD)/compare_long
compare-long: $(BUILD)/compare_attention $(BUILD)/attn_meter train_gpt_cpu prepare_data
	@test -f "$(BENCH_TEXT)" || { echo "make $@: no text at BENCH_TEXT=$(BENCH_TEXT) (or pass BENCH_TEXT=FILE)"; exit 1; }
	$(BUILD)/compare_attention --preset long --text "$(BENCH_TEXT)" --out $(LONG_OUT) --seeds $(LONG_SEEDS) \
	  -- -x $(LONG_STEPS) -v $$(( $(LONG_STEPS) / 10 ))

clean:
	rm -rf $(BUILD) train_gpt_cpu train_gpt prepare_data

# the generated header lists (see DEPDIR). A .d not there yet has this empty
# rule, so its binary is out of date. The binaries' rules are explicit or
# static pattern rules, which name each .d: were a .d only a pattern rule's
# prerequisite, make would take it for an intermediate file, rebuild nothing
# when it is missing, and (but for .PRECIOUS) delete it after the build.
$(DEPDIR)/%.d: ;
.PRECIOUS: $(DEPDIR)/%.d
-include $(shell find $(DEPDIR) -name '*.d' 2>/dev/null)
