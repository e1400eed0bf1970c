// StepGraph (runtime/exec/step_graph.h, --cuda-graph) on the CPU, through a
// stand-in recording that behaves as CUDA's stream capture does where
// StepGraph relies on it: record() runs none of the work, replay() runs it
// once, copy_in copies at once. These tests check the runner's side: which
// run is op by op, recorded or replayed; that a step runs exactly once per
// call (the weights after five steps are the op-by-op bits), with the step
// number its dropout masks and injected overflow depend on; that nothing
// left from an earlier step is in the scope while recording; that each
// replay's inputs are copied into the buffers the recording read; and when a
// step cannot be recorded; and mixtrain's fallback when a recording is
// refused (launch/step_runner.h). The real recording runs in
// test_cuda_train_step's [cuda] cases.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "collective/allreduce_bucket.h"
#include "launch/step_runner.h"
#include "models/model.h"
#include "runtime/core/check.h"
#include "runtime/exec/step_graph.h"
#include "tests/unit/train_steps.h"

using namespace mix;
using namespace mix::testing;

namespace {

// What the stand-in saw.
struct RecordingLog {
  int records = 0, replays = 0;
  std::vector<std::string> leftovers;    // non-persistable variables in the scope while recording, feeds aside
  std::vector<const void*> feeds_read;   // the feeds' addresses the recorded work reads
  std::vector<const void*> copied_into;  // copy_in's destinations since the last replay
  bool copies_were_into_feeds_read = true;
  bool refuse = false;  // record() throws, as a capture CUDA refused does
  // record() runs the step's host code (temporaries allocated, as a capture
  // does until a call is refused), puts the persistables' bytes back (a
  // capture ran none of the device work), then throws.
  bool refuse_after_host_code = false;
  // With refuse_after_host_code: the host code stops with an error at the
  // first op after an all-reduce was started (ExecEnv::progress), as a
  // capture refused part-way through backward does.
  ExecEnv* refuse_mid_pass = nullptr;
  // With refuse_after_host_code: the recording takes at least this long
  // before it is refused (a real one runs the whole step's host code first).
  std::chrono::milliseconds refuse_after = std::chrono::milliseconds(0);
};

class StandInRecording final : public DeviceGraph {
 public:
  StandInRecording(RecordingLog& log, const Program& program, const Scope& scope, std::vector<std::string> feeds)
      : log_(log), program_(program), scope_(scope), feeds_(std::move(feeds)) {}

  void record(const std::function<void()>& work) override {
    if (log_.refuse) throw RecordingError("stand-in recording refused");
    if (log_.refuse_after_host_code) {
      std::vector<std::pair<Tensor, Tensor>> saved;  // each persistable and a copy of its bytes
      for (const VarDesc& v : program_.vars())
        if (v.persistable && scope_.has(v.name)) {
          const Tensor& t = scope_.get(v.name);
          saved.emplace_back(t, t.clone());
        }
      // The recording's feed buffers are filled only before a replay; the CPU
      // kernels check what they read (labels), so give them zeros.
      for (const std::string& f : feeds_) {
        Tensor buffer = scope_.get(f);
        std::memset(buffer.raw(), 0, buffer.bytes());
      }
      std::function<void()> progress;
      if (log_.refuse_mid_pass) {
        progress = log_.refuse_mid_pass->progress;
        log_.refuse_mid_pass->progress = [] { throw mix::Error("an all-reduce is in flight"); };
      }
      std::string why = "the host code ran";
      try {
        work();
      } catch (const std::exception& e) {
        why = e.what();  // CUDA's recording turns whatever stopped the capture into a RecordingError too
      }
      if (log_.refuse_mid_pass) log_.refuse_mid_pass->progress = progress;
      for (auto& [t, bytes] : saved) std::memcpy(t.raw(), bytes.raw(), t.bytes());
      std::this_thread::sleep_for(log_.refuse_after);
      throw RecordingError("stand-in recording refused: " + why);
    }
    ++log_.records;
    log_.leftovers.clear();
    log_.feeds_read.clear();
    for (const VarDesc& v : program_.vars()) {
      const bool feed = std::find(feeds_.begin(), feeds_.end(), v.name) != feeds_.end();
      if (!v.persistable && !feed && scope_.has(v.name)) log_.leftovers.push_back(v.name);
    }
    for (const std::string& f : feeds_) log_.feeds_read.push_back(scope_.get(f).raw());
    work_ = work;  // StepGraph's work holds pointers to the scope and env, which outlive the steps
  }

  void copy_in(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    log_.copied_into.push_back(dst);
  }

  void replay() override {
    ++log_.replays;
    if (log_.copied_into != log_.feeds_read) log_.copies_were_into_feeds_read = false;
    log_.copied_into.clear();
    work_();
  }

 private:
  RecordingLog& log_;
  const Program& program_;
  const Scope& scope_;
  std::vector<std::string> feeds_;
  std::function<void()> work_;
};

using Ran = StepGraph::Ran;

// TrainOptions::make_graph for the stand-in, logging to `log`.
std::function<std::unique_ptr<DeviceGraph>(const TrainedModel&)> stand_in(RecordingLog& log) {
  return [&log](const TrainedModel& m) {
    return std::make_unique<StandInRecording>(log, m.model.program, m.scope,
                                              std::vector<std::string>{m.model.input, m.model.label});
  };
}

// A one-layer Transformer small enough for a few CPU steps, with `dropout`.
models::Model tiny_lm(double dropout) {
  models::TransformerConfig tc;
  tc.vocab = 13;
  tc.context = 6;
  tc.d_model = 8;
  tc.heads = 2;
  tc.layers = 1;
  tc.dropout = dropout;
  return models::build_transformer(tc);
}

}  // namespace

TEST_CASE("StepGraph: op by op, recorded, replayed, with the bits of op-by-op steps", "[step_graph]") {
  for (const bool amp : {false, true}) {
    for (const bool resnet : {false, true}) {
      INFO((amp ? "AMP " : "FP32 ") << (resnet ? "resnet" : "mlp"));
      auto model = [&] {
        return resnet ? narrow_resnet() : models::build_mlp({.in_features = 12, .hidden = {16, 8}, .num_classes = 4});
      };
      TrainOptions o;
      o.amp = amp;
      o.steps = 5;
      const TrainedModel eager = train_steps(model(), o);

      RecordingLog log;
      std::vector<Ran> ran;
      o.ran = &ran;
      o.make_graph = stand_in(log);
      const TrainedModel graphed = train_steps(model(), o);
      CHECK(ran == std::vector<Ran>{Ran::eager, Ran::recorded, Ran::replayed, Ran::replayed, Ran::replayed});
      CHECK(log.records == 1);
      CHECK(log.replays == 4);
      CHECK(log.leftovers.empty());
      CHECK(log.copies_were_into_feeds_read);
      expect_same_training(eager, graphed);
    }
  }
}

TEST_CASE("StepGraph: ops that depend on the step read the step the runner writes before each replay", "[step_graph]") {
  SECTION("dropout: each step's masks") {
    TrainOptions o;
    o.steps = 5;
    o.batch = 2;
    const TrainedModel eager = train_steps(tiny_lm(0.2), o);
    RecordingLog log;
    o.make_graph = stand_in(log);
    const TrainedModel graphed = train_steps(tiny_lm(0.2), o);
    CHECK(log.replays == 4);
    expect_same_training(eager, graphed);
  }
  SECTION("inject_overflow: the chosen step only") {
    auto mlp = [] { return models::build_mlp({.in_features = 12, .hidden = {16, 8}, .num_classes = 4}); };
    TrainOptions o;
    o.amp = true;
    o.steps = 5;
    o.inject = amp::InjectOverflow{4, -1, ""};
    const TrainedModel eager = train_steps(mlp(), o);
    CHECK(eager.found_inf == std::vector<float>{0, 0, 0, 1, 0});
    RecordingLog log;
    o.make_graph = stand_in(log);
    const TrainedModel graphed = train_steps(mlp(), o);
    CHECK(log.replays == 4);
    expect_same_training(eager, graphed);  // found_inf included: step 4 skipped in both
  }
}

namespace {

// A small MLP's training step under a StepGraph with the stand-in recording,
// run on batches of any size.
struct MlpRig {
  models::Model m = models::build_mlp({.in_features = 6, .hidden = {5}, .num_classes = 3});
  Scope scope;
  std::unique_ptr<collective::Communicator> comm = collective::make_local_communicator();
  std::unique_ptr<Executor> step;
  ExecEnv env;
  RecordingLog log;
  std::unique_ptr<StepGraph> graph;

  MlpRig() {
    m.program = training_program(m, /*use_amp=*/false);
    initialize_persistables(m.program, scope, 3);
    scope.get(optim::kLearningRate).data<float>()[0] = 0.05f;
    step = std::make_unique<Executor>(m.program, std::set<std::string>{m.loss});
    env.comm = comm.get();
    graph = std::make_unique<StepGraph>(
        m.program, *step, std::vector<std::string>{m.input, m.label}, std::vector<std::string>{m.loss},
        std::make_unique<StandInRecording>(log, m.program, scope, std::vector<std::string>{m.input, m.label}));
  }

  // Sets a batch of n examples as the feeds.
  void feed(int64_t n) {
    std::vector<float> x(static_cast<size_t>(n * 6));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) * 0.1f - 0.3f;
    scope.set(m.input, Tensor::from_floats({n, 6}, x));
    Tensor labels = Tensor::empty({n}, DType::i64);
    for (int64_t i = 0; i < n; ++i) labels.data<int64_t>()[i] = i % 3;
    scope.set(m.label, labels);
  }

  Ran run_batch(int64_t n) {
    feed(n);
    return graph->run(scope, env);
  }
};

}  // namespace

TEST_CASE("StepGraph: other feed shapes run op by op; a moved persistable is recorded again", "[step_graph]") {
  MlpRig rig;
  CHECK(rig.run_batch(4) == Ran::eager);
  CHECK(rig.run_batch(4) == Ran::recorded);
  CHECK(rig.run_batch(4) == Ran::replayed);
  CHECK(rig.run_batch(2) == Ran::eager);  // a partial batch: the recording is of batch 4
  CHECK(rig.run_batch(4) == Ran::replayed);
  CHECK(rig.log.records == 1);
  {
    // The same shape in another dtype is another feed: a replay would copy its
    // bytes into the recording's buffer as if they were the recorded dtype.
    rig.feed(4);
    const Tensor labels = rig.scope.get(rig.m.label);
    Tensor narrow = Tensor::empty(labels.shape(), DType::i32);
    for (int64_t i = 0; i < labels.numel(); ++i)
      narrow.data<int32_t>()[i] = static_cast<int32_t>(labels.data<int64_t>()[i]);
    rig.scope.set(rig.m.label, narrow);
    const int replays = rig.log.replays;
    Ran ran = Ran::replayed;
    try {
      ran = rig.graph->run(rig.scope, rig.env);
    } catch (const mix::Error&) {
      ran = Ran::eager;  // op by op, where the loss refuses i32 labels: not a replay either
    }
    CHECK(ran == Ran::eager);
    CHECK(rig.log.replays == replays);
  }

  // A persistable moved (a checkpoint loaded into the scope, say): the
  // recording would update the old memory, so the step is recorded again.
  std::string moved;
  for (const VarDesc& v : rig.m.program.vars())
    if (v.is_parameter) {
      moved = v.name;
      break;
    }
  REQUIRE(!moved.empty());
  rig.scope.set(moved, rig.scope.get(moved).to(cpu_device()).clone());
  CHECK(rig.run_batch(4) == Ran::recorded);
  CHECK(rig.run_batch(4) == Ran::replayed);
  CHECK(rig.log.records == 2);
  CHECK(rig.log.leftovers.empty());  // the partial batch's temporaries were dropped before recording again
  CHECK(rig.log.copies_were_into_feeds_read);
}

TEST_CASE("StepGraph records the first step whose feeds have the shapes of the step before it", "[step_graph]") {
  // Two steps an epoch with a short last batch: the second step must not be
  // recorded, or every full batch after it would run op by op.
  MlpRig rig;
  CHECK(rig.run_batch(4) == Ran::eager);
  CHECK(rig.run_batch(2) == Ran::eager);
  CHECK(rig.run_batch(4) == Ran::eager);  // nothing ran op by op at these shapes just before
  CHECK(rig.run_batch(4) == Ran::recorded);
  CHECK(rig.run_batch(2) == Ran::eager);
  CHECK(rig.run_batch(4) == Ran::replayed);
  CHECK(rig.log.records == 1);
}

TEST_CASE("StepGraph: a refused recording leaves the caller's feeds in the scope", "[step_graph]") {
  MlpRig rig;
  CHECK(rig.run_batch(4) == Ran::eager);
  rig.log.refuse = true;
  rig.feed(4);
  const void* input = rig.scope.get(rig.m.input).raw();
  const void* label = rig.scope.get(rig.m.label).raw();
  CHECK_THROWS_WITH(rig.graph->run(rig.scope, rig.env), Catch::Contains("stand-in recording refused"));
  CHECK(rig.scope.get(rig.m.input).raw() == input);
  CHECK(rig.scope.get(rig.m.label).raw() == label);
}

namespace {

// The persistables of two rigs are the same bits.
void expect_same_persistables(const MlpRig& a, const MlpRig& b) {
  int compared = 0;
  for (const VarDesc& v : a.m.program.vars())
    if (v.persistable) {
      INFO(v.name);
      const Tensor& x = a.scope.get(v.name);
      const Tensor& y = b.scope.get(v.name);
      REQUIRE(x.bytes() == y.bytes());
      CHECK(std::memcmp(x.raw(), y.raw(), x.bytes()) == 0);
      ++compared;
    }
  CHECK(compared > 2);
}

uint64_t grad_bytes(const MlpRig& rig) { return rig.comm->bytes().grad_allreduce_bytes; }

}  // namespace

// mixtrain's fallback with one rank (launch/step_runner.h): a recording that
// failed part-way is followed by the same step op by op. Nothing the failed
// recording allocated may be left in the scope, and the result must be the
// bits of a run that never tried to record.
TEST_CASE("StepGraph: after a recording that failed part-way, the step runs op by op with the usual bits",
          "[step_graph]") {
  // At the end of the host code (CUDA refused the capture as a whole, or to
  // instantiate it), or at the first op after an all-reduce was started
  // (a call refused part-way through backward).
  const bool mid_pass = GENERATE(false, true);
  INFO((mid_pass ? "refused part-way, an all-reduce in flight" : "refused at the end"));
  MlpRig rig, never_recorded;
  CHECK(rig.run_batch(4) == Ran::eager);
  never_recorded.feed(4);
  never_recorded.step->run(never_recorded.scope, never_recorded.env);

  rig.log.refuse_after_host_code = true;
  if (mid_pass) rig.log.refuse_mid_pass = &rig.env;
  rig.feed(4);
  const void* input = rig.scope.get(rig.m.input).raw();
  CHECK_THROWS_AS(rig.graph->run(rig.scope, rig.env), RecordingError);
  // Part-way, the started all-reduce is left for the caller to give up.
  CHECK(rig.env.in_flight.size() == (mid_pass ? 1u : 0u));
  CHECK(rig.comm->in_flight() == rig.env.in_flight.size());
  collective::forget_started(rig.env);  // as mixtrain's fallback does
  CHECK(rig.env.in_flight.empty());
  CHECK(rig.comm->in_flight() == 0);
  CHECK(rig.scope.get(rig.m.input).raw() == input);
  for (const VarDesc& v : rig.m.program.vars())
    if (!v.persistable && v.name != rig.m.input && v.name != rig.m.label) {
      INFO(v.name << " was allocated by the failed recording and is still in the scope");
      CHECK_FALSE(rig.scope.has(v.name));
    }
  rig.step->run(rig.scope, rig.env);
  never_recorded.feed(4);
  never_recorded.step->run(never_recorded.scope, never_recorded.env);
  expect_same_persistables(rig, never_recorded);
  CHECK(rig.log.records == 0);
}

// launch::run_training_step, mixtrain's loop around StepGraph: what it does
// when CUDA refuses the recording.
TEST_CASE("run_training_step: a refused recording falls back to op-by-op steps with one rank", "[step_graph]") {
  const bool mid_pass = GENERATE(false, true);
  INFO((mid_pass ? "refused part-way, an all-reduce in flight" : "refused at the end"));
  MlpRig rig, never_recorded;
  never_recorded.graph.reset();  // op by op throughout
  auto step = [](MlpRig& r) {
    r.feed(4);
    return launch::run_training_step(r.graph, *r.step, r.scope, r.env, /*world=*/1);
  };
  CHECK(step(rig).ran == Ran::eager);
  step(never_recorded);

  rig.log.refuse_after_host_code = true;
  rig.log.refuse_after = std::chrono::milliseconds(50);
  if (mid_pass) rig.log.refuse_mid_pass = &rig.env;
  const uint64_t rig_before = grad_bytes(rig), before = grad_bytes(never_recorded);
  const launch::StepRun fell_back = step(rig);
  const launch::StepRun usual = step(never_recorded);
  CHECK(fell_back.fell_back);
  CHECK(fell_back.ran == Ran::eager);
  CHECK_FALSE(usual.fell_back);
  CHECK(usual.refused_recording_bytes == 0);
  // The trainer takes these from the step's time: step_ms is the op-by-op
  // step's. (A lower bound only: sleep_for waits at least as long as asked.)
  CHECK(fell_back.refused_recording_seconds >= 0.05);
  CHECK(usual.refused_recording_seconds == 0);
  CHECK(rig.graph == nullptr);  // every later step runs op by op
  CHECK(rig.env.in_flight.empty());
  CHECK(rig.comm->in_flight() == 0);
  // The step's own bytes are those of a step that never tried to record.
  // The refused recording had started all-reduces, which the trainer must
  // not count: this MLP's gradients are one bucket, so either refusal came
  // after its one all-reduce had started.
  const uint64_t one_step = grad_bytes(never_recorded) - before;
  REQUIRE(one_step > 0);
  CHECK(fell_back.refused_recording_bytes == one_step);
  CHECK(grad_bytes(rig) - rig_before - fell_back.refused_recording_bytes == one_step);
  expect_same_persistables(rig, never_recorded);

  const launch::StepRun next = step(rig);
  step(never_recorded);
  CHECK(next.ran == Ran::eager);
  CHECK_FALSE(next.fell_back);
  CHECK(rig.log.records == 0);
  expect_same_persistables(rig, never_recorded);
}

TEST_CASE("run_training_step: with several ranks a refused recording stops the job, saying why", "[step_graph]") {
  MlpRig rig;
  rig.feed(4);
  CHECK(launch::run_training_step(rig.graph, *rig.step, rig.scope, rig.env, /*world=*/2).ran == Ran::eager);
  rig.log.refuse = true;
  rig.feed(4);
  CHECK_THROWS_WITH(launch::run_training_step(rig.graph, *rig.step, rig.scope, rig.env, /*world=*/2),
                    Catch::Contains("stand-in recording refused") && Catch::Contains("several ranks") &&
                        Catch::Contains("run without --cuda-graph"));
  CHECK(rig.graph != nullptr);
}

TEST_CASE("StepGraph::why_not names what keeps a step from being recorded", "[step_graph]") {
  const MlpRig rig;  // a training step, gradient all-reduces overlapped (c_allreduce_start/wait)
  const Program& program = rig.m.program;
  ExecEnv gpu;
  gpu.device = Device{DeviceKind::cuda, 0};  // why_not looks at the device's kind only: no GPU needed
  CHECK(StepGraph::why_not(program, gpu).empty());
  // Dropout and inject_overflow, whose work depends on the step, are recorded
  // too: "ops that depend on the step ..." checks their replays.
  CHECK(StepGraph::why_not(training_program(tiny_lm(0.1), /*use_amp=*/true), gpu).empty());

  ExecEnv cpu;
  CHECK_THAT(StepGraph::why_not(program, cpu), Catch::Contains("CPU"));

  std::map<std::string, double> op_seconds;
  ExecEnv profiled = gpu;
  profiled.op_seconds = &op_seconds;
  CHECK_THAT(StepGraph::why_not(program, profiled), Catch::Contains("MIX_PROFILE_OPS"));

  // A blocking all-reduce waits on the host for the GPU, which a recording only queues.
  Program blocking = program;
  const std::string loss = rig.m.loss;
  blocking.append_op(make_op("c_allreduce_sum", {{"X", {loss}}}, {{"Out", {loss}}}));
  CHECK_THAT(StepGraph::why_not(blocking, gpu),
             Catch::Contains("op " + std::to_string(program.ops().size()) + " (c_allreduce_sum) waits on the host"));
}
