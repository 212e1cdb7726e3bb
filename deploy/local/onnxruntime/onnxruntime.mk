# ONNX Runtime shared library for the embedded inference package (processors/inference/onnx).
# Include from the main Makefile:  include deploy/local/onnxruntime/onnxruntime.mk
#
# ONNXRUNTIME_VERSION must match the C API headers of github.com/yalue/onnxruntime_go in
# go.mod (v1.27.0 vendors the onnxruntime 1.24.1 headers, ORT_API_VERSION 24); bump both together.

ONNXRUNTIME_MK_DIR  := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
ONNXRUNTIME_VERSION ?= 1.24.1
ONNXRUNTIME_DIR     ?= $(HOME)/.cache/carehub/onnxruntime/$(ONNXRUNTIME_VERSION)
ONNXRUNTIME_LIB     ?= $(ONNXRUNTIME_DIR)/libonnxruntime.so

# Recipes (go test, go run, ...) see the library path; processors/inference/onnx reads it.
export CAREHUB_ONNXRUNTIME_LIB ?= $(ONNXRUNTIME_LIB)

.PHONY: onnxruntime-deps
onnxruntime-deps: ## install the ONNX Runtime shared library (from the PyPI wheel) into ONNXRUNTIME_DIR
	@ONNXRUNTIME_VERSION=$(ONNXRUNTIME_VERSION) ONNXRUNTIME_DIR=$(ONNXRUNTIME_DIR) PYTHON=$(or $(PYTHON),python3) \
		$(ONNXRUNTIME_MK_DIR)/fetch.sh
