"""Names users recognise: the wrappers' path parts (torch.compile, DDP, peft) taken out of tensor names and the
by-module breakdown; its depth; parameters no watched model names named after the module holding them."""

from __future__ import annotations

import gc

import pytest
import torch

from tbmem._internal.census import take_census
from tbmem._internal.census.names import unwrapped, wrapper_prefix


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16))
        self.head = torch.nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def _named(census, category: str) -> set[str]:
    return {r.name for r in census.records if r.category == category}


def _check(wrapped: torch.nn.Module, inner: torch.nn.Module) -> None:
    gc.collect()
    census = take_census(models=[wrapped])
    assert _named(census, "parameters") == {f"model.{n}" for n, _ in inner.named_parameters()}
    assert _named(census, "buffers") == {f"model.{n}" for n, _ in inner.named_buffers()}
    assert set(census.by_module) == {"model.encoder", "model.head"}


def test_torch_compile_names():
    net = _Net()
    compiled = torch.compile(net, backend="eager")  # the OptimizedModule torch.compile makes, no compiler run
    assert type(compiled).__name__ == "OptimizedModule" and wrapper_prefix(compiled) == "_orig_mod."
    _check(compiled, net)


def test_ddp_names(gloo_world_of_one):
    net = _Net()
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    assert wrapper_prefix(ddp) == "module."
    _check(ddp, net)


def test_ddp_around_compile_names(gloo_world_of_one):
    net = _Net()
    ddp = torch.nn.parallel.DistributedDataParallel(torch.compile(net, backend="eager"))
    assert wrapper_prefix(ddp) == "module._orig_mod."
    _check(ddp, net)


def test_a_submodule_named_module_is_kept():
    net = torch.nn.Module()
    net.module = torch.nn.Linear(2, 2)  # not a wrapper: the user's own name
    gc.collect()
    assert _named(take_census(models=[net]), "parameters") == {"model.module.weight", "model.module.bias"}
    assert unwrapped("a._orig_mod.b.weight") == "a.b.weight"


def test_module_depth():
    net = _Net()
    gc.collect()
    census = take_census(models=[torch.compile(net, backend="eager")], module_depth=2)
    assert set(census.by_module) == {"model.encoder.0", "model.encoder.1", "model.head"}


def test_the_environment_overrides_the_module_depth(monkeypatch, caplog):
    net = _Net()
    gc.collect()
    monkeypatch.setenv("TBMEM_MODULE_DEPTH", "2")
    assert set(take_census(models=[net]).by_module) == {"model.encoder.0", "model.encoder.1", "model.head"}
    monkeypatch.setenv("TBMEM_MODULE_DEPTH", "1")
    assert set(take_census(models=[net], module_depth=2).by_module) == {"model.encoder", "model.head"}
    monkeypatch.setenv("TBMEM_MODULE_DEPTH", "two")  # not a number: said once, the configured depth kept
    assert set(take_census(models=[net], module_depth=2).by_module) == {"model.encoder.0", "model.encoder.1",
                                                                         "model.head"}
    assert "TBMEM_MODULE_DEPTH='two'" in caplog.text


@pytest.mark.parametrize("depth", [1, 2])
def test_a_tensors_name_starts_with_its_module(depth):
    """Issue 42: the by-module breakdown said ``model.7`` where the tensor said ``7.weight``."""
    net = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(7)],
                              torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)))
    second = torch.nn.Linear(4, 1)
    second(net(torch.randn(3, 4))).sum().backward()
    gc.collect()
    census = take_census(models=[net, second], module_depth=depth)
    held = [r for r in census.records if r.category in ("parameters", "gradients", "buffers")]
    assert len(held) == 2 * (7 * 2 + 4 + 2) + 3  # each parameter and its gradient; BatchNorm's three buffers
    for r in held:
        assert r.module is not None and r.name.startswith(r.module + "."), (r.name, r.module)
    inner = "model.7" if depth == 1 else "model.7.1"
    assert {r.name for r in held if r.module == inner} >= {"model.7.1.weight", "model.7.1.weight.grad",
                                                          "model.7.1.running_mean"}
    assert {r.name for r in held if r.module == "model1"} == {"model1.weight", "model1.bias", "model1.weight.grad",
                                                              "model1.bias.grad"}


def test_parameters_of_a_model_nobody_watched_are_named_after_the_module_holding_them():
    watched = torch.nn.Linear(4, 4)
    teacher = _Net().requires_grad_(False)
    gc.collect()
    census = take_census(models=[watched])
    names = _named(census, "parameters")
    assert "teacher.encoder.0.weight" in names and "Parameter" not in names
    assert census.by_module["teacher.encoder"] == sum(
        p.numel() * 4 for p in teacher.encoder.parameters())


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
def test_peft_lora_names():
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    base = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=8, bos_token_id=0, eos_token_id=0)).to(torch.bfloat16)
    model = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["c_attn"], fan_in_fan_out=True))
    assert wrapper_prefix(model) == "base_model.model."
    gc.collect()
    census = take_census(models=[model])
    names = _named(census, "parameters")
    assert "model.transformer.h.0.attn.c_attn.base_layer.weight" in names
    assert "model.transformer.h.0.attn.c_attn.lora_A.default.weight" in names
    assert not any("base_model" in n for n in names)
    assert set(census.by_module) == {"model.transformer"}  # lm_head is tied to wte: counted there
