"""The synthetic training program of ``benchmarks/bench_snapshot.py``: its stacks (:class:`Frames`) and its
allocator events (:func:`simulate`), addresses from a model of the caching allocator.

Example:
    >>> events = list(simulate(50))
    >>> events[0][0], events[-1][0], sorted({e[0] for e in events[1:-1]})[:2]
    ('baseline', 'end', ['alloc', 'free_completed'])
"""

from __future__ import annotations

import random

from benchmarks._snapshot_alloc import CachingAllocator

__all__ = ["Frames", "simulate"]

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


class Frames:
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
             preexisting: int = 400, empty_cache_every: int = 200_000):
    """Yield (action, addr, size, time_us, ctx) of a synthetic training run; ctx = (id, stack index).

    Addresses come from a model of the caching allocator (:mod:`benchmarks._snapshot_alloc`):
    ``segment_alloc`` when no free block fits, ``segment_free`` for the empty segments at each
    ``torch.cuda.empty_cache()`` (every ``empty_cache_every`` entries). The last item is
    ``("end", live allocations, time, the model's final segments)``.
    """
    rng = random.Random(seed)
    pool = Frames(random.Random(seed + 1), cpp)
    t = 1_757_000_000_000_000
    model = CachingAllocator(0x7F3A00000000)
    live_addrs: list[int] = []
    live: dict[int, tuple[int, tuple]] = {}
    ctx_next = 0
    for _ in range(preexisting):  # parameters, allocated before the trace
        size = 512 * rng.randint(1, 1 << 15)
        _seg, addr = model.malloc(size, (-1, -1))
        live[addr] = (size, (-1, -1))
        live_addrs.append(addr)
    yield ("baseline", dict(live), pool)
    n = 0
    phase_len = 600
    next_empty = empty_cache_every
    while n < n_entries:
        t += rng.randint(1, 40)
        if n >= next_empty:
            next_empty += empty_cache_every
            ctx = (ctx_next, rng.choice(pool.by_kind["free"]))
            ctx_next += 1
            for addr, size in model.empty_cache():
                yield ("segment_free", addr, size, t, ctx)
                n += 1
            continue
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
            model.free(addr)
            n += 2
            continue
        size = 512 * int(2 ** rng.uniform(0, 17)) if rng.random() < 0.97 else 512 * rng.randint(1 << 16, 1 << 20)
        ctx = (ctx_next, rng.choice(pool.by_kind[phase]))
        ctx_next += 1
        seg, addr = model.malloc(size, ctx)
        if seg is not None:
            yield ("segment_alloc", seg[0], seg[1], t, ctx)
            n += 1
        live[addr] = (size, ctx)
        live_addrs.append(addr)
        yield ("alloc", addr, size, t, ctx)
        n += 1
    yield ("end", live, t, model.segments())
