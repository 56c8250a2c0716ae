# Demo corpora and their indexes; included from the top-level Makefile after
# MODEL and THREADS are set.
#   make corpus   fetch data/corpus/sotu (cloud) and data/corpus/mail (device)
#   make index    build data/index/cloud and data/index/device with bin/dragon
# An index is rebuilt only when its corpus was fetched again (or is missing);
# `make index-clean` forces a rebuild. INDEX_FLAGS passes extra flags, e.g.
# INDEX_FLAGS='--dense=false' for a quick BM25-only pair.
CORPUS ?= data/corpus
INDEX ?= data/index
INDEX_FLAGS ?=

.PHONY: corpus index index-clean

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

index-clean:
	rm -rf $(INDEX)/cloud $(INDEX)/device
