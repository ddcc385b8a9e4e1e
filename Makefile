# knngpt — `make help` lists the targets.
#
# Everything is header-only C++17 (kernels/, model/, data/); each program and
# each test is one translation unit, so `make -j2` is always safe.

CXX       ?= g++
ARCHFLAGS ?= -march=native
OPT       ?= -O3
CXXFLAGS  += $(OPT) $(ARCHFLAGS) -std=c++17 -fopenmp -Wall -Wextra -I.
MULTIARCH := $(shell $(CXX) -print-multiarch 2>/dev/null)
# OpenBLAS, the OpenMP build (Debian's libopenblas-openmp-dev): it shares the
# OpenMP thread pool of our own kernels instead of spinning up a second pool.
BLAS_DIR  ?= /usr/lib/$(MULTIARCH)/openblas-openmp
BLAS_LIBS ?= -L$(BLAS_DIR) -Wl,-rpath,$(BLAS_DIR) -lopenblas
LDLIBS    += $(BLAS_LIBS) -lm
GTEST_LIBS ?= -lgtest -lgtest_main -pthread

BUILD     := build
HEADERS   := $(wildcard model/*.h kernels/common/*.h kernels/cpu/*.h kernels/emu/*.h kernels/cuda/*.cuh data/*.h)
TEST_SRCS := $(wildcard tests/test_*.cpp)
TEST_BINS := $(patsubst tests/%.cpp,$(BUILD)/tests/%,$(TEST_SRCS))
PYTHON    ?= /usr/bin/python3

.PHONY: all help test bench bench-train bench-attention clean reference

all: train_gpt_cpu prepare_data

help:
	@echo "knngpt targets:"
	@echo "  make train_gpt_cpu   the CPU trainer (fp32, OpenMP + OpenBLAS)"
	@echo "  make prepare_data    text file -> llm.c token shards"
	@echo "  make test           build and run every test (GoogleTest)"
	@echo "  make reference      regenerate the PyTorch reference tensors (needs python3-torch)"
	@echo "  make bench          both benchmarks below"
	@echo "  make bench-train    training-step benchmark: ms/step, tok/s, ratio to plain-loop matmuls"
	@echo "  make bench-attention  every attention mode vs exact: time, error, lsh recall, n = 1K..16K"
	@echo "  make clean          remove build outputs"
	@echo "variables: ARCHFLAGS (default -march=native), OPT, CXX, BLAS_LIBS"

train_gpt_cpu: train/train_gpt.cpp $(HEADERS)
	$(CXX) $(CXXFLAGS) -o $@ $< $(LDLIBS)

prepare_data: data/prepare_data.cpp $(HEADERS)
	$(CXX) $(CXXFLAGS) -o $@ $< $(LDLIBS)

$(BUILD)/tests/%: tests/%.cpp $(HEADERS) tests/test_util.h tests/attention_test_util.h tests/cuda_test_util.h
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -o $@ $< $(LDLIBS) $(GTEST_LIBS)

# PyTorch reference tensors for the whole-model test; skipped (and the test
# reports the skip) where Debian's python3-torch is not installed.
reference: $(BUILD)/reference/expected.bin
$(BUILD)/reference/expected.bin: tests/reference/gpt2_reference.py
	@mkdir -p $(dir $@)
	@if $(PYTHON) -c "import torch" 2>/dev/null; then \
	  $(PYTHON) tests/reference/gpt2_reference.py --out $(BUILD)/reference; \
	else echo "python3-torch not found: PyTorch reference tests will be skipped"; fi

test: $(TEST_BINS) train_gpt_cpu prepare_data reference
	@KNNGPT_BUILD=$(BUILD) sh tools/run_tests.sh $(TEST_BINS)

# the benchmark's baseline: the same trainer with plain-loop matmuls
$(BUILD)/train_gpt_cpu_loops: train/train_gpt.cpp $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -DKNNGPT_MATMUL_LOOPS -o $@ $< $(LDLIBS)

$(BUILD)/bench_attention: tools/bench_attention.cpp $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -o $@ $< $(LDLIBS)

bench: bench-train bench-attention

bench-train: train_gpt_cpu prepare_data $(BUILD)/train_gpt_cpu_loops
	bash tools/bench_train.sh

bench-attention: $(BUILD)/bench_attention
	$(BUILD)/bench_attention --csv $(BUILD)/bench_attention.csv

clean:
	rm -rf $(BUILD) train_gpt_cpu prepare_data
