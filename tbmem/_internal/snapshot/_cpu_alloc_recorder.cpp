// The CPU recorder's hot path: a wrapper around torch's CPU allocator that records the allocations of
// the threads that are recording (size, address, time, category, interned Python stack) and the frees
// of what it recorded, with no Python call per operator. tbmem/_internal/snapshot/native.py compiles it on first
// use against the installed torch's headers and loads it; tbmem/_internal/snapshot/recorder.py drives it.
//
// Why an allocator and not a dispatch mode: a Python dispatch mode makes every operator (views and
// in-place ones too) round-trip through Python, 4-15 us each; the allocator sees only allocations.
//
// Threads: a recording is confined to the thread that started it (a thread-local list), like a
// dispatch mode. Frees are seen on any thread: every block the wrapper hands out carries its deleter,
// and the addresses of recorded blocks map to their recording.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>

#include <c10/core/CPUAllocator.h>
#include <c10/core/GradMode.h>

#include <atomic>
#include <cstdint>
#include <ctime>
#include <pthread.h>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

int64_t now_us() {
  // CLOCK_MONOTONIC: the clock of Python's time.perf_counter_ns on Linux, so that events recorded
  // here and markers recorded in Python share one axis
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

// One recording's events: plain C++ state, so that a free on any thread, with or without the GIL,
// can record itself.
struct Log {
  std::mutex mu;
  int64_t max_entries;
  int64_t dropped = 0;
  std::vector<int64_t> time_us, start, end, size, category, stack, addr;
  std::vector<int64_t> markers;                       // event index each marker precedes; -1 once dropped
  std::unordered_map<uintptr_t, int64_t> live;        // address -> allocation, recorded blocks alive
  std::unordered_map<int64_t, int64_t> handles;       // handle -> allocation, blocks added from Python
  int64_t next_handle = 0;

  explicit Log(int64_t max_entries_) : max_entries(max_entries_) {}

  int64_t event(int64_t t) {
    time_us.push_back(t);
    return static_cast<int64_t>(time_us.size()) - 1;
  }
  int64_t add(int64_t ev, int64_t nbytes, int64_t cat, int64_t stk, uintptr_t address) {
    start.push_back(ev);
    end.push_back(-1);
    size.push_back(nbytes);
    category.push_back(cat);
    stack.push_back(stk);
    addr.push_back(static_cast<int64_t>(address));
    return static_cast<int64_t>(size.size()) - 1;
  }
  void maybe_compact() {
    if (static_cast<int64_t>(time_us.size()) > max_entries) compact();
  }
  // Drop the oldest half of the events, as the Python recorder does (a ring buffer, amortised O(1)):
  // allocations freed before the cut go, those alive then become "before the trace".
  void compact() {
    const int64_t cut = static_cast<int64_t>(time_us.size()) - max_entries / 2;
    std::vector<int64_t> new_index(size.size(), -1);
    size_t w = 0;
    for (size_t i = 0; i < size.size(); ++i) {
      if (end[i] >= 0 && end[i] < cut) continue;
      new_index[i] = static_cast<int64_t>(w);
      start[w] = start[i] >= cut ? start[i] - cut : -1;
      end[w] = end[i] >= 0 ? end[i] - cut : -1;
      size[w] = size[i];
      category[w] = category[i];
      stack[w] = stack[i];
      addr[w] = addr[i];
      ++w;
    }
    for (auto* col : {&start, &end, &size, &category, &stack, &addr}) col->resize(w);
    time_us.erase(time_us.begin(), time_us.begin() + cut);
    for (auto& m : markers) m = m >= cut ? m - cut : -1;
    for (auto& kv : live) kv.second = new_index[kv.second];
    for (auto& kv : handles) kv.second = new_index[kv.second];
    dropped += cut;
  }
  void freed(uintptr_t address, int64_t t) {
    std::lock_guard<std::mutex> guard(mu);
    auto it = live.find(address);
    if (it == live.end()) return;
    end[it->second] = event(t);
    live.erase(it);
    maybe_compact();
  }
};

// Address of every recorded block still alive -> its recording. Read by the deleter on every free
// once anything was recorded (tracked_blocks says whether the lock is worth taking).
std::mutex g_blocks_mu;
std::unordered_map<uintptr_t, std::shared_ptr<Log>> g_blocks;
std::atomic<int64_t> g_tracked_blocks{0};
c10::DeleterFnPtr g_base_deleter = nullptr;

void tracked_delete(void* ptr) {
  if (g_tracked_blocks.load(std::memory_order_relaxed) != 0) {
    std::shared_ptr<Log> log;
    {
      std::lock_guard<std::mutex> guard(g_blocks_mu);
      auto it = g_blocks.find(reinterpret_cast<uintptr_t>(ptr));
      if (it != g_blocks.end()) {
        log = std::move(it->second);
        g_blocks.erase(it);
        g_tracked_blocks.fetch_sub(1, std::memory_order_relaxed);
      }
    }
    // recorded before the block goes back: once it has, another thread may be handed its address
    if (log) log->freed(reinterpret_cast<uintptr_t>(ptr), now_us());
  }
  g_base_deleter(ptr);
}

struct StackKeyHash {
  size_t operator()(const std::vector<uintptr_t>& key) const noexcept {
    size_t h = 1469598103934665603ULL;
    for (uintptr_t v : key) h = (h ^ v) * 1099511628211ULL;
    return h;
  }
};

// The Python object: one recording. Its Python-facing state (interned stacks, code objects) is only
// touched with the GIL held.
struct Recording {
  PyObject_HEAD
  std::shared_ptr<Log>* log;
  std::atomic<bool>* live;
  unsigned long owner;         // thread that started it (PyThread_get_thread_ident)
  bool on_thread;              // in its owner's thread-local list
  bool stacks;
  int stack_depth;
  int64_t cat_activation, cat_backward, cat_no_grad;
  PyObject* graph_task_id;     // torch._C._current_graph_task_id, or None
  PyObject* skip_suffixes;     // tuple of str: frames of files ending so are dispatch machinery
  PyObject* stack_frames;      // list: stack id -> list of (filename, line, name)
  std::unordered_map<PyObject*, bool>* code_skipped;  // code object (a reference held) -> skipped
  std::unordered_map<std::vector<uintptr_t>, int64_t, StackKeyHash>* stack_ids;
};

thread_local std::vector<Recording*> tl_recordings;
std::atomic<int64_t> g_on_threads{0};  // recordings in any thread's list

bool code_is_skipped(Recording* r, PyCodeObject* code) {
  auto it = r->code_skipped->find(reinterpret_cast<PyObject*>(code));
  if (it != r->code_skipped->end()) return it->second;
  bool skip = false;
  PyObject* filename = code->co_filename;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(r->skip_suffixes); ++i) {
    int ends = PyUnicode_Tailmatch(filename, PyTuple_GET_ITEM(r->skip_suffixes, i), 0, PY_SSIZE_T_MAX, 1);
    if (ends == 1) skip = true;
    if (ends < 0) PyErr_Clear();
  }
  Py_INCREF(code);  // kept, so that its address names it for as long as this recording lives
  (*r->code_skipped)[reinterpret_cast<PyObject*>(code)] = skip;
  return skip;
}

int frame_lasti(PyFrameObject* f) {
#if PY_VERSION_HEX >= 0x030B0000
  return PyFrame_GetLasti(f);
#else
  return f->f_lasti;
#endif
}

// The interned stack of the calling Python code (innermost first); -1 when there is none. GIL held.
int64_t intern_stack(Recording* r) {
  PyThreadState* ts = PyThreadState_Get();
  PyFrameObject* f = PyThreadState_GetFrame(ts);
  std::vector<uintptr_t> key;
  std::vector<PyFrameObject*> kept;
  int left = r->stack_depth;
  while (f != nullptr && left > 0) {
    PyCodeObject* code = PyFrame_GetCode(f);
    if (!code_is_skipped(r, code)) {
      key.push_back(reinterpret_cast<uintptr_t>(code));
      key.push_back(static_cast<uintptr_t>(frame_lasti(f)));
      Py_INCREF(f);
      kept.push_back(f);
      --left;
    }
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
  int64_t id = -1;
  if (!kept.empty()) {
    auto it = r->stack_ids->find(key);
    if (it != r->stack_ids->end()) {
      id = it->second;
    } else {  // a new chain: read its line numbers once
      PyObject* frames = PyList_New(0);
      for (PyFrameObject* kf : kept) {
        PyCodeObject* code = PyFrame_GetCode(kf);
        PyObject* item = Py_BuildValue("(OiO)", code->co_filename, PyFrame_GetLineNumber(kf), code->co_name);
        Py_DECREF(code);
        if (item == nullptr || PyList_Append(frames, item) < 0) PyErr_Clear();
        Py_XDECREF(item);
      }
      id = PyList_GET_SIZE(r->stack_frames);
      if (PyList_Append(r->stack_frames, frames) < 0) {
        PyErr_Clear();
        id = -1;
      } else {
        (*r->stack_ids)[key] = id;
      }
      Py_DECREF(frames);
    }
  }
  for (PyFrameObject* kf : kept) Py_DECREF(kf);
  return id;
}

int64_t category_now(Recording* r) {
  if (r->graph_task_id != Py_None) {
    PyObject* res = PyObject_CallNoArgs(r->graph_task_id);
    if (res == nullptr) {
      PyErr_Clear();
    } else {
      long long task = PyLong_AsLongLong(res);
      Py_DECREF(res);
      if (task == -1 && PyErr_Occurred()) PyErr_Clear();
      else if (task != -1) return r->cat_backward;
    }
  }
  return c10::GradMode::is_enabled() ? r->cat_activation : r->cat_no_grad;
}

bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

void record_allocation(void* ptr, size_t nbytes) {
  // a thread taking the GIL while the interpreter finalizes is ended on the spot
  if (!Py_IsInitialized() || finalizing()) return;
  const uintptr_t address = reinterpret_cast<uintptr_t>(ptr);
  PyGILState_STATE gil = PyGILState_Ensure();
  // a thread allocating with the GIL held may have an exception pending: it is not ours to see or clear
  PyObject *err_type, *err_value, *err_tb;
  PyErr_Fetch(&err_type, &err_value, &err_tb);
  // a copy, each held: what runs below with the GIL (a collection, a weak reference's callback)
  // may stop a recording of this thread, which edits the list and may drop the last reference
  std::vector<Recording*> recordings = tl_recordings;
  for (Recording* r : recordings) Py_INCREF(reinterpret_cast<PyObject*>(r));
  for (Recording* r : recordings) {
    if (!r->live->load(std::memory_order_relaxed)) continue;
    const int64_t cat = category_now(r);
    const int64_t stk = r->stacks ? intern_stack(r) : -1;
    std::shared_ptr<Log> log = *r->log;
    {
      std::lock_guard<std::mutex> guard(log->mu);
      const int64_t idx = log->add(log->event(now_us()), static_cast<int64_t>(nbytes), cat, stk, address);
      log->live[address] = idx;
      log->maybe_compact();
    }
    std::lock_guard<std::mutex> guard(g_blocks_mu);
    if (g_blocks.emplace(address, log).second) g_tracked_blocks.fetch_add(1, std::memory_order_relaxed);
    else g_blocks[address] = log;  // two recordings on one thread: the newest sees the free
  }
  for (Recording* r : recordings) Py_DECREF(reinterpret_cast<PyObject*>(r));
  PyErr_Restore(err_type, err_value, err_tb);
  PyGILState_Release(gil);
}

struct RecordingAllocator final : c10::Allocator {
  c10::Allocator* base;
  explicit RecordingAllocator(c10::Allocator* base_) : base(base_) {}

  c10::DataPtr allocate(size_t nbytes) override {
    c10::DataPtr dp = base->allocate(nbytes);
    void* ptr = dp.get();
    // only blocks in the default allocator's simple form (context = data, its deleter) are wrapped
    if (ptr == nullptr || dp.get_context() != ptr || dp.get_deleter() != g_base_deleter) return dp;
    c10::Device device = dp.device();
    dp.release_context();
    if (!tl_recordings.empty() && nbytes > 0) record_allocation(ptr, nbytes);
    return c10::DataPtr(ptr, ptr, &tracked_delete, device);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &tracked_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    base->copy_data(dest, src, count);
  }
};

RecordingAllocator* g_allocator = nullptr;

// --- Python API ------------------------------------------------------------------------------

PyObject* install(PyObject*, PyObject*) {
  if (g_allocator != nullptr) Py_RETURN_TRUE;
  c10::Allocator* base = c10::GetCPUAllocator();
  if (base == nullptr || base->raw_deleter() == nullptr) Py_RETURN_FALSE;
  g_base_deleter = base->raw_deleter();
  auto* mine = new RecordingAllocator(base);  // never freed: blocks it handed out name its deleter
  // SetCPUAllocator replaces only at a priority at least the current one, which is not exposed
  for (int priority = 0; priority <= 255 && c10::GetCPUAllocator() != mine; ++priority) {
    c10::SetCPUAllocator(mine, static_cast<uint8_t>(priority));
  }
  if (c10::GetCPUAllocator() != mine) {
    delete mine;
    Py_RETURN_FALSE;
  }
  g_allocator = mine;
  Py_RETURN_TRUE;
}

PyObject* installed(PyObject*, PyObject*) {
  return PyBool_FromLong(g_allocator != nullptr && c10::GetCPUAllocator() == g_allocator);
}

PyObject* thread_recordings(PyObject*, PyObject*) {
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  for (Recording* r : tl_recordings) {
    if (PyList_Append(out, r->live->load() ? Py_True : Py_False) < 0) {
      Py_DECREF(out);
      return nullptr;
    }
  }
  return out;
}

PyObject* recordings_on_threads(PyObject*, PyObject*) { return PyLong_FromLongLong(g_on_threads.load()); }

PyObject* tracked_blocks(PyObject*, PyObject*) {
  return PyLong_FromLongLong(g_tracked_blocks.load());
}

void detach_from_thread(Recording* r) {
  auto& list = tl_recordings;
  for (auto it = list.begin(); it != list.end(); ++it) {
    if (*it == r) {
      list.erase(it);
      r->on_thread = false;
      g_on_threads.fetch_sub(1);
      Py_DECREF(reinterpret_cast<PyObject*>(r));
      return;
    }
  }
}

int Recording_init(Recording* self, PyObject* args, PyObject* kwds) {
  static const char* kwlist[] = {"max_entries", "stacks", "stack_depth", "categories", "graph_task_id",
                                 "skip_suffixes", nullptr};
  long long max_entries = 100000;
  int stacks = 1, depth = 16;
  long long ca = 0, cb = 1, cn = 2;
  PyObject* gt = Py_None;
  PyObject* skip = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "|Lpi(LLL)OO!", const_cast<char**>(kwlist), &max_entries, &stacks,
                                   &depth, &ca, &cb, &cn, &gt, &PyTuple_Type, &skip)) {
    return -1;
  }
  if (max_entries < 2 || depth < 1) {
    PyErr_SetString(PyExc_ValueError, "max_entries must be at least 2 and stack_depth at least 1");
    return -1;
  }
  *self->log = std::make_shared<Log>(max_entries);
  self->stacks = stacks != 0;
  self->stack_depth = depth;
  self->cat_activation = ca;
  self->cat_backward = cb;
  self->cat_no_grad = cn;
  Py_INCREF(gt);
  Py_XSETREF(self->graph_task_id, gt);
  PyObject* suffixes = skip != nullptr ? skip : PyTuple_New(0);
  if (skip != nullptr) Py_INCREF(skip);
  Py_XSETREF(self->skip_suffixes, suffixes);
  return 0;
}

PyObject* Recording_new(PyTypeObject* type, PyObject*, PyObject*) {
  auto* self = reinterpret_cast<Recording*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->log = new std::shared_ptr<Log>(std::make_shared<Log>(100000));
  self->live = new std::atomic<bool>(false);
  self->owner = 0;
  self->on_thread = false;
  self->stacks = true;
  self->stack_depth = 16;
  Py_INCREF(Py_None);
  self->graph_task_id = Py_None;
  self->skip_suffixes = PyTuple_New(0);
  self->stack_frames = PyList_New(0);
  self->code_skipped = new std::unordered_map<PyObject*, bool>();
  self->stack_ids = new std::unordered_map<std::vector<uintptr_t>, int64_t, StackKeyHash>();
  return reinterpret_cast<PyObject*>(self);
}

void Recording_dealloc(Recording* self) {
  // on_thread holds a reference: a recording still in a thread's list is never deallocated
  for (auto& kv : *self->code_skipped) Py_DECREF(kv.first);
  delete self->code_skipped;
  delete self->stack_ids;
  delete self->log;  // the blocks it recorded keep the Log itself until they are freed
  delete self->live;
  Py_XDECREF(self->graph_task_id);
  Py_XDECREF(self->skip_suffixes);
  Py_XDECREF(self->stack_frames);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyObject* Recording_start(Recording* self, PyObject*) {
  if (g_allocator == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "the recording allocator is not installed");
    return nullptr;
  }
  if (self->on_thread) {
    PyErr_SetString(PyExc_RuntimeError, "this recording was started already");
    return nullptr;
  }
  self->owner = PyThread_get_thread_ident();
  Py_INCREF(self);
  tl_recordings.push_back(self);
  self->on_thread = true;
  g_on_threads.fetch_add(1);
  self->live->store(true);
  Py_RETURN_NONE;
}

PyObject* Recording_stop(Recording* self, PyObject*) {
  // another thread cannot reach the owner's list: it only switches recording off, and the owner
  // removes it at its next release() (or its thread's end)
  self->live->store(false);
  if (self->on_thread && self->owner == PyThread_get_thread_ident()) detach_from_thread(self);
  return PyBool_FromLong(!self->on_thread);
}

PyObject* release(PyObject*, PyObject* args) {
  // the stopped recordings still in this thread's list; with all=True every one (the thread ends)
  int all = 0;
  if (!PyArg_ParseTuple(args, "|p", &all)) return nullptr;
  long removed = 0;
  for (size_t i = tl_recordings.size(); i-- > 0;) {
    Recording* r = tl_recordings[i];
    if (all) r->live->store(false);
    if (!r->live->load()) {
      detach_from_thread(r);
      ++removed;
    }
  }
  return PyLong_FromLong(removed);
}

PyObject* Recording_mark(Recording* self, PyObject*) {
  Log& log = **self->log;
  std::lock_guard<std::mutex> guard(log.mu);
  log.markers.push_back(static_cast<int64_t>(log.time_us.size()));
  return PyLong_FromSsize_t(static_cast<Py_ssize_t>(log.markers.size()) - 1);
}

PyObject* Recording_add(Recording* self, PyObject* args) {
  // an allocation known from Python (a watched tensor): before the trace when preexisting
  long long nbytes, cat, address;
  int preexisting;
  if (!PyArg_ParseTuple(args, "LLLp", &nbytes, &cat, &address, &preexisting)) return nullptr;
  Log& log = **self->log;
  std::lock_guard<std::mutex> guard(log.mu);
  const int64_t ev = preexisting ? -1 : log.event(now_us());
  const int64_t idx = log.add(ev, nbytes, cat, -1, static_cast<uintptr_t>(address));
  const int64_t handle = log.next_handle++;
  log.handles[handle] = idx;
  log.maybe_compact();
  return PyLong_FromLongLong(handle);
}

PyObject* Recording_free_handle(Recording* self, PyObject* arg) {
  const long long handle = PyLong_AsLongLong(arg);
  if (handle == -1 && PyErr_Occurred()) return nullptr;
  Log& log = **self->log;
  std::lock_guard<std::mutex> guard(log.mu);
  auto it = log.handles.find(handle);
  if (it != log.handles.end()) {
    if (it->second >= 0) log.end[it->second] = log.event(now_us());
    log.handles.erase(it);
    log.maybe_compact();
  }
  Py_RETURN_NONE;
}

PyObject* vector_bytes(const std::vector<int64_t>& v) {
  return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(v.data()),
                                   static_cast<Py_ssize_t>(v.size() * sizeof(int64_t)));
}

PyObject* Recording_columns(Recording* self, PyObject*) {
  // a consistent copy: native-endian int64 columns (bytes), the markers' events, the dropped count,
  // and where each live block (by address) and each Python-added handle sits now
  Log& log = **self->log;
  std::lock_guard<std::mutex> guard(log.mu);
  std::vector<int64_t> live_addr, live_idx, handle_ids, handle_idx;
  for (const auto& kv : log.live) {
    live_addr.push_back(static_cast<int64_t>(kv.first));
    live_idx.push_back(kv.second);
  }
  for (const auto& kv : log.handles) {
    handle_ids.push_back(kv.first);
    handle_idx.push_back(kv.second);
  }
  return Py_BuildValue("{sNsNsNsNsNsNsNsNsNsNsNsNsL}", "time_us", vector_bytes(log.time_us), "start",
                       vector_bytes(log.start), "end", vector_bytes(log.end), "size", vector_bytes(log.size),
                       "category", vector_bytes(log.category), "stack", vector_bytes(log.stack), "addr",
                       vector_bytes(log.addr), "markers", vector_bytes(log.markers), "live_addr",
                       vector_bytes(live_addr), "live_index", vector_bytes(live_idx), "handle",
                       vector_bytes(handle_ids), "handle_index", vector_bytes(handle_idx), "dropped",
                       static_cast<long long>(log.dropped));
}

PyObject* Recording_stacks(Recording* self, PyObject*) {
  Py_INCREF(self->stack_frames);
  return self->stack_frames;
}

PyObject* Recording_live(Recording* self, void*) { return PyBool_FromLong(self->live->load()); }
PyObject* Recording_on_thread(Recording* self, void*) { return PyBool_FromLong(self->on_thread); }

PyMethodDef Recording_methods[] = {
    {"start", reinterpret_cast<PyCFunction>(Recording_start), METH_NOARGS,
     "Record the calling thread's CPU allocations."},
    {"stop", reinterpret_cast<PyCFunction>(Recording_stop), METH_NOARGS,
     "Stop recording; True once off its thread (from another thread: at the owner's release())."},
    {"mark", reinterpret_cast<PyCFunction>(Recording_mark), METH_NOARGS,
     "A marker before the next event; returns its number."},
    {"add", reinterpret_cast<PyCFunction>(Recording_add), METH_VARARGS,
     "add(nbytes, category, addr, preexisting) -> handle of an allocation known from Python."},
    {"free_handle", reinterpret_cast<PyCFunction>(Recording_free_handle), METH_O,
     "Record the free of an allocation added from Python."},
    {"columns", reinterpret_cast<PyCFunction>(Recording_columns), METH_NOARGS,
     "A copy of the events as int64 bytes columns."},
    {"stacks", reinterpret_cast<PyCFunction>(Recording_stacks), METH_NOARGS,
     "Stack id -> list of (filename, line, name), innermost first."},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef Recording_getset[] = {
    {"live", reinterpret_cast<getter>(Recording_live), nullptr, "Whether it records now.", nullptr},
    {"on_thread", reinterpret_cast<getter>(Recording_on_thread), nullptr,
     "Whether it is still in its thread's list.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject RecordingType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyMethodDef module_methods[] = {
    {"install", install, METH_NOARGS, "Wrap torch's CPU allocator (once per process); False if it cannot."},
    {"installed", installed, METH_NOARGS, "Whether the wrapper is torch's CPU allocator now."},
    {"thread_recordings", thread_recordings, METH_NOARGS,
     "Whether each recording in the calling thread's list records (False: stopped, not yet released)."},
    {"recordings_on_threads", recordings_on_threads, METH_NOARGS, "Recordings in any thread's list."},
    {"tracked_blocks", tracked_blocks, METH_NOARGS, "Recorded blocks not freed yet, all recordings."},
    {"release", release, METH_VARARGS,
     "release(all=False): remove the calling thread's stopped (all: every) recordings; returns how many."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_cpu_alloc_recorder", nullptr, -1, module_methods};

// A process forked while its thread records (DataLoader workers) would go on recording into its copy,
// which nothing reads: the child's copy of the forking thread's list is emptied (references leaked).
void forget_recordings_in_child() {
  for (Recording* r : tl_recordings) r->live->store(false);
  tl_recordings.clear();
  g_on_threads.store(0);
}

}  // namespace

PyMODINIT_FUNC PyInit__cpu_alloc_recorder() {
  RecordingType.tp_name = "_cpu_alloc_recorder.Recording";
  RecordingType.tp_basicsize = sizeof(Recording);
  RecordingType.tp_flags = Py_TPFLAGS_DEFAULT;
  RecordingType.tp_doc = "One recording of the calling thread's CPU allocations.";
  RecordingType.tp_new = Recording_new;
  RecordingType.tp_init = reinterpret_cast<initproc>(Recording_init);
  RecordingType.tp_dealloc = reinterpret_cast<destructor>(Recording_dealloc);
  RecordingType.tp_methods = Recording_methods;
  RecordingType.tp_getset = Recording_getset;
  if (PyType_Ready(&RecordingType) < 0) return nullptr;
  static bool at_fork_registered = false;
  if (!at_fork_registered) at_fork_registered = pthread_atfork(nullptr, nullptr, &forget_recordings_in_child) == 0;
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  Py_INCREF(&RecordingType);
  if (PyModule_AddObject(m, "Recording", reinterpret_cast<PyObject*>(&RecordingType)) < 0) {
    Py_DECREF(&RecordingType);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
