#!/usr/bin/env bash
# Creates the llama-cpp-python venv used by processors/inference/chat's tests, and the tiny
# test model in it:
#   ${LLAMACPP_VENV:-$HOME/.cache/carehub/llamacpp-venv}            python -m llama_cpp.server
#   ${LLAMACPP_VENV:-$HOME/.cache/carehub/llamacpp-venv}/tiny.gguf  made by make_tiny_model.py
# Idempotent: the venv keeps a copy of the requirements.txt it was built from and is
# re-created only when tests/llamacpp/requirements.txt differs from that copy; the model is
# re-made (in a second) only when make_tiny_model.py differs from the venv's copy.
# PYTHON (default python3.11, else python3) must be Python 3.11; cmake (>= 3.21) and a C++
# compiler must be installed (PyPI has llama-cpp-python only as source).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
reqs="$here/requirements.txt"
script="$here/make_tiny_model.py"
venv="${LLAMACPP_VENV:-$HOME/.cache/carehub/llamacpp-venv}"
python="${PYTHON:-$(command -v python3.11 || command -v python3)}"

# make_model writes the model beside the venv's copy of the script it came from, renaming
# it into place so that a test never sees half a file.
make_model() {
	"$venv/bin/python" "$script" --out "$venv/tiny.gguf.tmp"
	mv "$venv/tiny.gguf.tmp" "$venv/tiny.gguf"
	cp "$script" "$venv/make_tiny_model.py"
}

if cmp -s "$reqs" "$venv/requirements.txt" && [ -x "$venv/bin/python" ]; then
	if ! cmp -s "$script" "$venv/make_tiny_model.py" || [ ! -f "$venv/tiny.gguf" ]; then
		make_model
	fi
	echo "llamacpp venv up to date: $venv"
	exit 0
fi
ver="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$ver" != "3.11" ]; then
	echo "setup.sh: $python is Python $ver; requirements.txt is pinned for Python 3.11 (set PYTHON=...)" >&2
	exit 1
fi
for tool in cmake c++; do
	command -v "$tool" >/dev/null || { echo "setup.sh: $tool not found; llama-cpp-python is built from source" >&2; exit 1; }
done
echo "creating llamacpp venv: $venv (compiles llama.cpp, a few minutes)"
rm -rf "$venv"
"$python" -m venv "$venv"
pip=("$venv/bin/pip" install -q --disable-pip-version-check)
# The build backend comes from requirements.txt (pinned), not from an isolated build
# environment that would install whatever scikit-build-core is newest.
"${pip[@]}" $(grep -E '^(scikit-build-core|packaging|pathspec)==' "$reqs")

# Only what the Python bindings load: libllama and ggml's CPU backend. No llama.cpp
# programs, tests, examples or multimodal (mtmd) library, no GPU backends, no network
# code. -O0: compiling is the whole cost of setup; the tests' model is so small that
# unoptimized inference is still milliseconds per token (-O0 compiles ~3x faster than -O3).
# llama-cpp-python's CMakeLists forces LLAMA_BUILD_COMMON on, but the bindings load only
# libllama and ggml: llama.cpp's common library (chat parsers, argument parsing, an HTTP
# client; 53 of 127 objects, ~40% of the compile time) is dead weight. A file that CMake
# includes right after llama.cpp's project() call switches it off again before llama.cpp
# reads the option.
no_common="$venv/carehub-no-common.cmake"
echo 'set(LLAMA_BUILD_COMMON OFF CACHE BOOL "" FORCE)' >"$no_common"
export CMAKE_ARGS="-DLLAVA_BUILD=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE='$no_common' \
 -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
 -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_MTMD=OFF \
 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_ALL_WARNINGS=OFF \
 -DGGML_NATIVE=ON -DGGML_CPU=ON -DGGML_BACKEND_DL=OFF -DGGML_CPU_ALL_VARIANTS=OFF \
 -DGGML_CUDA=OFF -DGGML_HIP=OFF -DGGML_MUSA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF \
 -DGGML_SYCL=OFF -DGGML_OPENCL=OFF -DGGML_RPC=OFF -DGGML_BLAS=OFF -DGGML_WEBGPU=OFF \
 -DCMAKE_C_FLAGS_RELEASE=-O0\ -DNDEBUG -DCMAKE_CXX_FLAGS_RELEASE=-O0\ -DNDEBUG"
export CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
"${pip[@]}" --no-build-isolation -r "$reqs"
make_model
cp "$reqs" "$venv/requirements.txt"
"$venv/bin/python" -c 'import llama_cpp; print("llama-cpp-python", llama_cpp.__version__)'
