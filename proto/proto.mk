# Protobuf code generation. Included from the top-level Makefile
# (include proto/proto.mk); paths are relative to the repository root.
#
#   make proto        regenerate proto/dragon/v1/*.pb.go (committed)
#   make proto-lint   buf lint (buf runs through `go run`, nothing to install)
#
# protoc is Debian's protobuf-compiler; the Go plugins are pinned here and
# installed into build/bin, so the generated headers are reproducible.

GO ?= go
PROTOC ?= protoc
PROTOC_GEN_GO_VERSION ?= v1.36.12
PROTOC_GEN_GO_GRPC_VERSION ?= v1.5.1
BUF_VERSION ?= v1.50.0
PROTO_BIN := $(CURDIR)/build/bin
PROTO_DIR := proto
PROTO_FILES := $(wildcard $(PROTO_DIR)/dragon/v1/*.proto) $(wildcard $(PROTO_DIR)/weaviate/v1/*.proto)
# A stamp per plugin version, so bumping a version reinstalls the plugin.
PROTOC_GEN_GO := $(PROTO_BIN)/.protoc-gen-go-$(PROTOC_GEN_GO_VERSION)
PROTOC_GEN_GO_GRPC := $(PROTO_BIN)/.protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION)

.PHONY: proto proto-lint

proto: $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC)
	@command -v $(PROTOC) >/dev/null || { echo "protoc not found: apt-get install protobuf-compiler"; exit 1; }
	$(PROTOC) -I $(PROTO_DIR) \
	  --plugin=protoc-gen-go=$(PROTO_BIN)/protoc-gen-go \
	  --plugin=protoc-gen-go-grpc=$(PROTO_BIN)/protoc-gen-go-grpc \
	  --go_out=$(PROTO_DIR) --go_opt=paths=source_relative \
	  --go-grpc_out=$(PROTO_DIR) --go-grpc_opt=paths=source_relative \
	  $(PROTO_FILES)

$(PROTOC_GEN_GO):
	@mkdir -p $(PROTO_BIN)
	GOBIN=$(PROTO_BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	@touch $@

$(PROTOC_GEN_GO_GRPC):
	@mkdir -p $(PROTO_BIN)
	GOBIN=$(PROTO_BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	@touch $@

proto-lint:
	cd $(PROTO_DIR) && $(GO) run github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION) lint
