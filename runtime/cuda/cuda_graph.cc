#include "runtime/cuda/cuda_graph.h"

#include <optional>
#include <string>
#include <utility>

#include "runtime/core/check.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/cuda_check.h"

namespace mix::cuda {

namespace {

// Stream capture in relaxed mode: the caching allocator may cudaMalloc while
// recording (a new block of the graph's pool; cudaMalloc is not a stream
// operation, so the recorded work simply keeps using the address), and the
// batch prefetcher's thread may go on allocating page-locked memory. Calls
// that conflict with capture itself (a host wait for the compute stream, or
// a query of an event recorded while capturing) still fail, and so fail the
// recording.
class CudaGraph final : public DeviceGraph {
 public:
  CudaGraph(int device, CudaCachingAllocator& allocator)
      : device_(device), allocator_(allocator), pool_(allocator.new_pool()) {}

  ~CudaGraph() override {
    // Replays may still be queued: their memory goes back to the shared cache
    // only once they have run. Bounded like every host wait (a replay's
    // collective may wait for a dead peer); past it, the pool is leaked.
    bool idle = false;
    try {
      use_device(device_);
      idle = wait_for_streams(device_);
    } catch (const std::exception& e) {
      log_warning(std::string("CUDA graph of GPU ") + std::to_string(device_) + ": " + e.what());
    }
    drop();
    if (idle) {
      allocator_.release_pool(pool_);
    } else {
      log_warning("CUDA graph of GPU " + std::to_string(device_) + ": its replays were still queued after " +
                  std::to_string(hang_timeout()) + " s (MIX_NCCL_TIMEOUT_S); its memory is not returned");
    }
  }

  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  void record(const std::function<void()>& queue_work) override {
    DeviceContext& c = use_device(device_);
    // The pool's blocks are reused by the new recording: earlier replays must
    // have run first (recording is rare; this wait costs nothing that matters).
    MIX_CHECK(wait_for_streams(device_), "recording a CUDA graph: GPU "
                                             << device_ << "'s queued work did not finish within " << hang_timeout()
                                             << " s (MIX_NCCL_TIMEOUT_S); a peer may have died");
    drop();
    // The step's temporaries are about to be allocated again, from the pool:
    // the copies cached by the op-by-op steps before would only double the
    // memory held. Returned once, before recording (it waits for the device).
    allocator_.empty_cache();
    const cudaStream_t stream = c.compute.get();
    std::optional<CaptureInProgress> capturing(std::in_place);  // holds pinned frees back until the end
    MIX_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    allocator_.use_pool(pool_);
    std::string failure;
    try {
      queue_work();
    } catch (const std::exception& e) {
      failure = e.what();
    }
    allocator_.use_pool(0);
    // A step stopped part-way by an error (not by CUDA) may have forked the
    // communication stream into the capture, an all-reduce started and its
    // wait never queued. Joined back here, the capture ends whole, with both
    // streams out of it, for the op-by-op steps that follow.
    if (!failure.empty()) join_if_capturing(c.comm.get(), stream);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    capturing.reset();
    if (failure.empty() && ended != cudaSuccess)
      failure = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(ended) +
                (ended == cudaErrorStreamCaptureUnjoined
                     ? " (work queued on another stream was not ordered back onto the compute stream)"
                     : "");
    if (!failure.empty()) {
      if (graph) MIX_CUDA_CHECK_NOTHROW(cudaGraphDestroy(graph));
      // Capture errors are not sticky: a later launch check must not report them.
      (void)cudaGetLastError();
      throw RecordingError(MIX_STR_CAT("could not record the step as a CUDA graph on GPU "
                                       << device_ << ": " << failure << "; none of its work ran [" << process_identity()
                                       << "]"));
    }
    graph_ = graph;
    const cudaError_t made = cudaGraphInstantiate(&exec_, graph_, 0);
    if (made != cudaSuccess) {
      exec_ = nullptr;
      drop();
      (void)cudaGetLastError();
      throw RecordingError(MIX_STR_CAT("could not instantiate the recorded CUDA graph on GPU "
                                       << device_ << ": " << cudaGetErrorString(made) << "; none of its work ran ["
                                       << process_identity() << "]"));
    }
    // Uploads the graph's launch data now rather than in the first replay.
    MIX_CUDA_CHECK(cudaGraphUpload(exec_, stream));
  }

  void copy_in(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    DeviceContext& c = use_device(device_);
    MIX_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c.compute.get()));
  }

  void replay() override {
    MIX_CHECK(exec_, "CUDA graph of GPU " << device_ << ": replay before anything was recorded");
    DeviceContext& c = use_device(device_);
    MIX_CUDA_CHECK(cudaGraphLaunch(exec_, c.compute.get()));
  }

 private:
  // Orders the end of `forked`'s captured work before what `origin` captures
  // next, when `forked` is still in an active capture. Errors are left to
  // cudaStreamEndCapture, which reports the capture's state.
  static void join_if_capturing(cudaStream_t forked, cudaStream_t origin) noexcept {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(forked, &status) != cudaSuccess || status != cudaStreamCaptureStatusActive) return;
    cudaEvent_t joined = nullptr;
    if (cudaEventCreateWithFlags(&joined, cudaEventDisableTiming) != cudaSuccess) return;
    if (cudaEventRecord(joined, forked) == cudaSuccess) (void)cudaStreamWaitEvent(origin, joined, 0);
    MIX_CUDA_CHECK_NOTHROW(cudaEventDestroy(joined));
  }

  void drop() noexcept {
    if (exec_) MIX_CUDA_CHECK_NOTHROW(cudaGraphExecDestroy(exec_));
    if (graph_) MIX_CUDA_CHECK_NOTHROW(cudaGraphDestroy(graph_));
    exec_ = nullptr;
    graph_ = nullptr;
  }

  int device_;
  CudaCachingAllocator& allocator_;
  int pool_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace

std::unique_ptr<DeviceGraph> make_cuda_graph(int device, CudaCachingAllocator& allocator) {
  return std::make_unique<CudaGraph>(device, allocator);
}

}  // namespace mix::cuda
