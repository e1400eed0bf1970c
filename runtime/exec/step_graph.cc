#include "runtime/exec/step_graph.h"

#include <algorithm>
#include <utility>

#include "runtime/core/check.h"

namespace mix {

StepGraph::StepGraph(const Program& program, const Executor& step, std::vector<std::string> feeds,
                     std::vector<std::string> outputs, std::unique_ptr<DeviceGraph> graph)
    : program_(program),
      step_(step),
      feed_names_(std::move(feeds)),
      output_names_(std::move(outputs)),
      graph_(std::move(graph)) {
  MIX_CHECK(graph_, "StepGraph needs a device recording (DeviceBackend::make_graph)");
  const OpRegistry& reg = OpRegistry::instance();
  for (const OpDesc& op : program_.ops())
    needs_step_ = needs_step_ || (reg.has(op.type) && reg.get(op.type).varies_by_step);
}

std::string StepGraph::why_not(const Program& program, const ExecEnv& env) {
  if (env.device.kind == DeviceKind::cpu) return "the CPU runs each op as it is called: there is nothing to record";
  if (env.op_seconds) return "MIX_PROFILE_OPS times each op, which a recording of the whole step would hide";
  const OpRegistry& reg = OpRegistry::instance();
  const std::vector<OpDesc>& ops = program.ops();
  for (size_t i = 0; i < ops.size(); ++i)
    if (reg.has(ops[i].type) && reg.get(ops[i].type).host_waits)
      return "op " + std::to_string(i) + " (" + ops[i].type +
             ") waits on the host for its device work, which a recording only queues";
  return "";
}

StepGraph::Ran StepGraph::run(Scope& scope, ExecEnv& env) {
  FeedShapes shapes = feed_shapes(scope);
  const bool repeats_last_run = shapes == last_run_feeds_;
  last_run_feeds_ = std::move(shapes);
  if (recorded_ ? !feeds_match(scope) : !repeats_last_run) {
    step_.run(scope, env);
    return Ran::eager;
  }
  // The recorded ops read the step from device_step_ (set for the whole run:
  // a stand-in recording runs the ops' host code at replay).
  const int64_t* const caller_step = env.device_step;
  if (needs_step_) {
    if (!device_step_.defined()) device_step_ = Tensor::empty({1}, DType::i64, env.device);
    env.device_step = device_step_.data<int64_t>();
  }
  struct RestoreStep {
    ExecEnv& env;
    const int64_t* step;
    ~RestoreStep() { env.device_step = step; }
  } restore{env, caller_step};
  Ran ran = Ran::replayed;
  if (!recorded_ || !persistables_in_place(scope)) {
    record(scope, env);
    ran = Ran::recorded;
  }
  replay(scope, env);
  return ran;
}

StepGraph::FeedShapes StepGraph::feed_shapes(const Scope& scope) const {
  FeedShapes shapes;
  for (const std::string& name : feed_names_) {
    const Tensor& t = scope.get(name);
    shapes.emplace_back(t.shape(), t.dtype());
  }
  return shapes;
}

bool StepGraph::feeds_match(const Scope& scope) const {
  for (size_t i = 0; i < feed_names_.size(); ++i) {
    const Tensor& given = scope.get(feed_names_[i]);
    const Tensor& buffer = feed_buffers_[i];
    if (given.shape() != buffer.shape() || given.dtype() != buffer.dtype()) return false;
  }
  return true;
}

bool StepGraph::persistables_in_place(const Scope& scope) const {
  return std::all_of(persistables_.begin(), persistables_.end(), [&](const Placed& p) {
    const Tensor* t = scope.find(p.name);
    return t && t->raw() == p.where;
  });
}

void StepGraph::record(Scope& scope, ExecEnv& env) {
  recorded_ = false;
  std::vector<Tensor> given;
  feed_buffers_.clear();
  for (const std::string& name : feed_names_) {
    given.push_back(scope.get(name));
    const Tensor& t = given.back();
    feed_buffers_.push_back(Tensor::empty(t.shape(), t.dtype(), env.device));
  }
  // Every temporary and output of the step is allocated while recording, from
  // the recording's pool; one left over from an earlier step (or an
  // evaluation) would be overwritten in place, in memory anyone may get back.
  for (const VarDesc& v : program_.vars())
    if (!v.persistable) scope.erase(v.name);
  for (size_t i = 0; i < feed_names_.size(); ++i) scope.set(feed_names_[i], feed_buffers_[i]);
  // Pointers, not references to this frame: a test's stand-in recording
  // (tests/unit/test_step_graph.cc) keeps the work to run it at each replay.
  Scope* const recorded_scope = &scope;
  ExecEnv* const recorded_env = &env;
  auto give_feeds_back = [&] {
    for (size_t i = 0; i < feed_names_.size(); ++i) scope.set(feed_names_[i], given[i]);
  };
  try {
    graph_->record([this, recorded_scope, recorded_env] { step_.run(*recorded_scope, *recorded_env); });
  } catch (...) {
    // What the failed recording allocated (from its pool) goes, and the
    // caller's batch comes back, not buffers nothing was copied into.
    for (const VarDesc& v : program_.vars())
      if (!v.persistable) scope.erase(v.name);
    give_feeds_back();
    throw;
  }

  outputs_.clear();
  for (const std::string& name : output_names_)
    if (const Tensor* t = scope.find(name)) outputs_.emplace_back(name, *t);
  persistables_.clear();
  for (const VarDesc& v : program_.vars())
    if (v.persistable)
      if (const Tensor* t = scope.find(v.name)) persistables_.push_back({v.name, t->raw()});
  give_feeds_back();
  recorded_ = true;
}

void StepGraph::replay(Scope& scope, const ExecEnv& env) {
  if (needs_step_) {
    // A blocking copy, done before the replay is queued: the host's value
    // need not outlive the call, and the copy waits only for work queued before it.
    Tensor now = Tensor::empty({1}, DType::i64);
    now.data<int64_t>()[0] = env.step;
    device_step_.copy_from(now);
  }
  for (size_t i = 0; i < feed_names_.size(); ++i) {
    const Tensor& given = scope.get(feed_names_[i]);
    graph_->copy_in(feed_buffers_[i].raw(), given.raw(), given.bytes());
  }
  graph_->replay();
  for (auto& [name, t] : outputs_) scope.set(name, t);
}

}  // namespace mix
