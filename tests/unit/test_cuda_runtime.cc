// [cuda] The CUDA runtime: caching allocator (reuse, counters, out-of-memory
// message, recording pools), device tensors through the backend registry,
// stream/event ordering, and CUDA graph recordings (DeviceGraph).
// Without a GPU (or in a build without CUDA) the test exits 77, which CTest
// reports as skipped, never as passed.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>
#include "tests/unit/require_gpu.h"

#include "runtime/core/check.h"
#include "runtime/core/device_backend.h"
#include "runtime/core/random.h"
#include "runtime/core/tensor.h"
#include "runtime/data/batch_feeder.h"
#include "runtime/data/dataset.h"

#ifdef MIX_HAVE_CUDA
#include <cuda_runtime.h>

#include <chrono>
#include <thread>

#include "runtime/cuda/context.h"
#include "runtime/cuda/device_allocator.h"
#include "runtime/cuda/stream.h"
#endif

namespace {

#ifdef MIX_HAVE_CUDA
void require_gpu_or_skip() { mix::testing::require_gpu(); }

const mix::Device kGpu{mix::DeviceKind::cuda, 0};

bool same_bytes(const mix::Tensor& a, const mix::Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}
#endif

}  // namespace

#ifndef MIX_HAVE_CUDA
TEST_CASE("CUDA runtime", "[cuda]") {
  WARN("this build has no CUDA: skipped");
  std::exit(77);
}
#else

TEST_CASE("caching allocator hands a freed block back and counts live/peak bytes", "[cuda]") {
  require_gpu_or_skip();
  mix::cuda::CudaCachingAllocator a(0);
  CHECK(a.device() == kGpu);
  CHECK(a.allocate(0) == nullptr);

  void* p = a.allocate(1000);
  REQUIRE(p != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(p) % 256 == 0);
  CHECK(a.live_bytes() == 1000);  // requested bytes, not the 1024 of the size class
  CHECK(a.reserved_bytes() == 1024);
  a.deallocate(p, 1000);
  CHECK(a.live_bytes() == 0);
  CHECK(a.cached_bytes() == 1024);
  // Same size class -> the same block, no new cudaMalloc.
  void* q = a.allocate(1000);
  CHECK(q == p);
  CHECK(a.cached_bytes() == 0);
  a.deallocate(q, 1000);
  void* r = a.allocate(600);  // rounds to 1024 as well
  CHECK(r == p);
  CHECK(a.reserved_bytes() == 1024);

  // Above 1 MiB sizes round to 2 MiB.
  CHECK(mix::cuda::CudaCachingAllocator::round_size(1) == 512);
  CHECK(mix::cuda::CudaCachingAllocator::round_size(1 << 20) == (1 << 20));
  CHECK(mix::cuda::CudaCachingAllocator::round_size((1 << 20) + 1) == (2 << 20));
  CHECK(mix::cuda::CudaCachingAllocator::round_size(3 << 20) == (4 << 20));
  const size_t big = 3u << 20;
  void* b = a.allocate(big);
  CHECK(a.live_bytes() == 600 + big);
  CHECK(a.peak_bytes() == 600 + big);
  CHECK(a.reserved_bytes() == 1024 + (4u << 20));
  a.deallocate(b, big);
  CHECK(a.live_bytes() == 600);
  CHECK(a.peak_bytes() == 600 + big);  // the peak stays until reset
  a.reset_peak();
  CHECK(a.peak_bytes() == 600);

  // A small request does not take the cached 4 MiB block (it would waste most of it)...
  void* s = a.allocate(2048);
  CHECK(s != b);
  CHECK(a.cached_bytes() == (4u << 20));
  // ...but a request of a nearby large size does (best fit, less than twice the request).
  void* b2 = a.allocate((2u << 20) + 1);
  CHECK(b2 == b);
  a.deallocate(b2, (2u << 20) + 1);
  a.deallocate(s, 2048);
  a.deallocate(r, 600);
  CHECK(a.live_bytes() == 0);
  CHECK(a.cached_bytes() == a.reserved_bytes());
  a.empty_cache();
  CHECK(a.cached_bytes() == 0);
  CHECK(a.reserved_bytes() == 0);
}

TEST_CASE("out of memory names the device and the sizes", "[cuda]") {
  require_gpu_or_skip();
  mix::Allocator& a = mix::allocator_for(kGpu);
  const size_t absurd = size_t{1} << 50;  // 1 PiB: no GPU has it
  std::string msg;
  try {
    a.allocate(absurd);
  } catch (const mix::OutOfMemoryError& e) {  // its own type: callers with a smaller way out catch it
    msg = e.what();
  }
  INFO(msg);
  CHECK(msg.find("CUDA out of memory on device 0") != std::string::npos);
  CHECK(msg.find(std::to_string(absurd) + " bytes") != std::string::npos);
  CHECK(msg.find("live") != std::string::npos);
  CHECK(msg.find("cached") != std::string::npos);
  CHECK(msg.find("total") != std::string::npos);
  // The failure left no error behind for the next launch check, and the allocator works.
  CHECK(cudaGetLastError() == cudaSuccess);
  void* p = a.allocate(4096);
  CHECK(p != nullptr);
  a.deallocate(p, 4096);
}

TEST_CASE("the GPU op timer measures the device's time between marks, not the host's", "[cuda]") {
  require_gpu_or_skip();
  std::unique_ptr<mix::OpTimer> timer = mix::require_device_backend(mix::DeviceKind::cuda).make_op_timer(0);
  REQUIRE(timer);
  mix::cuda::DeviceContext& ctx = mix::cuda::use_device(0);
  double hold = 0.2;                   // the "op": 200 ms of work queued on the compute stream
  for (int run = 0; run < 2; ++run) {  // the second run reuses the events
    timer->start();
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(cudaLaunchHostFunc(ctx.compute.get(), mix::testing::hold_stream, &hold) == cudaSuccess);
    timer->mark();  // returns at once: the host only queued the work
    timer->mark();  // an "op" that queued nothing
    const double host_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::vector<double> secs = timer->collect();  // waits for the device
    REQUIRE(secs.size() == 2);
    INFO("run " << run << ": device " << secs[0] << " s, " << secs[1] << " s; host " << host_s << " s");
    CHECK(host_s < 0.1);
    CHECK(secs[0] >= 0.19);
    CHECK(secs[0] < 2.0);
    CHECK(secs[1] >= 0.0);
    CHECK(secs[1] < 0.05);
  }
  CHECK(timer->collect().empty());  // nothing marked since
}

TEST_CASE("a memory limit makes allocations past it fail as out of memory, after returning the cache", "[cuda]") {
  require_gpu_or_skip();
  auto& a = dynamic_cast<mix::cuda::CudaCachingAllocator&>(mix::allocator_for(kGpu));
  a.empty_cache();
  struct RestoreLimit {  // even when a REQUIRE fails: the next tests need the whole GPU
    mix::cuda::CudaCachingAllocator& a;
    size_t before;
    ~RestoreLimit() { a.set_limit(before); }
  } restore{a, a.limit()};
  const size_t base = a.reserved_bytes();
  a.set_limit(base + (4u << 20));
  void* p = a.allocate(3u << 20);  // 4 MiB class: exactly at the limit
  CHECK(a.reserved_bytes() == base + (4u << 20));
  std::string msg;
  try {
    a.allocate(512);
  } catch (const mix::OutOfMemoryError& e) {
    msg = e.what();
  }
  INFO(msg);
  CHECK(msg.find("limit " + std::to_string(base + (4u << 20)) + " bytes") != std::string::npos);
  // A freed block is cached, and returned to the driver when the limit is hit.
  a.deallocate(p, 3u << 20);
  void* q = a.allocate(512);  // not from the 4 MiB block (too wasteful): the cache goes, then it fits
  CHECK(a.cached_bytes() == 0);
  CHECK(a.reserved_bytes() == base + 512);
  a.deallocate(q, 512);
  CHECK(cudaGetLastError() == cudaSuccess);  // a refusal by the limit leaves no CUDA error behind
}

// Returning the cache on out of memory waits for the device; queued work that
// never finishes must end that wait at the hang timeout (MIX_NCCL_TIMEOUT_S,
// set by the NCCL communicator) with an error that says so, not hang the rank.
TEST_CASE("out of memory while the device's queued work is stuck ends in an error, not a hang", "[cuda]") {
  require_gpu_or_skip();
  mix::Allocator& a = mix::allocator_for(kGpu);
  void* block = a.allocate(size_t{1} << 20);  // a cached block, so the retry must return the cache
  a.deallocate(block, size_t{1} << 20);
  const double timeout_before = mix::cuda::hang_timeout();
  mix::cuda::set_hang_timeout(0.2);
  mix::cuda::DeviceContext& ctx = mix::cuda::use_device(0);
  double hold = 3.0;
  REQUIRE(cudaLaunchHostFunc(ctx.compute.get(), mix::testing::hold_stream, &hold) == cudaSuccess);
  const auto start = std::chrono::steady_clock::now();
  std::string msg;
  bool plain_out_of_memory = false;
  try {
    a.allocate(size_t{1} << 50);
  } catch (const mix::OutOfMemoryError& e) {
    plain_out_of_memory = true;
    msg = e.what();
  } catch (const mix::Error& e) {
    msg = e.what();
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(cudaStreamSynchronize(ctx.compute.get()) == cudaSuccess);  // `hold` must outlive the host function
  mix::cuda::set_hang_timeout(timeout_before);
  INFO(msg << " (after " << waited << " s)");
  CHECK(msg.find("CUDA out of memory on device 0") != std::string::npos);
  CHECK(msg.find("did not finish within 0.2 s") != std::string::npos);
  CHECK(msg.find("MIX_NCCL_TIMEOUT_S") != std::string::npos);
  // It gave up at the timeout, long before the held work (3 s) ended. A
  // stuck device is not a lack of memory: nobody may retry with less.
  CHECK(waited < 2.0);
  CHECK_FALSE(plain_out_of_memory);
  // Idle again, the same request fails as an ordinary out of memory, having returned the cache.
  msg.clear();
  try {
    a.allocate(size_t{1} << 50);
  } catch (const mix::Error& e) {
    msg = e.what();
  }
  CHECK(msg.find("returned to the driver before retrying") != std::string::npos);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("device tensors round-trip bit for bit and fill_zero zeroes them", "[cuda]") {
  require_gpu_or_skip();
  mix::Allocator& a = mix::allocator_for(kGpu);
  const size_t live_before = a.live_bytes();

  // f32 with random values plus the special ones (bytes are copied, not values).
  mix::Rng rng(11);
  std::vector<float> values(257 * 33);
  for (auto& v : values) v = static_cast<float>(rng.normal() * 1e3);
  values[0] = std::numeric_limits<float>::infinity();
  values[1] = -std::numeric_limits<float>::quiet_NaN();
  values[2] = std::numeric_limits<float>::denorm_min();
  values[3] = -0.f;
  const mix::Tensor host = mix::Tensor::from_floats({257, 33}, values);
  {
    const mix::Tensor dev = host.to(kGpu);
    CHECK(dev.device() == kGpu);
    CHECK(dev.shape() == host.shape());
    CHECK(!dev.shares_storage(host));
    CHECK(a.live_bytes() == live_before + host.bytes());
    const mix::Tensor dev2 = dev.clone();  // device -> device on the same GPU
    CHECK(same_bytes(dev2.to(mix::cpu_device()), host));
    CHECK(same_bytes(dev.to(mix::cpu_device()), host));
    CHECK(dev.item_float(5) == values[5]);
  }
  CHECK(a.live_bytes() == live_before);

  // f16: every bit pattern, NaN payloads included.
  mix::Tensor h16 = mix::Tensor::empty({65536}, mix::DType::f16);
  for (uint32_t i = 0; i < 65536; ++i) h16.data<uint16_t>()[i] = static_cast<uint16_t>(i);
  mix::Tensor d16 = mix::Tensor::empty({65536}, mix::DType::f16, kGpu);
  d16.copy_from(h16);
  CHECK(same_bytes(d16.to(mix::cpu_device()), h16));

  d16.fill_zero();
  const mix::Tensor z = d16.to(mix::cpu_device());
  size_t nonzero = 0;
  for (int64_t i = 0; i < z.numel(); ++i) nonzero += z.data<uint16_t>()[i] != 0;
  CHECK(nonzero == 0);

  const std::vector<float> zeros = mix::Tensor::zeros({1000}, mix::DType::f32, kGpu).to_floats();
  size_t nonzero32 = 0;
  for (float v : zeros) nonzero32 += v != 0.f || std::signbit(v);
  CHECK(nonzero32 == 0);
}

namespace {
void CUDART_CB sleep_on_stream(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }
}  // namespace

// Input batches live in page-locked memory on a GPU run (the trainer gathers
// them through DeviceBackend::pinned_host_allocator): host tensors that CUDA
// knows as pinned, counted, freed, and copied to the device bit for bit.
TEST_CASE("pinned host allocator: host tensors in page-locked memory", "[cuda]") {
  require_gpu_or_skip();
  mix::Allocator* pinned = mix::require_device_backend(mix::DeviceKind::cuda).pinned_host_allocator(0);
  REQUIRE(pinned != nullptr);
  CHECK(pinned->device() == mix::cpu_device());
  const size_t live_before = pinned->live_bytes();
  {
    mix::Tensor t = mix::Tensor::empty({1000, 3}, mix::DType::f32, *pinned);
    CHECK(t.device() == mix::cpu_device());
    CHECK(pinned->live_bytes() == live_before + t.bytes());
    cudaPointerAttributes attr{};
    REQUIRE(cudaPointerGetAttributes(&attr, t.raw()) == cudaSuccess);
    CHECK(attr.type == cudaMemoryTypeHost);  // page-locked (pageable memory reports Unregistered)
    mix::Rng rng = mix::Rng::for_stream(5, 0);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(rng.normal());
    const mix::Tensor back = t.to(kGpu).to(mix::cpu_device());
    CHECK(same_bytes(back, t));
  }
  CHECK(pinned->live_bytes() == live_before);
  // The batch prefetcher allocates from a thread that never chose a device: the
  // allocator makes its GPU current there and leaves it so. (Whether a context
  // appears on another GPU needs two GPUs to see; this machine may have one.)
  cudaMemoryType type_in_thread = cudaMemoryTypeUnregistered;
  int device_in_thread = -1;
  std::thread([&] {
    mix::Tensor t = mix::Tensor::empty({256}, mix::DType::f32, *pinned);
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, t.raw()) == cudaSuccess) type_in_thread = attr.type;
    (void)cudaGetDevice(&device_in_thread);
  }).join();
  CHECK(type_in_thread == cudaMemoryTypeHost);
  CHECK(device_in_thread == 0);
  CHECK(pinned->live_bytes() == live_before);
}

TEST_CASE("pinned host frees wait for the end of a recording, from any thread", "[cuda]") {
  require_gpu_or_skip();
  mix::Allocator* pinned = mix::require_device_backend(mix::DeviceKind::cuda).pinned_host_allocator(0);
  REQUIRE(pinned != nullptr);
  auto type_of = [](const void* p) {
    cudaPointerAttributes attr{};
    return cudaPointerGetAttributes(&attr, p) == cudaSuccess ? attr.type : cudaMemoryTypeUnregistered;
  };
  // Under a mark the free is held: the memory stays page-locked until the mark ends.
  void* p = pinned->allocate(4096);
  {
    mix::cuda::CaptureInProgress mark;
    pinned->deallocate(p, 4096);
    CHECK(type_of(p) == cudaMemoryTypeHost);
  }
  CHECK(type_of(p) == cudaMemoryTypeUnregistered);
  // The batch prefetcher's case: another thread frees while the main thread
  // records. cudaFreeHost would synchronise the device during the capture.
  mix::cuda::DeviceContext& ctx = mix::cuda::use_device(0);
  mix::Tensor out = mix::Tensor::empty({256}, mix::DType::u8, kGpu);
  void* q = pinned->allocate(1 << 20);
  std::unique_ptr<mix::DeviceGraph> graph = mix::require_device_backend(mix::DeviceKind::cuda).make_graph(0);
  graph->record([&] {
    MIX_CUDA_CHECK(cudaMemsetAsync(out.raw(), 0x5a, 256, ctx.compute.get()));
    std::thread([&] { pinned->deallocate(q, 1 << 20); }).join();
  });
  CHECK(type_of(q) == cudaMemoryTypeUnregistered);  // held during the recording, freed once it ended
  graph->replay();
  ctx.compute.synchronize();
  CHECK(out.to(mix::cpu_device()).data<uint8_t>()[255] == 0x5a);
}

TEST_CASE("an event orders the communication stream after the compute stream", "[cuda]") {
  require_gpu_or_skip();
  mix::cuda::DeviceContext& ctx = mix::cuda::use_device(0);
  CHECK(ctx.device == 0);
  CHECK(&mix::cuda::context(0) == &ctx);
  CHECK(ctx.compute.get() != nullptr);
  CHECK(ctx.comm.get() != nullptr);
  CHECK(ctx.compute.get() != ctx.comm.get());
  CHECK_FALSE(mix::cuda::allow_tf32());  // off by default

  auto& a = dynamic_cast<mix::cuda::CudaCachingAllocator&>(mix::allocator_for(kGpu));
  const size_t n = size_t{64} << 20;
  auto* d = static_cast<unsigned char*>(a.allocate(n));
  REQUIRE(cudaMemsetAsync(d, 0, n, ctx.compute.get()) == cudaSuccess);
  ctx.compute.synchronize();
  mix::Tensor h = mix::Tensor::empty({static_cast<int64_t>(n)}, mix::DType::u8,
                                     *mix::require_device_backend(mix::DeviceKind::cuda).pinned_host_allocator(0));
  REQUIRE(h.bytes() == n);
  std::memset(h.raw(), 0xff, n);

  // The compute stream is held up on the host for 200 ms before it writes 0x5a;
  // the comm stream's copy would read the old zeros if the event did not order it.
  mix::cuda::Event t0(true), t1(true);
  t0.record(ctx.compute.get());
  REQUIRE(cudaLaunchHostFunc(ctx.compute.get(), sleep_on_stream, nullptr) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(d, 0x5a, n, ctx.compute.get()) == cudaSuccess);
  t1.record(ctx.compute.get());
  mix::cuda::Event produced;
  produced.record(ctx.compute.get());
  produced.wait(ctx.comm.get());
  REQUIRE(cudaMemcpyAsync(h.raw(), d, n, cudaMemcpyDeviceToHost, ctx.comm.get()) == cudaSuccess);
  ctx.comm.synchronize();
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += h.data<uint8_t>()[i] != 0x5a;
  CHECK(wrong == 0);
  t1.synchronize();
  CHECK(t1.elapsed_ms_since(t0) >= 150.f);  // the sleep is inside the timed span

  // The block was last used on the comm stream: order that back onto the
  // compute stream before freeing (the allocator's stream-ordered contract).
  mix::cuda::Event consumed;
  consumed.record(ctx.comm.get());
  consumed.wait(ctx.compute.get());
  a.deallocate(d, n);

  // Moves leave the source empty and never double-destroy.
  mix::cuda::Stream s1;
  mix::cuda::Stream s2 = std::move(s1);
  CHECK(s1.get() == nullptr);
  CHECK(s2.get() != nullptr);
  s2.synchronize();

  mix::cuda::set_allow_tf32(true);
  CHECK(mix::cuda::allow_tf32());
  mix::cuda::set_allow_tf32(false);
}

TEST_CASE("the host-to-device queue is ordered after compute work, and its fences bound the host's wait", "[cuda]") {
  require_gpu_or_skip();
  mix::cuda::DeviceContext& ctx = mix::cuda::use_device(0);
  mix::DeviceBackend& backend = mix::require_device_backend(mix::DeviceKind::cuda);
  std::unique_ptr<mix::HostToDeviceQueue> queue = backend.make_host_to_device_queue(0, 2);
  REQUIRE(queue != nullptr);
  const int64_t n = int64_t{64} << 20;
  mix::Allocator& pinned = *backend.pinned_host_allocator(0);
  mix::Tensor src = mix::Tensor::empty({n}, mix::DType::u8, pinned);
  std::memset(src.raw(), 0x11, static_cast<size_t>(n));
  mix::Tensor d = mix::Tensor::empty({n}, mix::DType::u8, kGpu);

  // wait_for_compute: the compute stream, held 200 ms, then writes 0x5a; the
  // upload queued after wait_for_compute() must land on top of that.
  REQUIRE(cudaLaunchHostFunc(ctx.compute.get(), sleep_on_stream, nullptr) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(d.raw(), 0x5a, static_cast<size_t>(n), ctx.compute.get()) == cudaSuccess);
  queue->wait_for_compute();
  queue->copy(d.raw(), src.raw(), static_cast<size_t>(n));
  queue->record(1);
  // compute_waits: the compute stream's read below comes after the upload.
  queue->compute_waits(1);
  mix::Tensor back = d.to(mix::cpu_device());  // a copy on the compute stream
  size_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += back.data<uint8_t>()[i] != 0x11;
  CHECK(wrong == 0);
  queue->host_waits(1);  // passed already: returns at once

  // host_waits is bounded: an upload stuck behind held compute work fails at
  // the hang timeout, naming the cause, instead of waiting for it.
  const double timeout_before = mix::cuda::hang_timeout();
  mix::cuda::set_hang_timeout(0.2);
  double hold = 3.0;
  REQUIRE(cudaLaunchHostFunc(ctx.compute.get(), mix::testing::hold_stream, &hold) == cudaSuccess);
  queue->wait_for_compute();
  std::memset(src.raw(), 0x22, static_cast<size_t>(n));
  queue->copy(d.raw(), src.raw(), static_cast<size_t>(n));
  queue->record(0);
  const auto start = std::chrono::steady_clock::now();
  std::string msg;
  try {
    queue->host_waits(0);
  } catch (const mix::Error& e) {
    msg = e.what();
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  mix::cuda::set_hang_timeout(timeout_before);
  INFO(msg << " (after " << waited << " s)");
  CHECK(msg.find("input batch upload to GPU 0 did not finish within 0.2 s") != std::string::npos);
  CHECK(waited < 2.0);
  queue->drain();  // `hold`, `src` and `d` outlive the held work and the copy
  REQUIRE(cudaStreamSynchronize(ctx.compute.get()) == cudaSuccess);
  CHECK(d.to(mix::cpu_device()).data<uint8_t>()[n - 1] == 0x22);
  CHECK_THROWS_WITH(queue->record(2), Catch::Matchers::Contains("fence 2 of a host-to-device queue with 2"));
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("BatchFeeder uploads gather_batch's batches to the GPU while the compute stream is busy", "[cuda]") {
  require_gpu_or_skip();
  mix::cuda::DeviceContext& ctx = mix::cuda::use_device(0);
  mix::data::Dataset ds;
  ds.name = "feeder";
  const int64_t examples = 1000, features = 3000;  // 12 MB of inputs
  ds.inputs = mix::Tensor::empty({examples, features}, mix::DType::f32);
  ds.labels = mix::Tensor::empty({examples}, mix::DType::i64);
  mix::Rng rng = mix::Rng::for_stream(11, 0);
  for (int64_t i = 0; i < ds.inputs.numel(); ++i) ds.inputs.data<float>()[i] = static_cast<float>(rng.normal());
  for (int64_t i = 0; i < examples; ++i) ds.labels.data<int64_t>()[i] = i % 10;
  ds.num_classes = 10;
  auto order = std::make_shared<const std::vector<int64_t> >([&] {
    std::vector<int64_t> v(static_cast<size_t>(examples));
    for (int64_t i = 0; i < examples; ++i) v[static_cast<size_t>(i)] = (i * 7919) % examples;
    return v;
  }());
  const int64_t batch = 300, steps = 8;  // 4 batches an epoch, the last of 100 examples
  auto batch_of = [&](int64_t s) {
    const int64_t begin = (s % 4) * batch;
    return mix::data::BatchRequest{order, begin, std::min(batch, examples - begin)};
  };
  mix::data::BatchFeeder feeder(ds, kGpu, mix::require_device_backend(mix::DeviceKind::cuda).pinned_host_allocator(0),
                                batch_of, 0, steps);
  double hold = 0.05;
  for (int64_t s = 0; s < steps; ++s) {
    INFO("step " << s);
    const mix::data::Batch& b = feeder.next();
    REQUIRE(b.inputs.device() == kGpu);
    // A "step" the compute stream is busy with while the next upload runs.
    REQUIRE(cudaLaunchHostFunc(ctx.compute.get(), mix::testing::hold_stream, &hold) == cudaSuccess);
    mix::Tensor x, y;
    const mix::data::BatchRequest r = batch_of(s);
    mix::data::gather_batch(ds, *r.indices, r.begin, r.count, x, y);
    CHECK(same_bytes(b.inputs.to(mix::cpu_device()), x));
    CHECK(same_bytes(b.labels.to(mix::cpu_device()), y));
  }
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("a recording pool keeps its blocks to itself until released", "[cuda]") {
  require_gpu_or_skip();
  mix::cuda::CudaCachingAllocator a(0);
  void* shared = a.allocate(1000);
  a.deallocate(shared, 1000);
  REQUIRE(a.cached_bytes() == 1024);

  const int pool = a.new_pool();
  a.use_pool(pool);
  void* in_pool = a.allocate(1000);
  CHECK(in_pool != shared);         // the shared cache's block is not taken...
  CHECK(a.cached_bytes() == 1024);  // ...and stays cached there
  CHECK(a.reserved_bytes() == 2048);
  a.deallocate(in_pool, 1000);
  CHECK(a.cached_bytes() == 1024);  // the pool's block went back to the pool, not the shared cache
  void* again = a.allocate(600);
  CHECK(again == in_pool);  // the recording reuses its own freed block

  a.use_pool(0);
  void* outside = a.allocate(1000);
  CHECK(outside == shared);
  a.deallocate(again, 600);  // freed while the pool is not in use: still the pool's
  void* next = a.allocate(1000);
  CHECK(next != in_pool);  // so nobody else gets it
  a.deallocate(next, 1000);
  a.deallocate(outside, 1000);
  const size_t cached_before_release = a.cached_bytes();
  a.release_pool(pool);
  CHECK(a.cached_bytes() == cached_before_release + 1024);  // the pool's block joins the shared cache
  CHECK_THROWS_WITH(a.use_pool(pool), Catch::Contains("no pool"));
  a.empty_cache();
  CHECK(a.reserved_bytes() == 0);
}

TEST_CASE("a CUDA graph replays its recorded copies on the recorded memory; a failed recording leaves the GPU usable",
          "[cuda]") {
  require_gpu_or_skip();
  mix::cuda::DeviceContext& ctx = mix::cuda::use_device(0);
  auto& alloc = dynamic_cast<mix::cuda::CudaCachingAllocator&>(mix::allocator_for(kGpu));
  std::unique_ptr<mix::DeviceGraph> graph = mix::require_device_backend(mix::DeviceKind::cuda).make_graph(0);
  REQUIRE(graph);
  const size_t n = 4096;
  mix::Tensor input = mix::Tensor::empty({static_cast<int64_t>(n)}, mix::DType::u8, kGpu);
  mix::Tensor output = mix::Tensor::empty({static_cast<int64_t>(n)}, mix::DType::u8, kGpu);
  mix::Tensor host = mix::Tensor::empty({static_cast<int64_t>(n)}, mix::DType::u8,
                                        *mix::require_device_backend(mix::DeviceKind::cuda).pinned_host_allocator(0));
  // Recorded: input -> a temporary from the allocator (the recording's pool) -> output.
  void* temporary = nullptr;
  graph->record([&] {
    temporary = alloc.allocate(n);
    MIX_CUDA_CHECK(cudaMemcpyAsync(temporary, input.raw(), n, cudaMemcpyDeviceToDevice, ctx.compute.get()));
    MIX_CUDA_CHECK(cudaMemcpyAsync(output.raw(), temporary, n, cudaMemcpyDeviceToDevice, ctx.compute.get()));
    alloc.deallocate(temporary, n);
  });
  REQUIRE(temporary != nullptr);
  // Nothing else is handed the temporary: allocations of its size come from elsewhere.
  std::vector<void*> others;
  for (int i = 0; i < 8; ++i) others.push_back(alloc.allocate(n));
  for (void* p : others) CHECK(p != temporary);
  for (void* p : others) alloc.deallocate(p, n);

  for (uint8_t value : {uint8_t{0x11}, uint8_t{0x7e}}) {
    INFO("value " << int(value));
    std::memset(host.raw(), value, n);
    graph->copy_in(input.raw(), host.raw(), n);  // ordered before the replay
    graph->replay();
    ctx.compute.synchronize();
    const mix::Tensor back = output.to(mix::cpu_device());
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) wrong += back.data<uint8_t>()[i] != value;
    CHECK(wrong == 0);
  }

  // A host wait for the stream being recorded is forbidden: the recording
  // fails with CUDA's reason, and the GPU goes on working.
  std::unique_ptr<mix::DeviceGraph> bad = mix::require_device_backend(mix::DeviceKind::cuda).make_graph(0);
  CHECK_THROWS_WITH(bad->record([&] { ctx.compute.synchronize(); }), Catch::Contains("could not record"));
  // The type a single process falls back to op-by-op steps on (launch/trainer.cc).
  CHECK_THROWS_AS(bad->record([&] { ctx.compute.synchronize(); }), mix::RecordingError);
  CHECK_THROWS_WITH(bad->record([] { MIX_FAIL("an op's own error"); }), Catch::Contains("an op's own error"));
  CHECK_THROWS_WITH(bad->replay(), Catch::Contains("before anything was recorded"));
  CHECK(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaMemsetAsync(output.raw(), 0x22, n, ctx.compute.get()) == cudaSuccess);
  ctx.compute.synchronize();
  CHECK(output.to(mix::cpu_device()).data<uint8_t>()[n - 1] == 0x22);
  graph->replay();  // the good recording still replays
  ctx.compute.synchronize();
  CHECK(output.to(mix::cpu_device()).data<uint8_t>()[0] == 0x7e);
}

#endif
