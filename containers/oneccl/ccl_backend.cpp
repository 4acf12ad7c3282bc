// study_ccl: the project's torch.distributed backend "ccl", built on Intel oneCCL (CPU).
//
// Intel's own bindings (oneccl_bindings_for_pytorch) are not on PyPI and end with torch
// 2.8, but the oneCCL library is (oneccl-cpu-devel). This file is a c10d::Backend on top
// of that library, compiled ahead of time by build_ccl.py into the Python extension
// module `study_ccl`; workflow_scripts/distributed/ccl.py registers it as "ccl".
//
// Design:
//   * Rendezvous goes through the c10d Store torch hands the creator (a PrefixStore per
//     process group): rank 0 creates oneCCL's main key-value store and publishes its
//     address, the others connect to it, then every rank creates the communicator.
//   * Every collective is checked on the calling thread (bad arguments raise there, at
//     once) and then queued to one worker thread per backend. The queue is FIFO, so all
//     ranks issue their oneCCL calls in the order the program issued the collectives.
//     The caller gets a Work whose future completes with the output tensors.
//   * Waiting. With CCL_WORKER_OFFLOAD=0 the worker thread drives oneCCL's progress by
//     testing the event (event.test()). It spins (test + yield) only for as long as a
//     collective of that size class usually takes when every peer is ready (twice the
//     shortest of its last runs, at least STUDY_CCL_SPIN_MIN_US = 1 ms, at most
//     STUDY_CCL_SPIN_MAX_US = 20 ms), then tests at growing intervals, sleeping in
//     between (10 us doubling up to STUDY_CCL_SLEEP_MAX_US = 1 ms; the worker's timer
//     slack is 1 us so short sleeps are short), so a rank waiting for a slower peer does
//     not burn a core that its OpenMP threads need. STUDY_CCL_WAIT=spin restores the old pure spinning, for comparison.
//     study_ccl.stats() counts, per process, the hand-off to the worker, the time in
//     oneCCL, the polls, the sleeps and the time from completion to the future being set.
//   * oneCCL collectives never time out: a dead peer hangs the others. A
//     watchdog thread fails the running collective, and everything queued behind it,
//     once the process-group timeout has passed. The backend is then broken: later
//     collectives fail at once, and the communicator is leaked rather than destroyed
//     (it is in the middle of a collective). A worker still inside a oneCCL call is
//     detached, never joined, so process exit does not hang on it.
//   * Reductions run in the tensor's own dtype. AVG is SUM followed by a division, for
//     floating-point tensors only (like other backends, no integer AVG). Data-movement
//     collectives (broadcast, allgather) move bytes, so they take any dtype.

#include <torch/python.h>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <oneapi/ccl.hpp>

#include <sys/prctl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace study_ccl {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

// The store key under which rank 0 publishes the main KVS address (inside the
// PrefixStore torch gives each process group, so groups do not collide).
constexpr const char* kKvsAddressKey = "study_ccl/kvs_address";

// oneCCL is initialised once per process, whatever the number of process groups.
std::once_flag g_init_once;

// All oneCCL calls of all backends in this process go through this lock, one call at
// a time. Only single calls (post a collective, test its event) hold it, never a whole
// collective, so two process groups progressing at once cannot deadlock on it.
std::mutex g_ccl_call_mutex;

// ---------------------------------------------------------------------------------------
// How the worker waits for a oneCCL event, and what waiting cost (process-wide).

int64_t envMicros(const char* name, int64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') {
    return fallback;
  }
  char* end = nullptr;
  long long value = std::strtoll(text, &end, 10);
  TORCH_CHECK_VALUE(
      end != text && *end == '\0' && value >= 0,
      "ccl: ",
      name,
      " must be a whole number of microseconds >= 0, got '",
      text,
      "'");
  return static_cast<int64_t>(value);
}

struct WaitPolicy {
  bool spin = false; // STUDY_CCL_WAIT=spin: test + yield until done (no sleeping)
  int64_t spinMinUs = 1000; // always spin at least this long (a peer a little late)
  int64_t spinMaxUs = 20000; // never spin longer (a size class not seen yet spins this long)
  int64_t sleepMinUs = 10; // the first sleep after spinning
  int64_t sleepMaxUs = 1000; // sleeps double up to this

  static WaitPolicy fromEnvironment() {
    WaitPolicy p;
    const char* mode = std::getenv("STUDY_CCL_WAIT");
    std::string m = mode == nullptr ? "" : mode;
    TORCH_CHECK_VALUE(
        m.empty() || m == "backoff" || m == "spin",
        "ccl: STUDY_CCL_WAIT must be 'backoff' (the default) or 'spin', got '",
        m,
        "'");
    p.spin = m == "spin";
    p.spinMinUs = envMicros("STUDY_CCL_SPIN_MIN_US", p.spinMinUs);
    p.spinMaxUs = std::max(p.spinMinUs, envMicros("STUDY_CCL_SPIN_MAX_US", p.spinMaxUs));
    p.sleepMaxUs = std::max<int64_t>(1, envMicros("STUDY_CCL_SLEEP_MAX_US", p.sleepMaxUs));
    p.sleepMinUs = std::min(p.sleepMinUs, p.sleepMaxUs);
    return p;
  }
};

// Process-wide counters (all process groups), read by study_ccl.stats().
struct Stats {
  std::atomic<uint64_t> collectives{0};
  std::atomic<uint64_t> handoffNs{0}; // queued on the caller's thread -> worker starts it
  std::atomic<uint64_t> cclNs{0}; // worker starts it -> oneCCL reports it done
  std::atomic<uint64_t> finishNs{0}; // oneCCL done -> the worker sets the future
  std::atomic<uint64_t> spinNs{0}; // of cclNs: spinning
  std::atomic<uint64_t> sleptNs{0}; // of cclNs: asleep between polls
  std::atomic<uint64_t> polls{0}; // event tests
  std::atomic<uint64_t> sleeps{0};
  std::atomic<uint64_t> waitedPastSpin{0}; // collectives that went on to sleeping polls

  void reset() {
    for (auto* c : {&collectives, &handoffNs, &cclNs, &finishNs, &spinNs, &sleptNs, &polls,
                    &sleeps, &waitedPastSpin}) {
      c->store(0);
    }
  }
};
Stats g_stats;

uint64_t nanos(Clock::duration d) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
}

// The shortest recent oneCCL time of each size class (log2 of the bytes): what a
// collective of that size takes when every peer is ready.
class SizeHistory {
 public:
  static constexpr int kKept = 8;

  static int sizeClass(size_t bytes) {
    int c = 0;
    while (bytes > 1 && c < 63) {
      bytes >>= 1;
      ++c;
    }
    return c;
  }

  // The spin budget for a collective of this class.
  int64_t spinBudgetUs(int cls, const WaitPolicy& p) const {
    const auto& kept = runs_[cls];
    if (kept.count == 0) {
      return p.spinMaxUs;
    }
    int64_t shortest = *std::min_element(kept.us.begin(), kept.us.begin() + kept.count);
    return std::clamp<int64_t>(2 * shortest, p.spinMinUs, p.spinMaxUs);
  }

  void add(int cls, int64_t us) {
    auto& kept = runs_[cls];
    kept.us[kept.next] = us;
    kept.next = (kept.next + 1) % kKept;
    kept.count = std::min(kept.count + 1, kKept);
  }

 private:
  struct Kept {
    std::array<int64_t, kKept> us{};
    int next = 0;
    int count = 0;
  };
  std::array<Kept, 64> runs_{};
};

std::string secondsText(Millis timeout) {
  std::ostringstream out;
  out << static_cast<double>(timeout.count()) / 1000.0 << " s";
  return out.str();
}

// An exception_ptr holding a c10::DistBackendError (torch.distributed.DistBackendError
// in Python) with the given message.
std::exception_ptr backendError(const std::string& message) {
  try {
    C10_THROW_ERROR(DistBackendError, message);
  } catch (...) {
    return std::current_exception();
  }
}

// ---------------------------------------------------------------------------------------
// Types and argument checks (run on the calling thread).

// The oneCCL type a reduction runs in; unsupported dtypes raise a TypeError.
ccl::datatype reductionType(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return ccl::datatype::float32;
    case at::kDouble:
      return ccl::datatype::float64;
    case at::kHalf:
      return ccl::datatype::float16;
    case at::kBFloat16:
      return ccl::datatype::bfloat16;
    case at::kChar:
      return ccl::datatype::int8;
    case at::kByte:
      return ccl::datatype::uint8;
    case at::kShort:
      return ccl::datatype::int16;
    case at::kInt:
      return ccl::datatype::int32;
    case at::kLong:
      return ccl::datatype::int64;
    default:
      TORCH_CHECK_TYPE(
          false,
          "ccl ",
          op,
          ": tensors of dtype ",
          t.scalar_type(),
          " are not supported (supported: float32, float64, float16, bfloat16, int8, "
          "uint8, int16, int32, int64)");
  }
}

bool isFloating(const at::Tensor& t) {
  return at::isFloatingType(t.scalar_type());
}

// The oneCCL reduction for a torch ReduceOp. AVG runs as SUM (the caller divides).
ccl::reduction toReduction(const c10d::ReduceOp& reduceOp, const at::Tensor& t, const char* op) {
  switch (reduceOp.op_) {
    case c10d::ReduceOp::SUM:
      return ccl::reduction::sum;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK_VALUE(
          isFloating(t),
          "ccl ",
          op,
          ": ReduceOp.AVG is not supported for integer tensors (got ",
          t.scalar_type(),
          "); use SUM and divide, or a floating-point tensor");
      return ccl::reduction::sum;
    case c10d::ReduceOp::PRODUCT:
      return ccl::reduction::prod;
    case c10d::ReduceOp::MIN:
      return ccl::reduction::min;
    case c10d::ReduceOp::MAX:
      return ccl::reduction::max;
    case c10d::ReduceOp::BAND:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "ccl ", op, " does not support ReduceOp.BAND");
    case c10d::ReduceOp::BOR:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "ccl ", op, " does not support ReduceOp.BOR");
    case c10d::ReduceOp::BXOR:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "ccl ", op, " does not support ReduceOp.BXOR");
    case c10d::ReduceOp::PREMUL_SUM:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "ccl ", op, " does not support ReduceOp.PREMUL_SUM");
    default:
      TORCH_CHECK_NOT_IMPLEMENTED(
          false, "ccl ", op, " does not support reduce op ", static_cast<int>(reduceOp.op_));
  }
}

void checkTensor(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.defined(), "ccl ", op, ": got an undefined tensor");
  TORCH_CHECK_VALUE(
      t.device().is_cpu(),
      "ccl ",
      op,
      ": the ccl backend handles CPU tensors only, got a tensor on ",
      t.device());
  TORCH_CHECK_VALUE(
      t.layout() == at::kStrided,
      "ccl ",
      op,
      ": only dense (strided) tensors are supported, got layout ",
      t.layout());
}

// Exactly one tensor per call (one device per process, as torch.distributed passes it).
const at::Tensor& singleTensor(const std::vector<at::Tensor>& tensors, const char* op) {
  TORCH_CHECK_VALUE(
      tensors.size() == 1,
      "ccl ",
      op,
      ": expects exactly one tensor per call, got ",
      tensors.size());
  checkTensor(tensors[0], op);
  return tensors[0];
}

// A contiguous tensor with t's data: t itself, or a copy (copied back after the call).
at::Tensor contiguousBuffer(const at::Tensor& t) {
  return t.is_contiguous() ? t : t.contiguous();
}

void copyBackIfNeeded(const at::Tensor& original, const at::Tensor& buffer) {
  if (!buffer.is_same(original)) {
    original.copy_(buffer);
  }
}

// ---------------------------------------------------------------------------------------
// Work objects.

// The Work returned for every collective: completed once, either by the worker thread
// (success or a oneCCL error) or by the watchdog (timeout, broken backend).
class CCLWork : public c10d::Work {
 public:
  CCLWork(
      int rank,
      c10d::OpType opType,
      std::string opName,
      Millis timeout,
      std::vector<at::Tensor> outputs,
      uint64_t seq)
      : Work(rank, opType),
        opName_(std::move(opName)),
        timeout_(timeout),
        seq_(seq),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  // Completes the work (future first, so wait() returns only after the future's
  // callbacks ran). Returns false if it was already completed.
  bool complete(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> guard(completeMutex_);
      if (done_) {
        return false;
      }
      done_ = true;
    }
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
    finish(error);
    return true;
  }

  std::vector<at::Tensor> result() override {
    return outputs_;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return future_;
  }

  Millis getTimeout() const override {
    return timeout_;
  }

  uint64_t getSequencenumber() const override {
    return seq_;
  }

  const std::string& opName() const {
    return opName_;
  }

  Millis timeout() const {
    return timeout_;
  }

 private:
  const std::string opName_;
  const Millis timeout_;
  const uint64_t seq_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::mutex completeMutex_;
  bool done_ = false;
};

// ---------------------------------------------------------------------------------------
// State shared by the backend, its worker thread and its watchdog thread. Held through
// a shared_ptr so that a detached worker (stuck in oneCCL) keeps it alive.

struct Task {
  c10::intrusive_ptr<CCLWork> work;
  // Runs the collective on the worker thread; throws on failure.
  std::function<void()> run;
  Clock::time_point queued;
  size_t bytes = 0; // the output tensors' size (the waiting's size class)
};

struct State {
  int rank = 0;
  int size = 0;
  bool debug = false; // STUDY_CCL_DEBUG set: one line per collective on stderr
  std::shared_ptr<ccl::kvs> kvs;
  std::unique_ptr<ccl::communicator> comm;

  std::mutex mutex;
  std::condition_variable cv; // queue, running work, stop and broken changes
  std::deque<Task> queue;
  c10::intrusive_ptr<CCLWork> running; // the worker's current collective
  Clock::time_point deadline; // when `running` times out
  bool stop = false;
  std::string broken; // non-empty: why the backend is unusable
  std::atomic<bool> abandon{false}; // set with `broken`: the worker gives up polling
  std::atomic<bool> inCcl{false}; // the worker is inside a oneCCL call
  WaitPolicy wait; // how the worker waits for oneCCL events
  SizeHistory history; // worker thread only
  int runningClass = 0; // worker thread only: the size class of the running task

  // Finished tasks. The worker and watchdog threads never drop the last reference to
  // a task's tensors: releasing a tensor Python knows takes the GIL, and a non-Python
  // thread that takes the GIL while the interpreter finalizes is killed, which ended
  // in std::terminate at exit. The next collective call (a Python thread) or the
  // backend's destructor drops them.
  std::vector<Task> retired;

  ~State() {
    if (!broken.empty()) {
      // The communicator is in the middle of a collective that will never finish;
      // destroying it could block or crash, so it is leaked on purpose.
      (void)comm.release();
      (void)new std::shared_ptr<ccl::kvs>(std::move(kvs));
    }
    if (!retired.empty()) {
      // Destroyed by a detached thread, not by the backend: leak rather than release
      // tensors off a Python thread.
      (void)new std::vector<Task>(std::move(retired));
    }
  }

  void retire(std::vector<Task>&& tasks) {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& task : tasks) {
      retired.push_back(std::move(task));
    }
  }

  // Marks the backend broken and takes the running work and everything queued out,
  // for the caller to fail (without holding `mutex`: future callbacks may call back
  // into the backend) and then retire.
  std::vector<Task> breakLocked(const std::string& why) {
    std::vector<Task> failed;
    if (broken.empty()) {
      broken = why;
      abandon = true;
    }
    if (running) {
      failed.push_back(Task{running, nullptr, Clock::now()});
      running.reset();
    }
    for (auto& task : queue) {
      failed.push_back(std::move(task));
    }
    queue.clear();
    cv.notify_all();
    return failed;
  }
};

void failAll(State& state, std::vector<Task>&& tasks, const std::string& why) {
  if (tasks.empty()) {
    return;
  }
  auto error = backendError(why);
  for (const auto& task : tasks) {
    task.work->complete(error);
  }
  state.retire(std::move(tasks));
}

// Posts one oneCCL call (under the process-wide lock) and waits for its event by
// testing it: with CCL_WORKER_OFFLOAD=0 the testing thread makes the progress. It spins
// for the size class's budget, then sleeps between tests (doubling up to the policy's
// maximum). Gives up when the watchdog has broken the backend. An event that has not
// completed is never destroyed: oneCCL's event destructor waits for the operation,
// which hangs (and crashed at process exit) when a peer has died. It is leaked instead.
template <typename Post>
void runCcl(State& state, Post&& post) {
  std::unique_ptr<ccl::event> event;
  {
    std::lock_guard<std::mutex> guard(g_ccl_call_mutex);
    state.inCcl = true;
    try {
      event = std::make_unique<ccl::event>(post());
    } catch (...) {
      state.inCcl = false;
      throw;
    }
    state.inCcl = false;
  }
  const auto start = Clock::now();
  const auto spinUntil = state.wait.spin
      ? Clock::time_point::max()
      : start + std::chrono::microseconds(state.history.spinBudgetUs(state.runningClass, state.wait));
  auto sleep = std::chrono::microseconds(state.wait.sleepMinUs);
  const auto sleepMax = std::chrono::microseconds(state.wait.sleepMaxUs);
  bool sleeping = false;
  Clock::time_point spinEnd = start;
  uint64_t polls = 0;
  uint64_t sleeps = 0;
  Clock::duration slept{};
  auto account = [&](Clock::time_point end) {
    g_stats.polls += polls;
    g_stats.sleeps += sleeps;
    g_stats.sleptNs += nanos(slept);
    g_stats.spinNs += nanos((sleeping ? spinEnd : end) - start);
    if (sleeping) {
      ++g_stats.waitedPastSpin;
    }
  };
  for (;;) {
    {
      std::lock_guard<std::mutex> guard(g_ccl_call_mutex);
      state.inCcl = true;
      bool done = event->test();
      state.inCcl = false;
      ++polls;
      if (done) {
        auto end = Clock::now();
        account(end);
        state.history.add(
            state.runningClass,
            std::chrono::duration_cast<std::chrono::microseconds>(end - start).count());
        return;
      }
    }
    if (state.abandon) {
      account(Clock::now());
      (void)event.release();
      throw std::runtime_error("abandoned after the process-group timeout");
    }
    if (!sleeping) {
      auto now = Clock::now();
      if (now < spinUntil) {
        std::this_thread::yield();
        continue;
      }
      sleeping = true;
      spinEnd = now;
    }
    auto before = Clock::now();
    std::this_thread::sleep_for(sleep);
    slept += Clock::now() - before;
    ++sleeps;
    sleep = std::min(sleep * 2, sleepMax);
  }
}

void workerLoop(std::shared_ptr<State> state) {
  // Sleeps between polls are 10 us and up: without this, Linux's default timer slack
  // (50 us) would stretch the short ones.
  (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(state->mutex);
      state->cv.wait(lock, [&] {
        return !state->queue.empty() || state->stop || !state->broken.empty();
      });
      if (!state->broken.empty() || state->queue.empty()) {
        return; // broken, or stopped with nothing left to run
      }
      task = std::move(state->queue.front());
      state->queue.pop_front();
      state->running = task.work;
      state->deadline = Clock::now() + task.work->timeout();
      state->cv.notify_all(); // the watchdog picks up the new deadline
    }
    auto started = Clock::now();
    state->runningClass = SizeHistory::sizeClass(task.bytes);
    std::exception_ptr error;
    try {
      task.run();
    } catch (const std::exception& e) {
      error = backendError(
          std::string("ccl ") + task.work->opName() + " failed: " + e.what());
    } catch (...) {
      error = backendError(std::string("ccl ") + task.work->opName() + " failed");
    }
    auto ran = Clock::now();
    if (state->debug) {
      auto ms = [](Clock::duration d) {
        return std::chrono::duration<double, std::milli>(d).count();
      };
      std::fprintf(
          stderr,
          "[study_ccl rank %d] %s #%llu: queued %.3f ms, ran %.3f ms%s\n",
          state->rank,
          task.work->opName().c_str(),
          static_cast<unsigned long long>(task.work->getSequencenumber()),
          ms(started - task.queued),
          ms(ran - started),
          error ? " (failed)" : "");
    }
    std::vector<Task> failed;
    std::string why;
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      if (state->running == task.work) {
        state->running.reset();
      }
      if (error && !state->broken.empty()) {
        // The watchdog gave up on this collective (and may not have completed it yet):
        // report its reason, not the abandoned poll.
        error = backendError(state->broken);
      } else if (error) {
        // A failed oneCCL call leaves the peers at an unknown point: stop here.
        why = "ccl " + task.work->opName() +
            " failed; the ccl process group is unusable after that";
        failed = state->breakLocked(why);
      }
    }
    if (!error) {
      // counted before the future is set, so that its waiter reads them
      ++g_stats.collectives;
      g_stats.handoffNs += nanos(started - task.queued);
      g_stats.cclNs += nanos(ran - started);
      g_stats.finishNs += nanos(Clock::now() - ran);
    }
    task.work->complete(error); // no-op if the watchdog already failed it
    failAll(*state, std::move(failed), why);
    std::vector<Task> done;
    done.push_back(std::move(task));
    state->retire(std::move(done));
    if (error) {
      return;
    }
  }
}

void watchdogLoop(std::shared_ptr<State> state) {
  std::unique_lock<std::mutex> lock(state->mutex);
  for (;;) {
    if (state->stop && state->queue.empty() && !state->running) {
      return;
    }
    if (!state->running || !state->broken.empty()) {
      if (!state->broken.empty() && state->stop) {
        return;
      }
      state->cv.wait(lock);
      continue;
    }
    if (Clock::now() < state->deadline) {
      state->cv.wait_until(lock, state->deadline);
      continue;
    }
    auto work = state->running;
    std::string why = "ccl " + work->opName() +
        " did not complete within the process-group timeout of " +
        secondsText(work->timeout()) +
        " (a peer rank may have died or stopped calling collectives); the ccl process "
        "group is unusable after a timeout";
    auto failed = state->breakLocked(why);
    lock.unlock();
    failAll(*state, std::move(failed), why);
    lock.lock();
  }
}

// ---------------------------------------------------------------------------------------
// The backend.

class StudyCCL : public c10d::Backend {
 public:
  StudyCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, Millis timeout)
      : Backend(rank, size), timeout_(timeout), state_(std::make_shared<State>()) {
    std::call_once(g_init_once, [] { ccl::init(); });
    state_->rank = rank;
    state_->size = size;
    const char* debug = std::getenv("STUDY_CCL_DEBUG");
    state_->debug = debug != nullptr && *debug != '\0' && std::string(debug) != "0";
    state_->wait = WaitPolicy::fromEnvironment();

    // Rendezvous: rank 0 creates the main KVS and publishes its address.
    ccl::kvs::address_type address{};
    if (rank == 0) {
      state_->kvs = ccl::create_main_kvs();
      address = state_->kvs->get_address();
      store->set(kKvsAddressKey, std::vector<uint8_t>(address.begin(), address.end()));
    } else {
      auto bytes = store->get(kKvsAddressKey);
      TORCH_CHECK(
          bytes.size() == address.size(),
          "ccl: the KVS address in the store has ",
          bytes.size(),
          " bytes, expected ",
          address.size(),
          " (rank 0 runs a different oneCCL build?)");
      std::copy(bytes.begin(), bytes.end(), address.begin());
      state_->kvs = ccl::create_kvs(address);
    }
    state_->comm =
        std::make_unique<ccl::communicator>(ccl::create_communicator(size, rank, state_->kvs));
    TORCH_CHECK(
        state_->comm->size() == size && state_->comm->rank() == rank,
        "ccl: the communicator has rank ",
        state_->comm->rank(),
        " of ",
        state_->comm->size(),
        ", expected rank ",
        rank,
        " of ",
        size);

    worker_ = std::thread(workerLoop, state_);
    watchdog_ = std::thread(watchdogLoop, state_);
    init();
  }

  ~StudyCCL() override {
    bool stuck = false;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->stop = true;
      stuck = !state_->broken.empty() && state_->inCcl;
      state_->cv.notify_all();
    }
    // A worker stuck inside oneCCL after a timeout would never return: detach it (it
    // keeps the shared state alive). Never join a thread from itself either.
    finishThread(worker_, stuck);
    finishThread(watchdog_, false);
    std::vector<Task> finished;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      finished.swap(state_->retired);
    }
  }

  const std::string getBackendName() const override {
    return "ccl";
  }

  c10::intrusive_ptr<Options> getBackendOptions() override {
    return c10::make_intrusive<Options>("ccl", timeout_.load());
  }

  void setTimeout(Millis timeout) override {
    timeout_ = timeout;
  }

  uint64_t getSequenceNumberForGroup() override {
    return seq_.load();
  }

  c10d::ErrorType getError() override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->broken.empty() ? c10d::ErrorType::SUCCESS : c10d::ErrorType::TIMEOUT;
  }

  // --- allreduce ---------------------------------------------------------------------

  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts) override {
    const at::Tensor& tensor = singleTensor(tensors, "allreduce");
    auto dtype = reductionType(tensor, "allreduce");
    auto op = toReduction(opts.reduceOp, tensor, "allreduce");
    bool average = opts.reduceOp.op_ == c10d::ReduceOp::AVG;
    auto state = state_;
    int size = size_;
    return enqueue(c10d::OpType::ALLREDUCE, "allreduce", opts.timeout, {tensor}, [=] {
      allreduceOne(*state, tensor, dtype, op, average, size);
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts) override {
    std::vector<ccl::datatype> dtypes;
    std::vector<ccl::reduction> ops;
    for (const auto& t : tensors) {
      checkTensor(t, "allreduce_coalesced");
      dtypes.push_back(reductionType(t, "allreduce_coalesced"));
      ops.push_back(toReduction(opts.reduceOp, t, "allreduce_coalesced"));
    }
    bool average = opts.reduceOp.op_ == c10d::ReduceOp::AVG;
    auto state = state_;
    int size = size_;
    return enqueue(
        c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", opts.timeout, tensors, [=] {
          for (size_t i = 0; i < tensors.size(); ++i) {
            allreduceOne(*state, tensors[i], dtypes[i], ops[i], average, size);
          }
        });
  }

  // --- reduce --------------------------------------------------------------------------

  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts) override {
    const at::Tensor& tensor = singleTensor(tensors, "reduce");
    checkRoot(opts.rootRank, opts.rootTensor, "reduce");
    auto dtype = reductionType(tensor, "reduce");
    auto op = toReduction(opts.reduceOp, tensor, "reduce");
    int root = static_cast<int>(opts.rootRank);
    bool isRoot = rank_ == root;
    bool average = opts.reduceOp.op_ == c10d::ReduceOp::AVG && isRoot;
    auto state = state_;
    int size = size_;
    return enqueue(c10d::OpType::REDUCE, "reduce", opts.timeout, {tensor}, [=] {
      at::Tensor buffer = contiguousBuffer(tensor);
      size_t count = buffer.numel();
      if (count > 0) {
        // Only the root's tensor receives the result; the others keep their input.
        at::Tensor recv = isRoot ? buffer : at::empty_like(buffer);
        runCcl(*state, [&] {
          return ccl::reduce(
              buffer.data_ptr(), recv.data_ptr(), count, dtype, op, root, *state->comm);
        });
        if (average) {
          buffer.div_(size);
        }
      }
      copyBackIfNeeded(tensor, buffer);
    });
  }

  // --- broadcast -----------------------------------------------------------------------

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts) override {
    const at::Tensor& tensor = singleTensor(tensors, "broadcast");
    checkRoot(opts.rootRank, opts.rootTensor, "broadcast");
    auto state = state_;
    int root = static_cast<int>(opts.rootRank);
    return enqueue(c10d::OpType::BROADCAST, "broadcast", opts.timeout, {tensor}, [=] {
      at::Tensor buffer = contiguousBuffer(tensor);
      size_t bytes = buffer.nbytes();
      if (bytes > 0) {
        runCcl(*state, [&] {
          return ccl::broadcast(
              buffer.data_ptr(), bytes, ccl::datatype::uint8, root, *state->comm);
        });
      }
      copyBackIfNeeded(tensor, buffer);
    });
  }

  // --- allgather -----------------------------------------------------------------------

  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputTensors,
      std::vector<at::Tensor>& inputTensors,
      const c10d::AllgatherOptions& opts) override {
    const at::Tensor& input = singleTensor(inputTensors, "allgather");
    TORCH_CHECK_VALUE(
        outputTensors.size() == 1,
        "ccl allgather: expects one output list, got ",
        outputTensors.size());
    const auto& outputs = outputTensors[0];
    TORCH_CHECK_VALUE(
        static_cast<int>(outputs.size()) == size_,
        "ccl allgather: expects one output tensor per rank (",
        size_,
        "), got ",
        outputs.size());
    for (const auto& out : outputs) {
      checkTensor(out, "allgather");
      checkSameKind(out, input, "allgather", "output", "input");
      TORCH_CHECK_VALUE(
          out.numel() == input.numel(),
          "ccl allgather: every output tensor must have the input's ",
          input.numel(),
          " elements, got one with ",
          out.numel(),
          " (allgather of different sizes per rank is not supported)");
    }
    auto state = state_;
    int size = size_;
    return enqueue(c10d::OpType::ALLGATHER, "allgather", opts.timeout, outputs, [=] {
      at::Tensor send = contiguousBuffer(input);
      at::Tensor gathered = at::empty({size, input.numel()}, input.options());
      allgatherBytes(*state, send, gathered);
      for (int r = 0; r < size; ++r) {
        outputs[r].copy_(gathered[r].view(outputs[r].sizes()));
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& outputBuffer,
      at::Tensor& inputBuffer,
      const c10d::AllgatherOptions& opts) override {
    checkGatherBase(outputBuffer, inputBuffer, "_allgather_base");
    auto state = state_;
    at::Tensor output = outputBuffer;
    at::Tensor input = inputBuffer;
    return enqueue(
        c10d::OpType::_ALLGATHER_BASE, "_allgather_base", opts.timeout, {output}, [=] {
          allgatherFlat(*state, output, input);
        });
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    TORCH_CHECK_VALUE(
        outputs.size() == inputs.size(),
        "ccl allgather_into_tensor_coalesced: ",
        outputs.size(),
        " outputs for ",
        inputs.size(),
        " inputs");
    for (size_t i = 0; i < outputs.size(); ++i) {
      checkGatherBase(outputs[i], inputs[i], "allgather_into_tensor_coalesced");
    }
    auto state = state_;
    return enqueue(
        c10d::OpType::ALLGATHER_INTO_TENSOR_COALESCED,
        "allgather_into_tensor_coalesced",
        opts.timeout,
        outputs,
        [=] {
          for (size_t i = 0; i < outputs.size(); ++i) {
            allgatherFlat(*state, outputs[i], inputs[i]);
          }
        });
  }

  // --- reduce_scatter ------------------------------------------------------------------

  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputTensors,
      std::vector<std::vector<at::Tensor>>& inputTensors,
      const c10d::ReduceScatterOptions& opts) override {
    const at::Tensor& output = singleTensor(outputTensors, "reduce_scatter");
    TORCH_CHECK_VALUE(
        inputTensors.size() == 1,
        "ccl reduce_scatter: expects one input list, got ",
        inputTensors.size());
    const auto& inputs = inputTensors[0];
    TORCH_CHECK_VALUE(
        static_cast<int>(inputs.size()) == size_,
        "ccl reduce_scatter: expects one input tensor per rank (",
        size_,
        "), got ",
        inputs.size());
    for (const auto& in : inputs) {
      checkTensor(in, "reduce_scatter");
      checkSameKind(in, output, "reduce_scatter", "input", "output");
      TORCH_CHECK_VALUE(
          in.numel() == output.numel(),
          "ccl reduce_scatter: every input tensor must have the output's ",
          output.numel(),
          " elements, got one with ",
          in.numel());
    }
    auto dtype = reductionType(output, "reduce_scatter");
    auto op = toReduction(opts.reduceOp, output, "reduce_scatter");
    bool average = opts.reduceOp.op_ == c10d::ReduceOp::AVG;
    auto state = state_;
    int size = size_;
    return enqueue(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", opts.timeout, {output}, [=] {
      at::Tensor send = at::empty({size, output.numel()}, output.options());
      for (int r = 0; r < size; ++r) {
        send[r].copy_(inputs[r].reshape({-1}));
      }
      reduceScatterFlat(*state, output, send, dtype, op, average, size);
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& outputBuffer,
      at::Tensor& inputBuffer,
      const c10d::ReduceScatterOptions& opts) override {
    checkScatterBase(outputBuffer, inputBuffer, "_reduce_scatter_base");
    auto dtype = reductionType(outputBuffer, "_reduce_scatter_base");
    auto op = toReduction(opts.reduceOp, outputBuffer, "_reduce_scatter_base");
    bool average = opts.reduceOp.op_ == c10d::ReduceOp::AVG;
    auto state = state_;
    int size = size_;
    at::Tensor output = outputBuffer;
    at::Tensor input = inputBuffer;
    return enqueue(
        c10d::OpType::_REDUCE_SCATTER_BASE, "_reduce_scatter_base", opts.timeout, {output}, [=] {
          reduceScatterFlat(*state, output, contiguousBuffer(input), dtype, op, average, size);
        });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    TORCH_CHECK_VALUE(
        outputs.size() == inputs.size(),
        "ccl reduce_scatter_tensor_coalesced: ",
        outputs.size(),
        " outputs for ",
        inputs.size(),
        " inputs");
    std::vector<ccl::datatype> dtypes;
    std::vector<ccl::reduction> ops;
    for (size_t i = 0; i < outputs.size(); ++i) {
      checkScatterBase(outputs[i], inputs[i], "reduce_scatter_tensor_coalesced");
      dtypes.push_back(reductionType(outputs[i], "reduce_scatter_tensor_coalesced"));
      ops.push_back(toReduction(opts.reduceOp, outputs[i], "reduce_scatter_tensor_coalesced"));
    }
    bool average = opts.reduceOp.op_ == c10d::ReduceOp::AVG;
    auto state = state_;
    int size = size_;
    return enqueue(
        c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED,
        "reduce_scatter_tensor_coalesced",
        opts.timeout,
        outputs,
        [=] {
          for (size_t i = 0; i < outputs.size(); ++i) {
            reduceScatterFlat(
                *state, outputs[i], contiguousBuffer(inputs[i]), dtypes[i], ops[i], average, size);
          }
        });
  }

  // --- barrier -------------------------------------------------------------------------

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    auto state = state_;
    return enqueue(c10d::OpType::BARRIER, "barrier", opts.timeout, {}, [=] {
      runCcl(*state, [&] { return ccl::barrier(*state->comm); });
    });
  }

 private:
  static void finishThread(std::thread& thread, bool detach) {
    if (!thread.joinable()) {
      return;
    }
    if (detach || thread.get_id() == std::this_thread::get_id()) {
      thread.detach();
    } else {
      thread.join();
    }
  }

  void checkRoot(int64_t rootRank, int64_t rootTensor, const char* op) const {
    TORCH_CHECK_VALUE(
        rootRank >= 0 && rootRank < size_,
        "ccl ",
        op,
        ": root rank ",
        rootRank,
        " is not in [0, ",
        size_,
        ")");
    TORCH_CHECK_VALUE(rootTensor == 0, "ccl ", op, ": rootTensor must be 0");
  }

  static void checkSameKind(
      const at::Tensor& a,
      const at::Tensor& b,
      const char* op,
      const char* aName,
      const char* bName) {
    TORCH_CHECK_TYPE(
        a.scalar_type() == b.scalar_type(),
        "ccl ",
        op,
        ": ",
        aName,
        " dtype ",
        a.scalar_type(),
        " differs from ",
        bName,
        " dtype ",
        b.scalar_type());
  }

  void checkGatherBase(const at::Tensor& output, const at::Tensor& input, const char* op) {
    checkTensor(output, op);
    checkTensor(input, op);
    checkSameKind(output, input, op, "output", "input");
    TORCH_CHECK_VALUE(
        output.numel() == input.numel() * size_,
        "ccl ",
        op,
        ": the output must have world_size (",
        size_,
        ") times the input's ",
        input.numel(),
        " elements, got ",
        output.numel());
  }

  void checkScatterBase(const at::Tensor& output, const at::Tensor& input, const char* op) {
    checkTensor(output, op);
    checkTensor(input, op);
    checkSameKind(input, output, op, "input", "output");
    TORCH_CHECK_VALUE(
        input.numel() == output.numel() * size_,
        "ccl ",
        op,
        ": the input must have world_size (",
        size_,
        ") times the output's ",
        output.numel(),
        " elements, got ",
        input.numel());
  }

  static void allreduceOne(
      State& state,
      const at::Tensor& tensor,
      ccl::datatype dtype,
      ccl::reduction op,
      bool average,
      int size) {
    at::Tensor buffer = contiguousBuffer(tensor);
    size_t count = buffer.numel();
    if (count > 0) {
      void* data = buffer.data_ptr();
      runCcl(state, [&] { return ccl::allreduce(data, data, count, dtype, op, *state.comm); });
      if (average) {
        buffer.div_(size);
      }
    }
    copyBackIfNeeded(tensor, buffer);
  }

  // Gathers `send` (contiguous) from every rank into the contiguous `recv`, as bytes.
  static void allgatherBytes(State& state, const at::Tensor& send, const at::Tensor& recv) {
    size_t bytes = send.nbytes();
    if (bytes == 0) {
      return;
    }
    runCcl(state, [&] {
      return ccl::allgather(
          send.data_ptr(), recv.data_ptr(), bytes, ccl::datatype::uint8, *state.comm);
    });
  }

  static void allgatherFlat(State& state, const at::Tensor& output, const at::Tensor& input) {
    at::Tensor recv = contiguousBuffer(output);
    allgatherBytes(state, contiguousBuffer(input), recv);
    copyBackIfNeeded(output, recv);
  }

  // Reduce-scatters the contiguous `send` (world_size blocks of output.numel()).
  static void reduceScatterFlat(
      State& state,
      const at::Tensor& output,
      const at::Tensor& send,
      ccl::datatype dtype,
      ccl::reduction op,
      bool average,
      int size) {
    at::Tensor recv = contiguousBuffer(output);
    size_t count = recv.numel();
    if (count > 0) {
      runCcl(state, [&] {
        return ccl::reduce_scatter(
            send.data_ptr(), recv.data_ptr(), count, dtype, op, *state.comm);
      });
      if (average) {
        recv.div_(size);
      }
    }
    copyBackIfNeeded(output, recv);
  }

  // Queues a collective (after its arguments were checked) and returns its Work.
  c10::intrusive_ptr<c10d::Work> enqueue(
      c10d::OpType type,
      const char* name,
      Millis optsTimeout,
      std::vector<at::Tensor> outputs,
      std::function<void()> run) {
    Millis timeout = optsTimeout.count() > 0 ? optsTimeout : timeout_.load();
    auto work = c10::make_intrusive<CCLWork>(
        rank_, type, name, timeout, std::move(outputs), seq_.fetch_add(1) + 1);
    std::vector<Task> finished; // released here, on the calling (Python) thread
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      finished.swap(state_->retired);
      if (!state_->broken.empty()) {
        C10_THROW_ERROR(
            DistBackendError,
            std::string("ccl ") + name +
                ": the ccl process group is broken and cannot run collectives: " +
                state_->broken);
      }
      TORCH_CHECK(!state_->stop, "ccl ", name, ": the ccl process group was shut down");
      size_t bytes = 0;
      for (const auto& t : work->result()) {
        bytes += t.nbytes();
      }
      state_->queue.push_back(Task{work, std::move(run), Clock::now(), bytes});
      state_->cv.notify_all();
    }
    return work;
  }

  std::atomic<Millis> timeout_;
  std::atomic<uint64_t> seq_{0};
  std::shared_ptr<State> state_;
  std::thread worker_;
  std::thread watchdog_;
};

// The backend creator torch.distributed calls (register_backend, extended_api=False):
// creator(store, rank, world_size, timeout). `timeout` is a datetime.timedelta, a
// number of seconds, or None (torch's default of 30 minutes).
c10::intrusive_ptr<c10d::Backend> create(
    const c10::intrusive_ptr<c10d::Store>& store,
    int rank,
    int size,
    const py::object& timeout) {
  TORCH_CHECK_VALUE(
      size > 0 && rank >= 0 && rank < size, "ccl: invalid rank ", rank, " of ", size);
  Millis millis = kBackendDefaultTimeout;
  if (!timeout.is_none()) {
    double seconds = py::hasattr(timeout, "total_seconds")
        ? timeout.attr("total_seconds")().cast<double>()
        : timeout.cast<double>();
    TORCH_CHECK_VALUE(seconds > 0, "ccl: the timeout must be positive, got ", seconds, " s");
    millis = Millis(static_cast<int64_t>(seconds * 1000.0 + 0.5));
  }
  // Rendezvous blocks on the store and on the peers: let other Python threads run.
  py::gil_scoped_release no_gil;
  return c10::make_intrusive<StudyCCL>(store, rank, size, millis);
}

} // namespace study_ccl

PYBIND11_MODULE(study_ccl, m) {
  m.doc() =
      "The project's torch.distributed backend 'ccl' on Intel oneCCL (CPU); "
      "register it with workflow_scripts.distributed.ccl.register().";
  // The Store and Backend Python types this module converts from and to.
  py::module_::import("torch.distributed");
  m.def(
      "create",
      &study_ccl::create,
      py::arg("store"),
      py::arg("rank"),
      py::arg("size"),
      py::arg("timeout") = py::none(),
      "Create the ccl backend for one process group: creator(store, rank, size, timeout).");
  m.def(
      "stats",
      [] {
        auto& g = study_ccl::g_stats;
        py::dict d;
        d["collectives"] = g.collectives.load();
        d["handoff_ns"] = g.handoffNs.load();
        d["ccl_ns"] = g.cclNs.load();
        d["finish_ns"] = g.finishNs.load();
        d["spin_ns"] = g.spinNs.load();
        d["slept_ns"] = g.sleptNs.load();
        d["polls"] = g.polls.load();
        d["sleeps"] = g.sleeps.load();
        d["waited_past_spin"] = g.waitedPastSpin.load();
        return d;
      },
      "Counters of this process's ccl collectives (all groups): how many completed, the "
      "nanoseconds from queueing to the worker starting each (handoff), inside oneCCL "
      "(ccl, of which spin and slept), from oneCCL's completion to the future being set "
      "(finish), the event tests (polls) and sleeps, and how many waited past the spin.");
  m.def(
      "reset_stats", [] { study_ccl::g_stats.reset(); }, "Zero the counters of stats().");
  m.def(
      "wait_policy",
      [] {
        auto p = study_ccl::WaitPolicy::fromEnvironment();
        py::dict d;
        d["mode"] = p.spin ? "spin" : "backoff";
        d["spin_min_us"] = p.spinMinUs;
        d["spin_max_us"] = p.spinMaxUs;
        d["sleep_min_us"] = p.sleepMinUs;
        d["sleep_max_us"] = p.sleepMaxUs;
        return d;
      },
      "How a backend created now waits for oneCCL (from STUDY_CCL_WAIT, "
      "STUDY_CCL_SPIN_MIN_US, STUDY_CCL_SPIN_MAX_US, STUDY_CCL_SLEEP_MAX_US).");
  m.def(
      "library_version",
      [] { return std::string(ccl::get_library_version().full); },
      "The oneCCL library version string.");
}
