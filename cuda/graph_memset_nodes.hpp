#pragma once
// For .cu files only: the memset nodes of a captured graph as kernel nodes.
#include <cuda_runtime.h>

namespace hg::gpu {

// Replaces each small one-dimensional zero memset node of `graph` (cuBLASLt
// clears a few bytes of its workspace before many of its kernels) by a
// kernel node that writes the same zeros, with the same edges: between two
// kernels a memset node leaves the GPU idle longer than a kernel node does
// (docs/mixed_precision.md, "CUDA graphs"). Other memset nodes are kept as
// they are. Returns the number of nodes replaced.
int memset_nodes_to_kernels(cudaGraph_t graph);

}  // namespace hg::gpu
