// Memset nodes of a captured graph as kernel nodes (cuda/graph_memset_nodes.hpp).
#include <cstdint>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "cuda/graph_memset_nodes.hpp"

namespace hg::gpu {
namespace {

// Larger memsets keep their node: there the fill's own time, not the gaps
// around it, is what counts, and the copy engine's memset is as fast.
constexpr size_t kMaxReplacedBytes = 64 * 1024;
constexpr int kFillThreads = 256;

__global__ void zero_bytes(unsigned char* dst, size_t bytes) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < bytes; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = 0;
}

// The bytes a memset node clears, or 0 where it is not a one-dimensional zero fill.
size_t zeroed_bytes(const cudaMemsetParams& p) {
  if (p.value != 0 || p.height != 1) return 0;
  return p.width * p.elementSize;
}

std::vector<cudaGraphNode_t> nodes_of(cudaGraph_t graph) {
  size_t n = 0;
  HG_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  HG_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  nodes.resize(n);
  return nodes;
}

// The node's incoming (`dependencies`) or outgoing edges; false if any edge
// carries data (a programmatic or port edge), which a plain edge would not keep.
bool plain_edges(cudaGraphNode_t node, bool dependencies, std::vector<cudaGraphNode_t>& out) {
  size_t n = 0;
  const auto get = [&](cudaGraphNode_t* nodes, cudaGraphEdgeData* edges) {
    return dependencies ? cudaGraphNodeGetDependencies(node, nodes, edges, &n)
                        : cudaGraphNodeGetDependentNodes(node, nodes, edges, &n);
  };
  HG_CUDA_CHECK(get(nullptr, nullptr));
  out.resize(n);
  std::vector<cudaGraphEdgeData> edges(n);
  HG_CUDA_CHECK(get(out.data(), edges.data()));
  for (const cudaGraphEdgeData& e : edges)
    if (e.type != cudaGraphDependencyTypeDefault || e.from_port != 0 || e.to_port != 0) return false;
  return true;
}

}  // namespace

int memset_nodes_to_kernels(cudaGraph_t graph) {
  int replaced = 0;
  for (cudaGraphNode_t node : nodes_of(graph)) {
    cudaGraphNodeType type{};
    HG_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeMemset) continue;
    cudaMemsetParams p{};
    HG_CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &p));
    size_t bytes = zeroed_bytes(p);
    if (bytes == 0 || bytes > kMaxReplacedBytes) continue;
    std::vector<cudaGraphNode_t> before, after;
    if (!plain_edges(node, true, before) || !plain_edges(node, false, after)) continue;

    void* dst = p.dst;
    void* args[] = {&dst, &bytes};
    cudaKernelNodeParams k{};
    k.func = reinterpret_cast<void*>(zero_bytes);
    k.blockDim = dim3(kFillThreads);
    k.gridDim = dim3(static_cast<unsigned>((bytes + kFillThreads - 1) / kFillThreads));
    k.kernelParams = args;
    cudaGraphNode_t fill = nullptr;
    HG_CUDA_CHECK(cudaGraphAddKernelNode(&fill, graph, before.data(), before.size(), &k));
    for (cudaGraphNode_t next : after) HG_CUDA_CHECK(cudaGraphAddDependencies(graph, &fill, &next, nullptr, 1));
    HG_CUDA_CHECK(cudaGraphDestroyNode(node));  // and its edges
    ++replaced;
  }
  return replaced;
}

}  // namespace hg::gpu
