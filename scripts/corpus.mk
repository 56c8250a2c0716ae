# Demo corpora and their indexes; included from the top-level Makefile after
# MODEL and THREADS are set.
#   make corpus   fetch data/corpus/sotu (cloud) and data/corpus/mail (device)
#   make index    build data/index/cloud and data/index/device with bin/dragon
# An index is rebuilt only when its corpus was fetched again (or is missing);
# `make index-clean` forces a rebuild. INDEX_FLAGS passes extra flags, e.g.
# INDEX_FLAGS='--dense=false' for a BM25-only pair.
# Cost on the 2-core dev machine: each corpus is about 2.1M tokens (33k and
# 36k passages of 64 tokens); BM25 alone indexes one in ~10 s, but embedding
# with SmolLM2-135M runs at 120-250 tokens/s, i.e. 2.5-5 hours per corpus.
CORPUS ?= data/corpus
INDEX ?= data/index
INDEX_FLAGS ?=

.PHONY: corpus index index-qwen index-clean

corpus:
	@scripts/fetch-corpus.sh $(CORPUS)

$(CORPUS)/sotu/.complete $(CORPUS)/mail/.complete:
	@scripts/fetch-corpus.sh $(CORPUS)

index: $(INDEX)/cloud/manifest.json $(INDEX)/device/manifest.json

# build and model are phony: order-only, they run first but do not force a
# rebuild of the index.
$(INDEX)/cloud/manifest.json: $(CORPUS)/sotu/.complete | build model
	bin/dragon index build --dir $(INDEX)/cloud --model $(MODEL) --threads $(THREADS) $(INDEX_FLAGS) $(CORPUS)/sotu

$(INDEX)/device/manifest.json: $(CORPUS)/mail/.complete | build model
	bin/dragon index build --dir $(INDEX)/device --model $(MODEL) --threads $(THREADS) $(INDEX_FLAGS) $(CORPUS)/mail

# The same corpora cut by the Qwen pair's tokenizer, for make run-qwen.
index-qwen: $(QWEN_INDEX)/cloud/manifest.json $(QWEN_INDEX)/device/manifest.json

$(QWEN_INDEX)/cloud/manifest.json: $(CORPUS)/sotu/.complete | build $(QWEN_CLOUD)
	bin/dragon index build --dir $(QWEN_INDEX)/cloud --model $(QWEN_CLOUD) --threads $(THREADS) $(INDEX_FLAGS) $(CORPUS)/sotu

$(QWEN_INDEX)/device/manifest.json: $(CORPUS)/mail/.complete | build $(QWEN_DEVICE)
	bin/dragon index build --dir $(QWEN_INDEX)/device --model $(QWEN_DEVICE) --threads $(THREADS) $(INDEX_FLAGS) $(CORPUS)/mail

index-clean:
	rm -rf $(INDEX)/cloud $(INDEX)/device
