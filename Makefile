# kvnode — top-level build.  `make help` lists the targets.
#
#   make            build kvnoded, libkvnode (.so/.a/.pc) and kvnodectl into $(BUILD)
#   make install    PREFIX (/usr/local), DESTDIR, LIBDIR (default: lib/<multiarch> on Debian,
#                   else lib64 or lib, under PREFIX); then ldconfig
#   make run        deps + build (BUILD_JOBS compilers at once) + kvnoded in the foreground with
#                   conf/kvnode.conf; ARGS passes options, e.g. ARGS='--set memory.host_bytes=8GiB
#                   --set admin.listen=127.0.0.1:9181'
#   make test       deps + build (BUILD_JOBS compilers at once; default: the CPU count) + every
#                   test suite (TEST_JOBS=N at once; default 2 x CPUs)
#   make asan       the test suite under ASan+UBSan (separate build dir)
#   make valgrind   the test suite under valgrind (tests and daemons)
#   make bench      build and run the benchmarks (not part of `make test`); make bench-startup:
#                   first PING and population time of 1, 4 and 8 GiB host tiers; make bench-kvs:
#                   the KVS front end (rtp-llm's protocol) next to libkvnode, 64/256 blocks of 64 KiB;
#                   make bench-adapters: the Python SGLang / LMCache adapters next to the C API;
#                   make bench-node: issue 32's figures (syscalls per round trip counted with perf,
#                   16-key MATCH of 4/16 clients vs redis EXISTS pipelines, MATCH x256 over 1 M
#                   blocks vs hot keys, index memory per block, zero-copy GET/PUT vs memcpy) next to
#                   redis-server on a unix socket and a raw socket ping-pong, client and daemon on
#                   one CPU and on two (also in make bench where redis-server is installed);
#                   BENCH_NODE_ARGS=--quick finishes in under a minute, --section3 runs only
#                   the 16-key MATCH of many clients, --section4 only the MATCH x256 /
#                   memory-per-block section, --section5 only zero-copy GET/PUT
#   make soak       mixed traffic with client and daemon kill -9s, then a byte-exact check of
#                   everything acknowledged; SOAK_SECONDS (default 300), SOAK_ARGS (not in `make test`)
#   make V6D=0 ...  build without the rtp-llm KVS backend
#   make fuzz       libFuzzer targets (clang, in build-fuzz/), FUZZ_SECONDS each (default 60)

VERSION   := 0.1.0
SOVERSION := 0

BUILD     ?= build
GEN       := $(BUILD)/gen
PREFIX    ?= /usr/local
# Where `make install` puts libkvnode and kvnode.pc: Debian's multiarch folder
# (lib/x86_64-linux-gnu) on Debian and its derivatives, lib64 where the system
# keeps 64-bit libraries there (a real /usr/lib64: Fedora, RHEL, SUSE), else lib.
MULTIARCH  = $(shell $(CC) -print-multiarch 2>/dev/null)
LIBDIR    ?= $(PREFIX)/$(if $(and $(wildcard /etc/debian_version),$(MULTIARCH)),lib/$(MULTIARCH),$(if \
                 $(shell test -d /usr/lib64 -a ! -L /usr/lib64 && echo y),lib64,lib))
DESTDIR   ?=
CC        ?= cc
# Compilers `make test` and `make asan` run at once (a plain `make` honours -j as given).
BUILD_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PKG_CONFIG ?= pkg-config

# --- CUDA ----------------------------------------------------------------------
# Nothing is built against CUDA: kvnoded loads the driver (libcuda.so.1),
# libkvnode and kvnode-gpu-check the runtime (libcudart.so*) at run time.

# --- flags -------------------------------------------------------------------
OPT       ?= -O2
CFLAGS    ?= $(OPT) -g
WARN      := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes
BASEFLAGS := -std=c11 -D_GNU_SOURCE -fPIC $(WARN) -DKVNODE_VERSION_STRING='"$(VERSION)"' \
             -Ilib -Idaemon -I$(GEN)
ifeq ($(SAN),1)
  BASEFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
  LDSAN     := -fsanitize=address,undefined
endif
# FUZZ=1 (make fuzz): every object gets libFuzzer's coverage instrumentation.
ifeq ($(FUZZ),1)
  BASEFLAGS += -fsanitize=fuzzer-no-link
endif

pc_cflags = $(shell $(PKG_CONFIG) --cflags $(1) 2>/dev/null)
pc_libs   = $(shell $(PKG_CONFIG) --libs $(1) 2>/dev/null)

LIB_PKGS    := libprotobuf-c
# libcurl is always linked into kvnoded (the KVCM client, daemon/kvcm/); V6D=0
# leaves out only the rtp-llm KVS backend (daemon/persist/kvs/v6d.c and v6d_*.c).
V6D       ?= 1
# hiredis: the redis store backend (daemon/persist/kvs/redis*.c); required like the
# other libraries (make deps installs it), not optional like V6D.
DAEMON_PKGS := libevent libprotobuf-c jansson inih libsystemd libcurl hiredis
ifeq ($(V6D),1)
  BASEFLAGS   += -DKVNODE_HAVE_V6D
endif
CHECK_PKGS  := check

ALL_CFLAGS  = $(BASEFLAGS) $(call pc_cflags,$(DAEMON_PKGS) $(CHECK_PKGS)) $(CFLAGS) $(CPPFLAGS)
DAEMON_LIBS = $(call pc_libs,$(DAEMON_PKGS)) -ldl -lpthread -lm
LIB_LIBS    = $(call pc_libs,$(LIB_PKGS)) -ldl -lpthread
CHECK_LIBS  = $(call pc_libs,$(CHECK_PKGS))

# --- sources -----------------------------------------------------------------
PROTO_C      := $(GEN)/kvnode.pb-c.c
PROTO_H      := $(GEN)/kvnode.pb-c.h
COMMON_SRC   := lib/wire.c lib/hash.c lib/sha256.c lib/errors.c
LIB_SRC      := lib/client.c lib/client_io.c lib/client_async.c lib/client_submit.c lib/client_ops.c lib/client_gpu.c lib/cudart.c lib/prefault.c lib/copy.c lib/copy_device.c $(COMMON_SRC)
DAEMON_SRC   := $(filter-out daemon/main.c $(if $(filter 1,$(V6D)),,daemon/persist/kvs/v6d%.c),$(wildcard daemon/*.c daemon/*/*.c daemon/persist/kvs/*.c))
CTL_SRC      := $(wildcard ctl/*.c)
# The KVS front end's suites use the v6d backend's key and hash helpers as the client side: V6D=1 only.
UNIT_SRC     := $(filter-out $(if $(filter 1,$(V6D)),,tests/unit/test_kvs_v6d.c tests/unit/test_kvs_server_keys.c),$(wildcard tests/unit/test_*.c))
# The v6d persistence suite drives the KVS simulator against the v6d backend: V6D=1 only.
INTEG_SRC    := $(filter-out $(if $(filter 1,$(V6D)),,tests/integration/test_daemon_persist_v6d.c tests/integration/test_kvs_server.c),$(wildcard tests/integration/test_*.c))
INTEG_HELPER := tests/integration/harness.c

# The strict fake CUDA for the tests (rules below, with the test programs).
FAKECUDA_OUT   := $(BUILD)/tests/fakecuda
FAKECUDA_SO    := $(FAKECUDA_OUT)/libfakecuda.so
FAKECUDA_SRC   := $(wildcard tests/fakecuda/*.c)
FAKECUDA_HDRS  := $(wildcard tests/fakecuda/*.h)
FAKECUDA_NAMES := libcuda.so.1 libcuda.so libcudart.so libcudart.so.12

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
PROTO_OBJ  := $(BUILD)/obj/gen/kvnode.pb-c.o
COMMON_OBJ := $(call obj,$(COMMON_SRC)) $(PROTO_OBJ)
LIB_OBJ    := $(call obj,$(LIB_SRC)) $(PROTO_OBJ)
DAEMON_OBJ := $(call obj,$(DAEMON_SRC))
# The tests' one launcher of child processes (tests/common/proc.c), linked into the unit,
# integration and simulator tests, the benchmarks and the soak.
TEST_PROC_OBJ := $(call obj,tests/common/proc.c)

KVNODED   := $(BUILD)/kvnoded
KVNODECTL := $(BUILD)/kvnodectl
LIBSO     := $(BUILD)/libkvnode.so.$(SOVERSION)
LIBA      := $(BUILD)/libkvnode.a
LIBPC     := $(BUILD)/kvnode.pc
UNIT_BIN  := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRC))
INTEG_BIN := $(patsubst tests/integration/%.c,$(BUILD)/tests/%,$(INTEG_SRC))
BENCH_BIN := $(BUILD)/kvnode-bench
BENCH_PERSIST_BIN := $(BUILD)/kvnode-bench-persist
BENCH_TENANTS_BIN := $(BUILD)/kvnode-bench-tenants
BENCH_PREFAULT_BIN := $(BUILD)/kvnode-bench-prefault
BENCH_STARTUP_BIN := $(BUILD)/kvnode-bench-startup
BENCH_KVS_BIN := $(BUILD)/kvnode-bench-kvs
BENCH_NODE_BIN := $(BUILD)/kvnode-bench-node
# KVS protocol simulator (tests/sim/kvs_sim.c) and its own tests (tests/sim/test_*.c).
SIM_BIN      := $(BUILD)/kvs-sim
# KVCM (Tair KVCache Manager) HTTP/JSON simulator (tests/sim/kvcm_sim.c).
KVCM_SIM_BIN := $(BUILD)/kvcm-sim
SIM_TEST_BIN := $(patsubst tests/sim/%.c,$(BUILD)/tests/%,$(wildcard tests/sim/test_*.c))
# Fuzz targets (tests/fuzz/fuzz_<t>.c): replayed over tests/fuzz/corpus/<t>/ by
# `make check`, fuzzed with libFuzzer by `make fuzz`.
FUZZ_TARGETS    := wire config kvs_file kvs_acquire $(if $(filter 1,$(V6D)),v6d_reply)
FUZZ_REPLAY_BIN := $(patsubst %,$(BUILD)/tests/fuzz_%_replay,$(FUZZ_TARGETS))
FUZZ_BIN        := $(patsubst %,$(BUILD)/fuzz/fuzz_%,$(FUZZ_TARGETS))

.PHONY: all deps run test check asan valgrind bench bench-persist bench-tenants bench-prefault bench-startup bench-kvs bench-node bench-adapters soak install uninstall clean help \
        fuzz fuzz-build fuzz-run
.DEFAULT_GOAL := all

all: $(KVNODED) $(LIBSO) $(LIBA) $(LIBPC) $(KVNODECTL)

help:
	@awk '!/^#/ { exit } { print }' Makefile

deps:
	@bash scripts/install-deps.sh

# --- generated protocol code (a build product, never committed) ---------------
$(PROTO_C) $(PROTO_H) &: proto/kvnode.proto
	@mkdir -p $(GEN)
	protoc-c --c_out=$(GEN) --proto_path=proto $<

$(PROTO_OBJ): $(PROTO_C) $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Wno-missing-prototypes -c $< -o $@

$(BUILD)/obj/%.o: %.c $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -MMD -MP -c $< -o $@

# --- products --------------------------------------------------------------
$(KVNODED): $(call obj,daemon/main.c) $(DAEMON_OBJ) $(COMMON_OBJ)
	$(CC) $(LDSAN) $(LDFLAGS) -o $@ $^ $(DAEMON_LIBS)

$(LIBA): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(LIBSO): $(LIB_OBJ) lib/libkvnode.map
	$(CC) $(LDSAN) $(LDFLAGS) -shared -Wl,-soname,libkvnode.so.$(SOVERSION) \
	    -Wl,--version-script=lib/libkvnode.map -o $@ $(LIB_OBJ) $(LIB_LIBS)
	ln -sf libkvnode.so.$(SOVERSION) $(BUILD)/libkvnode.so

$(LIBPC): lib/kvnode.pc.in Makefile
	@mkdir -p $(BUILD)
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@VERSION@|$(VERSION)|g' $< > $@

$(KVNODECTL): $(call obj,$(CTL_SRC)) $(LIBA)
	$(CC) $(LDSAN) $(LDFLAGS) -o $@ $^ $(LIB_LIBS) $(call pc_libs,jansson libcurl)

# --- tests -------------------------------------------------------------------
# Test programs compile in one step; they depend on every test helper header.
TEST_HDRS := $(wildcard tests/common/*.h tests/unit/*.h tests/sim/*.h tests/integration/*.h tests/fuzz/*.h tests/bench/*.h tests/fakecuda/*.h)

# The daemon's objects as one archive for the unit tests and fuzz targets: the
# linker takes only the members a program needs (a test of the arena does not
# carry the server, KVCM and store code).
DAEMON_LIBA := $(BUILD)/tests/libkvnoded-test.a
$(DAEMON_LIBA): $(DAEMON_OBJ) $(COMMON_OBJ)
	@mkdir -p $(dir $@)
	@rm -f $@
	ar rcs $@ $^

# Tests that watch the devmem calls of the daemon's code (tests/unit/devmem_spy.h).
DEVMEM_SPY_WRAP := -Wl,--wrap=devmem_host_register,--wrap=devmem_host_unregister,--wrap=devmem_copy_async
$(BUILD)/tests/test_cache_hbm $(BUILD)/tests/test_copier: TEST_LDEXTRA = $(DEVMEM_SPY_WRAP)
# The cuda-backend suites find the fake through their RPATH (fakecuda_reexec
# then has nothing to do, so valgrind sees the tests themselves).
FAKECUDA_RPATH = -Wl,--disable-new-dtags -Wl,-rpath,$(abspath $(BUILD))/tests/fakecuda
$(BUILD)/tests/test_cache_hbm_cuda: TEST_LDEXTRA = $(DEVMEM_SPY_WRAP) $(FAKECUDA_RPATH)
$(BUILD)/tests/test_devmem_cuda: TEST_LDEXTRA = $(FAKECUDA_RPATH)

$(BUILD)/tests/%: tests/unit/%.c $(DAEMON_LIBA) $(TEST_PROC_OBJ) $(PROTO_H) $(TEST_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDSAN) $(LDFLAGS) $(TEST_LDEXTRA) -o $@ $< $(DAEMON_LIBA) $(TEST_PROC_OBJ) $(DAEMON_LIBS) $(CHECK_LIBS)

# Client-library tests (fake server in-process) link libkvnode, not the daemon.
$(BUILD)/tests/test_client_%: tests/unit/test_client_%.c $(LIBA) $(PROTO_H) $(TEST_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDSAN) $(LDFLAGS) -o $@ $< $(LIBA) $(LIB_LIBS) $(CHECK_LIBS) -lpthread

# libkvnode through the strict fake CUDA: it runs a fake daemon as a child (proc.c)
# and makes its own CUDA calls through the fake (dlopen: no toolkit needed). Its RPATH
# (DT_RPATH, searched by dlopen before LD_LIBRARY_PATH and the system) is the fake's
# folder, so libkvnode's dlopen of libcudart/libcuda finds the fake, never a real CUDA.
$(BUILD)/tests/test_client_cuda: tests/unit/test_client_cuda.c $(LIBA) $(TEST_PROC_OBJ) $(PROTO_H) $(TEST_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDSAN) $(LDFLAGS) -o $@ $< $(TEST_PROC_OBJ) $(LIBA) $(LIB_LIBS) $(CHECK_LIBS) \
	    -ldl -lpthread -Wl,--disable-new-dtags -Wl,-rpath,$(abspath $(BUILD))/tests/fakecuda

$(BUILD)/tests/%: tests/integration/%.c $(INTEG_HELPER) $(TEST_PROC_OBJ) $(LIBA) $(PROTO_H) $(TEST_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/integration $(LDSAN) $(LDFLAGS) -o $@ $< $(INTEG_HELPER) $(TEST_PROC_OBJ) $(LIBA) $(LIB_LIBS) $(CHECK_LIBS) $(call pc_libs,jansson libcurl) -lpthread

# The KVS front end's suite drives it with the daemon's own v6d backend too.
$(BUILD)/tests/test_kvs_server: tests/integration/test_kvs_server.c $(INTEG_HELPER) $(TEST_PROC_OBJ) $(LIBA) \
                                $(DAEMON_LIBA) $(PROTO_H) $(TEST_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/integration $(LDSAN) $(LDFLAGS) -o $@ $< $(INTEG_HELPER) $(TEST_PROC_OBJ) \
	    $(DAEMON_LIBA) $(LIBA) $(DAEMON_LIBS) $(LIB_LIBS) $(CHECK_LIBS) -lpthread

# The KVS simulator: a standalone process the tests start (libevent + jansson only).
$(SIM_BIN): $(call obj,tests/sim/kvs_sim.c)
	$(CC) $(LDSAN) $(LDFLAGS) -o $@ $^ $(call pc_libs,libevent jansson)

# Integration suites that start the simulator ($KVS_SIM) need it built.
$(BUILD)/tests/test_daemon_persist_v6d: $(SIM_BIN)

# The KVCM simulator: likewise standalone (libevent + jansson only).
$(KVCM_SIM_BIN): $(call obj,tests/sim/kvcm_sim.c)
	$(CC) $(LDSAN) $(LDFLAGS) -o $@ $^ $(call pc_libs,libevent jansson)

# Unit suites that start the KVCM simulator (kvcm-sim next to $KVS_SIM) need it built.
$(BUILD)/tests/test_kvcm_client: $(KVCM_SIM_BIN)
$(BUILD)/tests/test_daemon_kvcm: $(KVCM_SIM_BIN)
$(BUILD)/tests/test_daemon_kvcm_query: $(KVCM_SIM_BIN)
$(BUILD)/tests/test_daemon_purge: $(KVCM_SIM_BIN)
$(BUILD)/tests/test_kvs_ranks: $(KVCM_SIM_BIN)
$(BUILD)/tests/test_daemon_tenants_reload: $(KVCM_SIM_BIN)

$(BUILD)/tests/%: tests/sim/%.c $(SIM_BIN) $(KVCM_SIM_BIN) $(TEST_PROC_OBJ) $(TEST_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDSAN) $(LDFLAGS) -o $@ $< $(TEST_PROC_OBJ) $(CHECK_LIBS) $(call pc_libs,jansson libcurl) -lpthread

# A fuzz target with the replay driver: the normal toolchain, no libFuzzer.
$(BUILD)/tests/fuzz_%_replay: tests/fuzz/fuzz_%.c tests/fuzz/replay.c tests/fuzz/fuzz.h \
                              $(DAEMON_LIBA) $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/fuzz -DFUZZ_NAME='"fuzz_$*"' -DFUZZ_CORPUS='"tests/fuzz/corpus/$*"' \
	    $(LDSAN) $(LDFLAGS) -o $@ $< tests/fuzz/replay.c $(DAEMON_LIBA) $(DAEMON_LIBS)

# --- the strict fake CUDA (tests/fakecuda/, issue 28 part A) -------------------
# One library under the driver's and the runtime's sonames (glibc loads one
# object for all of them, so both halves share state). A process started with
# LD_LIBRARY_PATH=$(FAKECUDA_OUT) runs against it; test_fakecuda links it.
# (FAKECUDA_OUT and FAKECUDA_SO are defined with the sources above, so any
# rule may name them as prerequisites.)
$(FAKECUDA_SO): $(FAKECUDA_SRC) $(FAKECUDA_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -shared -Wl,-soname,libfakecuda.so $(LDSAN) $(LDFLAGS) -o $@ $(FAKECUDA_SRC) -lpthread
	@for n in $(FAKECUDA_NAMES); do ln -sf libfakecuda.so $(FAKECUDA_OUT)/$$n; done
all: $(FAKECUDA_SO)
# Suites that run the cuda backend against the fake, in their own process
# (LD_LIBRARY_PATH at re-exec) or in the kvnoded they start.
$(BUILD)/tests/test_devmem_cuda $(BUILD)/tests/test_daemon_cuda $(BUILD)/tests/test_cache_hbm_cuda: | $(FAKECUDA_SO)

# test_client_cuda (above) loads the fake at run time through its RPATH.
$(BUILD)/tests/test_client_cuda: $(FAKECUDA_SO)

# libkvnode against kvnoded (hbm.backend = cuda), both on the fake: the test process is
# the engine and finds the fake through its RPATH (dlopen searches DT_RPATH first).
$(BUILD)/tests/test_client_daemon_cuda $(BUILD)/tests/test_gather_cuda: $(BUILD)/tests/%: tests/integration/%.c $(INTEG_HELPER) \
                                        $(TEST_PROC_OBJ) $(LIBA) $(PROTO_H) $(TEST_HDRS) $(FAKECUDA_SO)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/integration $(LDSAN) $(LDFLAGS) -o $@ $< $(INTEG_HELPER) $(TEST_PROC_OBJ) \
	    $(LIBA) $(LIB_LIBS) $(CHECK_LIBS) $(call pc_libs,jansson libcurl) -ldl -lpthread \
	    -Wl,--disable-new-dtags -Wl,-rpath,$(abspath $(FAKECUDA_OUT))

$(BUILD)/tests/test_fakecuda: tests/unit/test_fakecuda.c $(FAKECUDA_SO) $(FAKECUDA_HDRS) $(TEST_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/fakecuda $(LDSAN) $(LDFLAGS) -o $@ $< -L$(FAKECUDA_OUT) \
	    -Wl,-rpath,$(abspath $(FAKECUDA_OUT)) -lcudart $(CHECK_LIBS) -lpthread

# examples/five_lines.c (the README's "libkvnode in five lines" is cut from it), built
# with the README's in-tree link line (-ldl -lpthread: glibc before 2.34 needs them).
EXAMPLE_BIN := $(BUILD)/examples/five_lines
$(EXAMPLE_BIN): examples/five_lines.c lib/kvnode.h $(LIBA)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 $(WARN) $(CFLAGS) $(LDSAN) -Ilib -o $@ $< $(LIBA) -lprotobuf-c -ldl -lpthread

SCRIPT_TESTS := tests/install/test_install.sh tests/python/run.sh tests/layout/run.sh tests/systemd/run.sh \
                tests/systemd/security.sh tests/contrib/run.sh tests/warm/run.sh

check: all $(EXAMPLE_BIN) $(UNIT_BIN) $(INTEG_BIN) $(SIM_BIN) $(KVCM_SIM_BIN) $(SIM_TEST_BIN) $(FUZZ_REPLAY_BIN)
	@BUILD=$(BUILD) bash tests/run-tests.sh $(UNIT_BIN) $(INTEG_BIN) $(SIM_TEST_BIN) $(FUZZ_REPLAY_BIN) $(SCRIPT_TESTS)

test: deps
	@$(MAKE) --no-print-directory -j$(BUILD_JOBS) check

asan: deps
	@$(MAKE) --no-print-directory -j$(BUILD_JOBS) BUILD=build-asan SAN=1 OPT=-O1 check

# The test suite with every test binary and every daemon under valgrind.
valgrind: all $(UNIT_BIN) $(INTEG_BIN) $(SIM_BIN) $(KVCM_SIM_BIN) $(SIM_TEST_BIN)
	@VALGRIND=1 BUILD=$(BUILD) bash tests/run-tests.sh $(UNIT_BIN) $(INTEG_BIN) $(SIM_TEST_BIN)

# --- fuzzing -------------------------------------------------------------------
# `make fuzz`: every target under libFuzzer for FUZZ_SECONDS each, with clang,
# ASan+UBSan and coverage on the daemon code too (its own build dir). Seeds
# come from tests/fuzz/corpus/<t>/ (read only); what libFuzzer finds goes to
# $(FUZZ_BUILD)/fuzz/corpus/<t>/, crashes to $(FUZZ_BUILD)/fuzz/crash-<t>-*.
# Full output: $(FUZZ_BUILD)/fuzz/fuzz_<t>.log. Fails when any target found something.
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_FLAGS   ?= -timeout=10 -rss_limit_mb=4096 -max_len=8192 -print_final_stats=1

fuzz:
	@$(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD) CC=clang SAN=1 FUZZ=1 OPT=-O1 fuzz-run

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz.h $(DAEMON_OBJ) $(COMMON_OBJ) $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/fuzz -fsanitize=fuzzer,address,undefined $(LDFLAGS) -o $@ $< \
	    $(DAEMON_OBJ) $(COMMON_OBJ) $(DAEMON_LIBS)

fuzz-build: $(FUZZ_BIN)

fuzz-run: $(FUZZ_BIN)
	@failed=""; for t in $(FUZZ_TARGETS); do \
	    mkdir -p $(BUILD)/fuzz/corpus/$$t; \
	    echo "=== fuzz_$$t ($(FUZZ_SECONDS)s)"; \
	    if $(BUILD)/fuzz/fuzz_$$t $(FUZZ_FLAGS) -max_total_time=$(FUZZ_SECONDS) \
	        -artifact_prefix=$(BUILD)/fuzz/crash-$$t- \
	        $(BUILD)/fuzz/corpus/$$t tests/fuzz/corpus/$$t > $(BUILD)/fuzz/fuzz_$$t.log 2>&1; then \
	        grep -E '^(#[0-9]+ *DONE|stat::number_of_executed_units|stat::new_units_added)' \
	            $(BUILD)/fuzz/fuzz_$$t.log; \
	    else \
	        failed="$$failed fuzz_$$t"; tail -n 40 $(BUILD)/fuzz/fuzz_$$t.log; \
	    fi; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz: found problems in:$$failed (see $(BUILD)/fuzz/crash-*)"; exit 1; fi; \
	echo "fuzz: $(words $(FUZZ_TARGETS)) targets, $(FUZZ_SECONDS)s each, nothing found"

# --- run / bench ---------------------------------------------------------------
# ARGS: kvnoded's options after the config, e.g. ARGS='--set admin.listen=127.0.0.1:9181'.
ARGS ?=
run: deps
	@$(MAKE) --no-print-directory -j$(BUILD_JOBS) all
	@mkdir -p run
	$(KVNODED) --config conf/kvnode.conf $(ARGS)

$(BENCH_BIN): tests/bench/bench.c $(INTEG_HELPER) $(TEST_PROC_OBJ) $(LIBA) $(TEST_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/integration $(LDFLAGS) -o $@ $(filter-out %.h,$^) $(LIB_LIBS) $(CHECK_LIBS) $(call pc_libs,jansson) -lpthread

$(BENCH_PREFAULT_BIN): tests/bench/bench_prefault.c $(INTEG_HELPER) $(TEST_PROC_OBJ) $(LIBA) $(TEST_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/integration $(LDFLAGS) -o $@ $(filter-out %.h,$^) $(LIB_LIBS) $(CHECK_LIBS) $(call pc_libs,jansson) -lpthread

$(BENCH_TENANTS_BIN): tests/bench/bench_tenants.c $(INTEG_HELPER) $(TEST_PROC_OBJ) $(LIBA) $(TEST_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/integration $(LDFLAGS) -o $@ $(filter-out %.h,$^) $(LIB_LIBS) $(CHECK_LIBS) $(call pc_libs,jansson) -lpthread

$(BENCH_STARTUP_BIN): tests/bench/bench_startup.c $(INTEG_HELPER) $(TEST_PROC_OBJ) $(LIBA) $(TEST_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/integration $(LDFLAGS) -o $@ $(filter-out %.h,$^) $(LIB_LIBS) $(CHECK_LIBS) $(call pc_libs,jansson) -lpthread

# The KVS front end against libkvnode (libcurl for the HTTP calls).
$(BENCH_KVS_BIN): tests/bench/bench_kvs.c $(INTEG_HELPER) $(TEST_PROC_OBJ) $(LIBA) $(TEST_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/integration $(LDFLAGS) -o $@ $(filter-out %.h,$^) $(LIB_LIBS) $(CHECK_LIBS) $(call pc_libs,jansson libcurl) -lpthread

# Issue 32's table next to redis-server + hiredis, a raw unix-socket ping-pong
# and memcpy (hiredis: the daemon links it too).
$(BENCH_NODE_BIN): tests/bench/bench_node.c $(INTEG_HELPER) $(TEST_PROC_OBJ) $(LIBA) $(TEST_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/integration $(LDFLAGS) -o $@ $(filter-out %.h,$^) $(LIB_LIBS) $(CHECK_LIBS) $(call pc_libs,jansson hiredis) -lpthread

# Part 3 (v6d) starts the KVS simulator and reads its counters over HTTP (libcurl).
$(BENCH_PERSIST_BIN): tests/bench/bench_persist.c $(INTEG_HELPER) $(TEST_PROC_OBJ) $(LIBA) $(TEST_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/integration $(LDFLAGS) -o $@ $(filter-out %.h,$^) $(LIB_LIBS) $(CHECK_LIBS) $(call pc_libs,jansson libcurl) -lpthread

# The GPU check's engine process (scripts/gpu-check.sh runs it, one behaviour
# per run): it links libkvnode.so as an engine does and dlopens the CUDA
# runtime (no toolkit needed to build it). `make check` runs the script's
# --sim run against the strict fake CUDA (tests/gpu/run-sim.sh).
GPU_CHECK_BIN := $(BUILD)/kvnode-gpu-check
$(GPU_CHECK_BIN): tests/bench/gpu_check.c tests/bench/gpu_check_cuda.c tests/bench/gpu_check_cuda.h $(LIBSO)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDSAN) $(LDFLAGS) -o $@ tests/bench/gpu_check.c tests/bench/gpu_check_cuda.c \
	    $(LIBSO) -Wl,-rpath,'$$ORIGIN' $(call pc_libs,jansson) -ldl -lpthread
# gpu-check --sim's demotion behaviour gives kvnoded this libcuda.so.1: the
# strict fake with each host registration delayed (tests/gpu/slowpin.c).
GPU_SLOWPIN := $(BUILD)/tests/gpu/slowpin/libcuda.so.1
$(GPU_SLOWPIN): tests/gpu/slowpin.c $(FAKECUDA_SO)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -shared $(LDSAN) $(LDFLAGS) -o $@ $< -L$(FAKECUDA_OUT) \
	    -Wl,--no-as-needed -lfakecuda -Wl,--as-needed -Wl,-rpath,'$$ORIGIN/../../fakecuda' -ldl
SCRIPT_TESTS += tests/gpu/run-sim.sh
check: $(GPU_CHECK_BIN) $(GPU_SLOWPIN)

# `make bench` runs the five programs (kvnode-bench-node only where
# redis-server is installed); `make bench-persist`, `make bench-tenants`,
# `make bench-prefault` and `make bench-node` one each. BENCH_ARGS /
# BENCH_PERSIST_ARGS / BENCH_PREFAULT_ARGS / BENCH_TENANTS_ARGS /
# BENCH_NODE_ARGS pass options (e.g. --quick).
bench: all $(BENCH_BIN) $(BENCH_PERSIST_BIN) $(BENCH_TENANTS_BIN) $(BENCH_PREFAULT_BIN) $(BENCH_NODE_BIN) $(if $(filter 1,$(V6D)),$(SIM_BIN))
	KVNODED=$(KVNODED) $(BENCH_BIN) $(BENCH_ARGS)
	KVNODED=$(KVNODED) KVS_SIM=$(SIM_BIN) $(BENCH_PERSIST_BIN) $(BENCH_PERSIST_ARGS)
	KVNODED=$(KVNODED) $(BENCH_TENANTS_BIN) $(BENCH_TENANTS_ARGS)
	KVNODED=$(KVNODED) $(BENCH_PREFAULT_BIN) $(BENCH_PREFAULT_ARGS)
	@if command -v redis-server >/dev/null 2>&1; then \
	    echo "KVNODED=$(KVNODED) $(BENCH_NODE_BIN) $(BENCH_NODE_ARGS)"; \
	    KVNODED=$(KVNODED) $(BENCH_NODE_BIN) $(BENCH_NODE_ARGS); \
	else echo "bench-node skipped: no redis-server on PATH (its peer)"; fi

bench-prefault: all $(BENCH_PREFAULT_BIN)
	KVNODED=$(KVNODED) $(BENCH_PREFAULT_BIN) $(BENCH_PREFAULT_ARGS)

bench-tenants: all $(BENCH_TENANTS_BIN)
	KVNODED=$(KVNODED) $(BENCH_TENANTS_BIN) $(BENCH_TENANTS_ARGS)

# Start-up of 1, 4 and 8 GiB host tiers (reserves up to 8 GiB twice in a
# row, one at a time); BENCH_STARTUP_ARGS="--sizes 1,4" for smaller machines.
bench-startup: all $(BENCH_STARTUP_BIN)
	KVNODED=$(KVNODED) $(BENCH_STARTUP_BIN) $(BENCH_STARTUP_ARGS)

# BENCH_KVS_ARGS: --rounds N (default 20) or --quick.
bench-kvs: all $(BENCH_KVS_BIN)
	KVNODED=$(KVNODED) $(BENCH_KVS_BIN) $(BENCH_KVS_ARGS)

# Issue 32's figures, each a ratio to a peer in the same run (redis-server on a
# unix socket, raw socket ping-pong, memcpy), client and daemon pinned to the
# same CPU and to different CPUs; needs redis-server, and perf for the syscall
# counts (skipped with the reason otherwise). BENCH_NODE_ARGS: --quick.
bench-node: all $(BENCH_NODE_BIN)
	KVNODED=$(KVNODED) $(BENCH_NODE_BIN) $(BENCH_NODE_ARGS)

# kvnode.sglang / kvnode.lmcache / kvnode.vllm against libkvnode's batched calls in one run (Python 3,
# numpy); BENCH_ADAPTERS_ARGS: --rounds N (default 30).
bench-adapters: all
	KVNODED=$(abspath $(KVNODED)) KVNODE_LIBRARY=$(abspath $(LIBSO)) /usr/bin/python3 tests/bench/bench_adapters.py $(BENCH_ADAPTERS_ARGS)

bench-persist: all $(BENCH_PERSIST_BIN) $(if $(filter 1,$(V6D)),$(SIM_BIN))
	KVNODED=$(KVNODED) KVS_SIM=$(SIM_BIN) $(BENCH_PERSIST_BIN) $(BENCH_PERSIST_ARGS)

# --- soak ------------------------------------------------------------------------
# kvnode-soak (tests/soak/soak.c): 8 worker processes of put/get/delete/re-put
# traffic against a kvnoded on the file store, random SIGKILLs of workers and
# kill -9 of the daemon, then every acknowledged block read back byte-exact.
# Not part of `make test`; SOAK_ARGS passes options (kvnode-soak --help).
SOAK_BIN     := $(BUILD)/kvnode-soak
SOAK_SECONDS ?= 300
SOAK_ARGS    ?=
$(SOAK_BIN): tests/soak/soak.c $(INTEG_HELPER) $(TEST_PROC_OBJ) $(LIBA) $(TEST_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/integration $(LDSAN) $(LDFLAGS) -o $@ tests/soak/soak.c $(INTEG_HELPER) $(TEST_PROC_OBJ) \
	    $(LIBA) $(LIB_LIBS) $(call pc_libs,jansson) -lpthread

soak: all $(SOAK_BIN)
	KVNODED=$(KVNODED) $(SOAK_BIN) --seconds $(SOAK_SECONDS) $(SOAK_ARGS)

# --- install -------------------------------------------------------------------
SYSCONFDIR  ?= /etc
UNITDIR     ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
TMPFILESDIR ?= $(PREFIX)/lib/tmpfiles.d
# The Python package goes where Debian's python3 finds it: /usr/lib/python3/dist-packages
# for PREFIX=/usr, <prefix>/lib/python3.X/dist-packages otherwise.
PYTHON_VERSION := $(shell python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
PYTHONDIR   ?= $(if $(filter /usr,$(PREFIX)),$(PREFIX)/lib/python3/dist-packages,$(PREFIX)/lib/python$(or $(PYTHON_VERSION),3)/dist-packages)
PYTHON_FILES := $(notdir $(wildcard python/kvnode/*.py))
INSTALLED_FILES = $(PREFIX)/sbin/kvnoded $(PREFIX)/bin/kvnodectl \
    $(addprefix $(PYTHONDIR)/kvnode/,$(PYTHON_FILES) _installed.py) \
    $(LIBDIR)/libkvnode.so.$(SOVERSION) $(LIBDIR)/libkvnode.so $(LIBDIR)/libkvnode.a \
    $(LIBDIR)/pkgconfig/kvnode.pc $(PREFIX)/include/kvnode.h \
    $(PREFIX)/share/man/man1/kvnodectl.1 $(PREFIX)/share/man/man3/libkvnode.3 \
    $(PREFIX)/share/man/man5/kvnode.conf.5 $(PREFIX)/share/man/man8/kvnoded.8 \
    $(UNITDIR)/kvnoded.service $(UNITDIR)/kvnoded.socket \
    $(SYSUSERSDIR)/kvnode.conf $(TMPFILESDIR)/kvnode.conf

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/sbin $(DESTDIR)$(LIBDIR) \
	    $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(PREFIX)/include \
	    $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man3 \
	    $(DESTDIR)$(PREFIX)/share/man/man5 $(DESTDIR)$(PREFIX)/share/man/man8 \
	    $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(TMPFILESDIR) \
	    $(DESTDIR)$(SYSCONFDIR)/kvnode $(DESTDIR)$(PYTHONDIR)/kvnode
	install -m 0755 $(KVNODED) $(DESTDIR)$(PREFIX)/sbin/kvnoded
	install -m 0644 $(addprefix python/kvnode/,$(PYTHON_FILES)) $(DESTDIR)$(PYTHONDIR)/kvnode/
	@# The package finds the libkvnode installed with it, wherever LIBDIR is (relative, so a
	@# DESTDIR-staged tree works as installed).
	printf '# Written by make install: LIBDIR relative to this package.\nLIBDIR = "%s"\n' \
	    "$$(realpath -m --relative-to=$(PYTHONDIR)/kvnode $(LIBDIR))" > $(DESTDIR)$(PYTHONDIR)/kvnode/_installed.py
	install -m 0755 $(KVNODECTL) $(DESTDIR)$(PREFIX)/bin/kvnodectl
	install -m 0755 $(LIBSO) $(DESTDIR)$(LIBDIR)/
	ln -sf libkvnode.so.$(SOVERSION) $(DESTDIR)$(LIBDIR)/libkvnode.so
	install -m 0644 $(LIBA) $(DESTDIR)$(LIBDIR)/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@VERSION@|$(VERSION)|g' lib/kvnode.pc.in \
	    > $(DESTDIR)$(LIBDIR)/pkgconfig/kvnode.pc
	install -m 0644 lib/kvnode.h $(DESTDIR)$(PREFIX)/include/kvnode.h
	install -m 0644 man/kvnodectl.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 0644 man/libkvnode.3 $(DESTDIR)$(PREFIX)/share/man/man3/
	install -m 0644 man/kvnode.conf.5 $(DESTDIR)$(PREFIX)/share/man/man5/
	install -m 0644 man/kvnoded.8 $(DESTDIR)$(PREFIX)/share/man/man8/
	sed -e 's|/usr/sbin/kvnoded|$(PREFIX)/sbin/kvnoded|g' -e 's|/etc/kvnode/|$(SYSCONFDIR)/kvnode/|g' \
	    systemd/kvnoded.service > $(DESTDIR)$(UNITDIR)/kvnoded.service
	install -m 0644 systemd/kvnoded.socket $(DESTDIR)$(UNITDIR)/kvnoded.socket
	install -m 0644 systemd/kvnode.sysusers $(DESTDIR)$(SYSUSERSDIR)/kvnode.conf
	install -m 0644 systemd/kvnode.tmpfiles $(DESTDIR)$(TMPFILESDIR)/kvnode.conf
	@# The operator's config is never overwritten; the shipped one serves the
	@# service's socket and store (conf/kvnode.conf points make run at ./run
	@# and ./var).
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/kvnode/kvnode.conf ]; then \
	    echo "keeping existing $(DESTDIR)$(SYSCONFDIR)/kvnode/kvnode.conf"; \
	else \
	    sed -e 's|^socket_path = run/kvnode.sock|#socket_path = /run/kvnode/kvnode.sock|' \
	        -e 's|^path = var$$|#path = /var/lib/kvnode|' \
	        conf/kvnode.conf > $(DESTDIR)$(SYSCONFDIR)/kvnode/kvnode.conf && \
	    chmod 0644 $(DESTDIR)$(SYSCONFDIR)/kvnode/kvnode.conf && \
	    echo "installed $(DESTDIR)$(SYSCONFDIR)/kvnode/kvnode.conf"; \
	fi
	@$(if $(DESTDIR),,echo "libkvnode is in $(LIBDIR): run ldconfig (as root) so that programs find it")

# Removes what install put there, except the operator's configuration.
uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED_FILES))
	rm -rf $(DESTDIR)$(PYTHONDIR)/kvnode/__pycache__
	-rmdir $(DESTDIR)$(PYTHONDIR)/kvnode 2>/dev/null
	@echo "kept $(DESTDIR)$(SYSCONFDIR)/kvnode/kvnode.conf (remove it by hand if unwanted)"

clean:
	rm -rf build build-asan build-* run

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
