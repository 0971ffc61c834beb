# What the standalone CUDA programs build from: the kernels of each op (no XLA,
# no Python) and the headers they depend on. Included by the checkers
# (ffi/tests/Makefile) and the kernel benchmarks (ffi/bench/Makefile), which
# set FFI to the ffi/ directory first. A kernel file added to an op goes here.
NVCC ?= nvcc
ARCH ?= sm_90
# An sm_90a build (ARCH=sm_90a) adds the indexer's wgmma kernel (ffi/indexer_wgmma.cuh).
ARCH_FLAGS = $(if $(filter sm_90a,$(ARCH)),-DHISPARSE_SM90A)
# Repository root, where build/ lives (git-ignored).
ROOT := $(FFI)/..

FFI_HEADERS := $(wildcard $(FFI)/*.h $(FFI)/*.cuh)
HARNESS := $(FFI)/tests/harness.h $(FFI)/tests/number_formats.h

# RESOLVE's kernels hold the pool write's too (it shares their record copy).
RESOLVE_SRCS := $(FFI)/resolve_kernels.cu
RESOLVE_CPU_SRCS := $(FFI)/resolve_cpu.cc $(FFI)/pool_write_cpu.cc
TOPK_SRCS := $(FFI)/topk_kernels.cu
TOPK_CPU_SRCS := $(FFI)/topk_cpu.cc
INDEXER_SRCS := $(FFI)/indexer_kernels.cu
GROUPED_MATMUL_SRCS := $(FFI)/grouped_matmul_kernels.cu
SPARSE_ATTENTION_SRCS := $(FFI)/sparse_attention_kernels.cu
SPARSE_ATTENTION_CPU_SRCS := $(FFI)/sparse_attention_cpu.cc
MOE_ROUTE_SRCS := $(FFI)/moe_route_kernels.cu
MOE_ROUTE_CPU_SRCS := $(FFI)/moe_route_cpu.cc
