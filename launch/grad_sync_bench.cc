#include "launch/grad_sync_bench.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "collective/grad_allreduce_pass.h"
#include "launch/allreduce_bench.h"
#include "launch/train_program.h"
#include "models/model.h"
#include "runtime/core/check.h"
#include "runtime/exec/executor.h"

namespace mix::launch {

namespace {

// The model --model names, at its default size (ResNets at ImageNet's 1000 classes).
models::Model build_named_model(const std::string& name) {
  if (name == "mlp") return models::build_mlp(models::MlpConfig{});
  if (name == "transformer") return models::build_transformer(models::TransformerConfig{});
  if (name == "gpt2") return models::build_transformer(models::transformer_preset(models::TransformerPreset::gpt2), name);
  if (name.rfind("resnet", 0) == 0) return models::build_resnet(models::resnet_preset(name), name);
  MIX_FAIL("mixbench grad-sync: unknown model '" << name << "' (mlp, resnet18, resnet34, resnet50, resnet-small, "
                                                 << "transformer, gpt2)");
}

// A bucket's all-reduce is a start and a wait; the bench runs both.
bool is_gradient_allreduce(const OpDesc& op) {
  return (op.type == "c_allreduce_start" || op.type == "c_allreduce_wait") &&
         op.attr<std::string>("traffic", "") == "gradients";
}

}  // namespace

GradSyncResult run_grad_sync_bench(const GradSyncBenchConfig& c, collective::Communicator& comm,
                                   collective::Communicator& host_comm, Device device) {
  models::Model model = build_named_model(c.model);
  Program& program = model.program;
  // The program mixtrain builds (the optimizer does not matter to the buckets).
  TrainProgramOptions options;
  options.precision = c.precision;
  options.grad_reduce = c.grad_reduce;
  options.optimizer.kind = optim::OptimizerKind::sgd;
  collective::GradSyncOptions sync;
  sync.world_size = comm.world_size();
  sync.bucket_bytes = static_cast<size_t>(c.bucket_mb * 1024 * 1024);
  // One bucket at a time (each start right before its wait): the time of the
  // bytes alone, with no backward to hide them behind.
  sync.overlap = false;
  options.grad_sync = sync;
  options.passes.elide_single_rank_sync = false;  // one rank's sync is timed too (-n 1)
  build_train_program(program, model.loss, options);

  // The gradients the all-reduces read, zero-filled (values do not change the time).
  Scope scope;
  std::set<std::string> vars;
  GradSyncResult r;
  std::map<DType, std::pair<int, uint64_t>> by_dtype;  // buckets and bytes per dtype
  for (const OpDesc& op : program.ops()) {
    if (op.type != "c_allreduce_start" || !is_gradient_allreduce(op)) continue;
    ++r.buckets;
    for (const std::string& v : op.ins("X")) {
      const VarDesc& d = program.var(v);
      scope.set(v, Tensor::zeros(d.shape, d.dtype, device));
      vars.insert(v);
      r.bytes += static_cast<uint64_t>(shape_numel(d.shape)) * dtype_size(d.dtype);
      by_dtype[d.dtype].second += static_cast<uint64_t>(shape_numel(d.shape)) * dtype_size(d.dtype);
    }
    ++by_dtype[program.var(op.ins("X")[0]).dtype].first;
  }
  r.tensors = static_cast<int64_t>(vars.size());
  MIX_CHECK(r.buckets > 0, "mixbench grad-sync: the " << c.model << " program has no gradient all-reduce");

  Executor sync_exec(program, vars, is_gradient_allreduce);
  ExecEnv env;
  env.comm = &comm;
  env.device = device;
  for (int i = 0; i < c.warmup; ++i) sync_exec.run(scope, env);
  comm.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < c.iters; ++i) sync_exec.run(scope, env);
  comm.synchronize();  // on a GPU the waits only order the streams: the syncs may still be running
  float us = static_cast<float>(
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / c.iters);
  host_comm.all_reduce(&us, 1, DType::f32, collective::ReduceOp::max);
  r.time_us = us;
  r.algbw = static_cast<double>(r.bytes) / 1e9 / (r.time_us * 1e-6);
  r.busbw = r.algbw * allreduce_bus_factor(comm.world_size());

  const std::string precision(amp::to_string(c.precision));
  const std::string reduce(collective::to_string(c.grad_reduce.value_or(default_grad_reduce(c.precision))));
  if (comm.rank() == 0) {
    std::printf("# mixbench grad-sync: %s, precision %s, gradient all-reduce in %s, %d rank(s) (%s), buckets of <= %g MB\n",
                c.model.c_str(), precision.c_str(), reduce.c_str(), comm.world_size(),
                comm.backend_name().c_str(), c.bucket_mb);
    std::printf("#   %d bucket(s) of %lld gradients:", r.buckets, static_cast<long long>(r.tensors));
    for (auto& [dt, nb] : by_dtype)
      std::printf(" %s %d (%.2f MB)", std::string(dtype_name(dt)).c_str(), nb.first, static_cast<double>(nb.second) / 1e6);
    std::printf("\n#   %d iterations after %d warm-up; time: the slowest rank's mean per sync\n", c.iters, c.warmup);
    std::printf("# %14s %12s %12s %12s\n", "bytes/rank", "time (us)", "algbw (GB/s)", "busbw (GB/s)");
    std::printf("  %14llu %12.1f %12.3f %12.3f\n", static_cast<unsigned long long>(r.bytes), r.time_us, r.algbw,
                r.busbw);
    if (!c.csv.empty()) {
      std::ifstream probe(c.csv);
      const bool header = !probe.good() || probe.peek() == std::ifstream::traits_type::eof();
      probe.close();
      std::ofstream f(c.csv, std::ios::app);
      MIX_CHECK(f, "mixbench: cannot append to " << c.csv);
      if (header) f << "model,precision,grad_reduce,world,backend,bucket_mb,buckets,tensors,bytes,time_us,algbw,busbw\n";
      f << c.model << ',' << precision << ',' << reduce << ',' << comm.world_size() << ','
        << comm.backend_name() << ',' << c.bucket_mb << ',' << r.buckets << ',' << r.tensors << ',' << r.bytes << ','
        << r.time_us << ',' << r.algbw << ',' << r.busbw << '\n';
    }
  }
  return r;
}

}  // namespace mix::launch
