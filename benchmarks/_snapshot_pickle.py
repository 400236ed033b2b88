"""The synthetic torch snapshot pickle of ``benchmarks/bench_snapshot.py``, written opcode by opcode.

A 10M-entry dict would take 6 GB to build in Python, so :func:`write_torch_pickle` streams
protocol-4 opcodes, byte for byte what CPython's pickler writes for the same objects
(tests/snapshot/test_synthetic.py checks that): a training loop (:func:`simulate`) of forward,
backward and optimizer phases with realistic stacks, address reuse, segment events, memory
allocated before the trace and a final ``oom``.
"""

from __future__ import annotations

import random
import struct

__all__ = ["PickleWriter", "write_container", "write_torch_pickle", "simulate"]

PROTO, FRAME, STOP = b"\x80", b"\x95", b"."
MARK, EMPTY_DICT, EMPTY_LIST, MEMOIZE = b"(", b"}", b"]", b"\x94"
SETITEMS, SETITEM, APPENDS, APPEND = b"u", b"s", b"e", b"a"
BINGET, LONG_BINGET = b"h", b"j"
NEWTRUE, NEWFALSE, NONE = b"\x88", b"\x89", b"N"
TUPLE2 = b"\x86"
_FRAME_TARGET = 64 * 1024


class PickleWriter:
    """Writes protocol-4 pickle opcodes exactly as CPython's pickler would for the same object graph.

    Sharing is explicit: objects passed with the same ``key`` are one object (written once, then
    referenced from the memo), as the pickler does for one object reached twice.
    """

    def __init__(self, fh) -> None:
        self.fh = fh
        self.memo: dict = {}
        self.frame = bytearray()
        self.fh.write(PROTO + b"\x04")

    # framing: a frame ends after a complete object once it holds 64 KiB (CPython's rule)
    def boundary(self) -> None:
        if len(self.frame) >= _FRAME_TARGET:
            self.commit()

    def commit(self) -> None:
        if self.frame:
            self.fh.write(FRAME + struct.pack("<Q", len(self.frame)) + self.frame)
            self.frame = bytearray()

    def finish(self) -> None:
        self.frame += STOP
        self.commit()

    def _get(self, idx: int) -> None:
        self.frame += BINGET + bytes((idx,)) if idx < 256 else LONG_BINGET + struct.pack("<I", idx)

    def _memoize(self, key) -> None:
        self.frame += MEMOIZE
        self.memo[key if key is not None else object()] = len(self.memo)

    # CPython's save() checks for a frame boundary before writing any object, memo references included
    def ref(self, key) -> bool:
        """Write a memo reference if ``key`` was written before."""
        idx = self.memo.get(key)
        if idx is None:
            return False
        self.boundary()
        self._get(idx)
        return True

    def str(self, s: str, key=None) -> None:
        if key is None and len(s) <= 1 and s <= "\xff":
            key = ("s", s)  # CPython has one object per empty or one-character latin-1 string
        if key is not None and self.ref(key):
            return
        self.boundary()
        data = s.encode("utf-8", "surrogatepass")
        if len(data) < 256:
            self.frame += b"\x8c" + bytes((len(data),)) + data
        else:
            self.frame += b"X" + struct.pack("<I", len(data)) + data
        self._memoize(key)

    def int(self, v: int) -> None:
        self.boundary()
        if 0 <= v < 256:
            self.frame += b"K" + bytes((v,))
        elif 0 <= v < 65536:
            self.frame += b"M" + struct.pack("<H", v)
        elif -(2 ** 31) <= v < 2 ** 31:
            self.frame += b"J" + struct.pack("<i", v)
        else:
            n = (v.bit_length() >> 3) + 1
            data = v.to_bytes(n, "little", signed=True)
            if v < 0 and n > 1 and data[-1] == 0xFF and (data[-2] & 0x80):
                data = data[:-1]
            self.frame += b"\x8a" + bytes((len(data),)) + data

    def bool(self, v: bool) -> None:
        self.boundary()
        self.frame += NEWTRUE if v else NEWFALSE

    def tuple2(self, a: int, b: int) -> None:
        self.boundary()
        self.int(a)
        self.int(b)
        self.frame += TUPLE2
        self._memoize(None)

    def begin_dict(self, key=None) -> None:
        self.boundary()
        self.frame += EMPTY_DICT
        self._memoize(key)

    def begin_list(self, key=None) -> None:
        self.boundary()
        self.frame += EMPTY_LIST
        self._memoize(key)

    def raw(self, b: bytes) -> None:
        self.frame += b

    def end(self) -> None:
        pass


def write_container(w: PickleWriter, items: list, write_item, setitems: bool) -> None:
    """Items as CPython's C pickler batches them: one item: item APPEND; more: MARK <=1000 items APPENDS..."""
    if not items:
        return
    if len(items) == 1:
        write_item(items[0])
        w.raw(SETITEM if setitems else APPEND)
        return
    for i in range(0, len(items), 1000):
        w.raw(MARK)
        for it in items[i:i + 1000]:
            write_item(it)
        w.raw(SETITEMS if setitems else APPENDS)


# ---------------------------------------------------------------------------------------------
TORCH = "/opt/conda/envs/train/lib/python3.11/site-packages/torch"
USER = "/home/user/project"
CPP_ALLOC = [("torch::unwind::unwind()", "??"), ("torch::CapturedTraceback::gather(bool, bool, bool)", "??"),
             ("torch::cuda::(anonymous namespace)::gather_with_cpp()", "memory_snapshot.cpp"),
             ("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)", "CUDACachingAllocator.cpp"),
             ("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, unsigned long, CUstream_st*)", ""),
             ("at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)", "??"),
             ("at::detail::empty_cuda(c10::ArrayRef<long>, c10::TensorOptions const&)", "??")]
CPP_ENGINE = [("torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&)", "??"),
              ("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)", "??"),
              ("torch::autograd::Engine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)", "??"),
              ("torch::autograd::python::PythonEngine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)", "??"),
              ("execute_native_thread_routine", "thread.o"), ("start_thread", "??"), ("__clone3", "??")]
CPP_OPS = ["mm", "addmm", "mul", "add", "gelu", "softmax", "layer_norm", "bmm", "div", "sum", "cat", "native_dropout"]


class _Frames:
    """The frame and stack pool of a synthetic training program (shared frame dicts, as torch's)."""

    def __init__(self, rng: random.Random, cpp: bool) -> None:
        self.rng, self.cpp = rng, cpp
        self.frames: list[tuple[str, str, int]] = []  # (name, filename, line)
        self.index: dict = {}
        files = [f"{USER}/models/{m}.py" for m in ("attention", "mlp", "block", "embedding", "transformer", "norm")]
        self.user_layers = [(f, rng.randint(20, 400), "forward") for f in files for _ in range(12)]
        self.torch_inner = [(f"{TORCH}/nn/functional.py", rng.randint(1000, 6000), n) for n in
                            ("linear", "gelu", "softmax", "dropout", "layer_norm", "scaled_dot_product_attention", "cross_entropy")
                            for _ in range(3)] + [(f"{TORCH}/nn/modules/linear.py", 125, "forward"),
                                                  (f"{TORCH}/nn/modules/normalization.py", 217, "forward"),
                                                  (f"{TORCH}/_tensor.py", 41, "wrapped")]
        self.call = [(f"{TORCH}/nn/modules/module.py", 1762, "_call_impl"),
                     (f"{TORCH}/nn/modules/module.py", 1751, "_wrapped_call_impl")]
        self.top = [(f"{USER}/train.py", l, "train_step") for l in (41, 44, 47, 52, 58)]
        self.main = [(f"{USER}/train.py", 120, "main"), (f"{USER}/train.py", 131, "<module>")]
        self.optim = [(f"{TORCH}/optim/adamw.py", l, "_single_tensor_adamw") for l in (401, 412, 430, 455, 470)]
        self.optim_rest = [(f"{TORCH}/optim/adamw.py", 243, "adamw"), (f"{TORCH}/optim/adamw.py", 221, "step"),
                           (f"{TORCH}/optim/optimizer.py", 493, "wrapper"), (f"{TORCH}/utils/_contextlib.py", 116, "decorate_context")]
        self.stacks: list[tuple[int, ...]] = []
        self.by_kind: dict[str, list[int]] = {"forward": [], "backward": [], "optimizer": [], "free": []}
        for _ in range(1500):
            self._add("forward", self._forward())
        for _ in range(300):
            self._add("optimizer", self._optimizer())
        for _ in range(300 if cpp else 1):
            self._add("backward", self._backward())
        for _ in range(200):
            self._add("free", self._free())

    def _id(self, frame) -> int:
        fid = self.index.get(frame)
        if fid is None:
            fid = self.index[frame] = len(self.frames)
            self.frames.append(frame)
        return fid

    def _py(self, frames) -> list:
        out = []
        for filename, line, name in frames:
            out.append((name, filename, line))
            if self.cpp:
                out.append(("_PyEval_EvalFrameDefault", "??", 0))
        return out

    def _cpp_head(self) -> list:
        if not self.cpp:
            return []
        op = self.rng.choice(CPP_OPS)
        return [(n, f, 0) for n, f in CPP_ALLOC] + [
            (f"at::(anonymous namespace)::wrapper_CUDA_{op}(at::Tensor const&, at::Tensor const&)", "RegisterCUDA.cpp", 0),
            (f"at::_ops::{op}::call(at::Tensor const&, at::Tensor const&)", "??", 0),
            (f"torch::autograd::THPVariable_{op}(_object*, _object*, _object*)", "python_variable_methods.cpp", 0)]

    def _add(self, kind: str, frames: list) -> None:
        self.by_kind[kind].append(len(self.stacks))
        self.stacks.append(tuple(self._id(f) for f in frames))

    def _forward(self) -> list:
        rng = self.rng
        py = [rng.choice(self.torch_inner)]
        for _ in range(rng.randint(1, 3)):
            py += [rng.choice(self.user_layers)] + self.call
        py += [rng.choice(self.top)] + self.main
        return self._cpp_head() + self._py(py)

    def _optimizer(self) -> list:
        py = [self.rng.choice(self.optim)] + self.optim_rest + [self.rng.choice(self.top)] + self.main
        return self._cpp_head() + self._py(py)

    def _backward(self) -> list:
        if not self.cpp:
            return []  # the autograd engine's threads have no Python frames
        op = self.rng.choice(CPP_OPS)
        node = [(f"torch::autograd::generated::{op.capitalize()}Backward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)", "Functions.cpp", 0)]
        return self._cpp_head() + node + [(n, f, 0) for n, f in CPP_ENGINE]

    def _free(self) -> list:
        py = [self.rng.choice(self.top)] + self.main
        return self._py(py)


def simulate(n_entries: int, *, seed: int = 0, cpp: bool = False, live_target: int = 3000,
             preexisting: int = 400):
    """Yield (action, addr, size, time_us, ctx) of a synthetic training run; ctx = (id, stack index)."""
    rng = random.Random(seed)
    pool = _Frames(random.Random(seed + 1), cpp)
    t = 1_757_000_000_000_000
    next_addr = 0x7F3A00000000
    live_addrs: list[int] = []
    live: dict[int, tuple[int, tuple]] = {}
    cache: dict[int, list[int]] = {}
    ctx_next = 0
    seg_end = next_addr
    for _ in range(preexisting):  # parameters, allocated before the trace
        size = 512 * rng.randint(1, 1 << 15)
        live[next_addr] = (size, (-1, -1))
        live_addrs.append(next_addr)
        next_addr += size
    seg_end = next_addr
    yield ("baseline", dict(live), pool)
    n = 0
    phase_len = 600
    while n < n_entries:
        t += rng.randint(1, 40)
        phase = ("forward", "backward", "optimizer")[(n // phase_len) % 3]
        free = live_addrs and (len(live_addrs) > live_target or rng.random() < (0.35 if phase == "forward" else 0.55))
        if free:
            i = rng.randrange(len(live_addrs))
            addr = live_addrs[i]
            live_addrs[i] = live_addrs[-1]
            live_addrs.pop()
            size, _ctx = live.pop(addr)
            kind = "backward" if phase == "backward" else "free"
            ctx = (ctx_next, rng.choice(pool.by_kind[kind]))
            ctx_next += 1
            yield ("free_requested", addr, size, t, ctx)
            yield ("free_completed", addr, size, t + rng.randint(0, 3), ctx)
            cache.setdefault(size, []).append(addr)
            n += 2
            continue
        size = 512 * int(2 ** rng.uniform(0, 17)) if rng.random() < 0.97 else 512 * rng.randint(1 << 16, 1 << 20)
        ctx = (ctx_next, rng.choice(pool.by_kind[phase]))
        ctx_next += 1
        reuse = cache.get(size)
        if reuse:
            addr = reuse.pop()
        else:
            addr = next_addr
            next_addr += size
            if next_addr > seg_end:
                seg = max(2 << 20, (next_addr - seg_end + (2 << 20) - 1) // (2 << 20) * (2 << 20))
                yield ("segment_alloc", seg_end, seg, t, ctx)
                seg_end += seg
                n += 1
        live[addr] = (size, ctx)
        live_addrs.append(addr)
        yield ("alloc", addr, size, t, ctx)
        n += 1
    yield ("end", live, t)


_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom")


def _pass1(n, seed, cpp):
    it = simulate(n, seed=seed, cpp=cpp)
    _, baseline, pool = next(it)
    end = None
    for ev in it:
        if ev[0] == "end":
            end = ev
    return baseline, pool, end[1], end[2]


def write_torch_pickle(fh, n_entries: int, *, devices: int = 1, other_entries: int = 2000, seed: int = 0,
                       cpp: bool = False, time_us: bool = True, compile_context: bool = True,
                       oom: bool = True) -> dict:
    """Stream a torch-format snapshot pickle of about ``n_entries`` trace entries on cuda:0
    (``other_entries`` on each further device). Returns facts about what was written."""
    w = PickleWriter(fh)
    sizes = [n_entries] + [other_entries] * (devices - 1)
    plans = [_pass1(n, seed + d, cpp) for d, n in enumerate(sizes)]
    facts = {"entries": [0] * devices}

    def key(name):
        w.str(name, key=("k", name))

    def frame(pool, fid):
        if w.ref(("f", id(pool), fid)):
            return
        name, filename, line = pool.frames[fid]
        w.begin_dict(("f", id(pool), fid))
        w.raw(MARK)
        key("name"); w.str(name)
        key("filename"); w.str(filename)
        key("line"); w.int(line)
        w.raw(SETITEMS)
        w.end()

    def frames(pool, d, ctx):
        if ctx[0] < 0:
            w.begin_list(None)
            w.end()
            return
        k = ("c", d, ctx[0])
        if w.ref(k):
            return
        w.begin_list(k)
        write_container(w, list(pool.stacks[ctx[1]]), lambda fid: frame(pool, fid), False)
        w.end()

    w.begin_dict(None)
    w.raw(MARK)
    key("segments")
    w.begin_list(None)
    segs = []
    for d, (baseline, pool, live, _t) in enumerate(plans):
        for addr in sorted(live):
            segs.append((d, addr, live[addr], pool))

    def segment(item):
        d, addr, (size, ctx), pool = item
        total = max(2 << 20, -(-size // (2 << 20)) * (2 << 20))
        w.begin_dict(None)
        w.raw(MARK)
        for k, v in (("device", d), ("address", addr), ("total_size", total), ("allocated_size", size),
                     ("active_size", size), ("requested_size", size), ("stream", 0)):
            key(k); w.int(v)
        key("segment_type"); w.str("large" if total > (1 << 20) else "small", key=("s", "large"))
        key("segment_pool_id"); w.tuple2(0, 0)
        key("is_expandable"); w.bool(False)
        key("frames"); frames(pool, d, (-1, -1))
        key("blocks")
        w.begin_list(None)
        blocks = [(addr, size, "active_allocated", ctx)]
        if total > size:
            blocks.append((addr + size, total - size, "inactive", (-1, -1)))

        def block(b):
            baddr, bsize, state, bctx = b
            w.begin_dict(None)
            w.raw(MARK)
            key("address"); w.int(baddr)
            key("size"); w.int(bsize)
            key("requested_size"); w.int(bsize if state != "inactive" else 0)
            key("state"); w.str(state, key=("s", state))
            key("frames"); frames(pool, d, bctx)
            w.raw(SETITEMS)
            w.end()
        write_container(w, blocks, block, False)
        w.end()
        w.raw(SETITEMS)
        w.end()
    write_container(w, segs, segment, False)
    w.end()
    key("device_traces")
    w.begin_list(None)
    traces = []
    for d, n in enumerate(sizes):
        traces.append((d, n))

    def trace(item):
        d, n = item
        pool = plans[d][1]
        w.begin_list(None)
        it = simulate(n, seed=seed + d, cpp=cpp)
        next(it)
        events = []
        last_t = [0]

        def gen():
            for ev in it:
                if ev[0] == "end":
                    last_t[0] = ev[2]
                    break
                yield ev
            if oom and d == 0:
                yield ("oom", 3 << 20, 80 << 30, last_t[0] + 5, (10 ** 12, pool.by_kind["forward"][0]))

        def event(ev):
            action, addr, size, t, ctx = ev
            facts["entries"][d] += 1
            w.begin_dict(None)
            w.raw(MARK)
            key("action"); w.str(action, key=("s", action))
            key("device_free" if action == "oom" else "addr"); w.int(addr)
            key("size"); w.int(size)
            key("stream"); w.int(0)
            if time_us:
                key("time_us"); w.int(t)
            if compile_context:
                key("compile_context"); w.str("N/A")
            key("frames"); frames(pool, d, ctx)
            w.raw(SETITEMS)
            w.end()
        _write_stream(w, gen(), event)
        w.end()
    write_container(w, traces, trace, False)
    w.end()
    key("allocator_settings")
    w.begin_dict(None)
    w.raw(MARK)
    key("PYTORCH_CUDA_ALLOC_CONF"); w.str("")
    key("max_split_size"); w.int(-1)
    key("expandable_segments"); w.bool(False)
    w.raw(SETITEMS)
    w.end()
    key("external_annotations")
    w.begin_list(None)
    w.end()
    w.raw(SETITEMS)
    w.end()
    w.finish()
    return facts


def _write_stream(w, items, write_item):
    """write_container for an iterator of unknown length (C pickler batching, one item -> APPEND)."""
    first = next(items, None)
    if first is None:
        return
    second = next(items, None)
    if second is None:
        write_item(first)
        w.raw(APPEND)
        return
    pending = [first, second]
    done = False
    while not done:
        w.raw(MARK)
        count = 0
        for it in pending:
            write_item(it)
            count += 1
        pending = []
        for it in items:
            write_item(it)
            count += 1
            if count == 1000:
                break
        else:
            done = True
        w.raw(APPENDS)
        if not done:
            nxt = next(items, None)
            if nxt is None:
                done = True
            else:
                pending = [nxt]
