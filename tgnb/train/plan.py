"""What an express checkpoint of a trainer holds that does not change from one step to the next,
found once and checked cheaply (`tgnb.train.express`).

Between optimizer steps the weights and the optimizer's per-parameter state are updated in place:
the same tensor objects, the same memory. So which tensors a checkpoint holds, under which names,
and where their bytes are can be worked out at a step boundary and reused by a later snapshot,
instead of calling ``model.state_dict()`` and ``optimizer.state_dict()`` (which build new tensor
objects and, for the tiny model, took two thirds of a millisecond of the preemption's save).

A `Plan` is made only when it reproduces those two calls exactly: every state-dict entry resolves
to a parameter or buffer held by a module, with the same memory, and the optimizer's state dict is
rebuilt equal from its param groups and state. It is then trusted by a snapshot only while `valid`:
no module registered or replaced a parameter, buffer or submodule since (global registration
hooks), and each tensor is still the one held where it was, over the same memory and size. The
values are read at the snapshot, never cached. Anything else (CUDA tensors, state-dict hooks that
rename or convert, an optimizer wrapper that adds to its state dict) gets no plan, and the
snapshot takes the state dicts as before.
"""

from __future__ import annotations

import threading
from operator import attrgetter, is_
from typing import Any

from tgnb.train import fastsave

__all__ = ["Plan", "unwatch_modules", "watch_modules"]

_NBYTES = attrgetter("nbytes")

_EPOCH = 0  # bumped whenever a module of a planned model registers a parameter, buffer or module
_MODULES: set[int] = set()  # ids of the planned models' modules (each plan keeps its own alive)
_HOOKS: list[Any] = []
_USERS = 0
_LOCK = threading.Lock()


def _bump(module: Any, *_args: Any) -> None:
    global _EPOCH
    if id(module) in _MODULES:  # not, say, the ModuleList a forward slices out of its layers
        _EPOCH += 1


def _bump_buffer(module: Any, name: str, _value: Any) -> None:
    if name not in module._non_persistent_buffers_set:  # not a cache a forward keeps
        _bump(module)


def watch_modules() -> None:
    """Count registrations of parameters, buffers and submodules on any module (until
    `unwatch_modules` is called as many times)."""
    global _USERS
    import torch.nn.modules.module as nn_module

    with _LOCK:
        _USERS += 1
        if _USERS == 1:
            _HOOKS.extend(
                [
                    nn_module.register_module_parameter_registration_hook(_bump),
                    nn_module.register_module_buffer_registration_hook(_bump_buffer),
                    nn_module.register_module_module_registration_hook(_bump),
                ]
            )


def unwatch_modules() -> None:
    global _USERS
    with _LOCK:
        _USERS = max(0, _USERS - 1)
        if _USERS == 0:
            for handle in _HOOKS:
                handle.remove()
            _HOOKS.clear()
            _MODULES.clear()


class Plan:
    """The model's and optimizer's tensors of an express checkpoint (`tensors`: name -> the live
    tensor, in the checkpoint's order) and how to rebuild the optimizer's state dict without
    its tensors (`optimizer_rest`). `layout` is for the writer to keep its header in. Made by
    `make`, which returns None when the trainer's state is not one it can reproduce."""

    def __init__(self) -> None:
        self.tensors: dict[str, Any] = {}
        self.layout: Any = None
        # where each tensor is held (dict, key), the tensor, its address and size: checked by
        # `valid` in C loops (map), since a snapshot runs right after a step emptied the caches
        self._holders: list[dict[str, Any]] = []
        self._keys: list[str] = []
        self._held: list[Any] = []
        self._ptrs: list[int] = []
        self._sizes: list[int] = []
        self._modules: list[Any] = []
        self._epoch = _EPOCH
        self._optimizer: Any = None
        self._groups: list[tuple[list[Any], int, list[int]]] = []  # params, their count, indices
        # per optimizer state entry: its index, the entry (a dict), its tensors' keys; and for
        # `valid`, the parameter it is of and its number of keys
        self._entries: list[tuple[int, dict[str, Any], frozenset[str]]] = []
        self._entry_params: list[Any] = []
        self._entry_dicts: list[dict[str, Any]] = []
        self._entry_lens: list[int] = []
        self._n_state = 0

    @classmethod
    def make(cls, trainer: Any) -> Plan | None:
        """The plan of `trainer`'s state as it is now (at a step boundary), or None (also when
        the express checkpoint cannot hold it: `fastsave.check_supported`, checked here once)."""
        if not _HOOKS:
            return None  # nobody watches the modules: a plan could not be checked
        try:
            fastsave.check_supported(trainer)
        except fastsave.Unsupported:
            return None
        plan = cls()
        try:
            ok = plan._model(trainer.model) and plan._optim(trainer.optimizer)
        except (AttributeError, KeyError, TypeError, ValueError):
            return None
        return plan if ok else None

    def _track(self, name: str, holder: dict[str, Any], key: str, t: Any) -> bool:
        if not (t.is_cpu and t.is_contiguous()) or fastsave.dtype_code(t) is None:
            return False
        self.tensors[name] = t
        self._holders.append(holder)
        self._keys.append(key)
        self._held.append(t)
        self._ptrs.append(t.data_ptr())
        self._sizes.append(t.nbytes)
        return True

    def _model(self, model: Any) -> bool:
        self._modules = list(model.modules())
        with _LOCK:
            _MODULES.update(map(id, self._modules))
        for name, t in fastsave.model_tensors(model).items():
            prefix, _, leaf = name.rpartition(".")
            module = model.get_submodule(prefix)
            for holder in (module._parameters, module._buffers):
                live = holder.get(leaf)
                if live is not None:
                    break
            else:
                return False
            if live.data_ptr() != t.data_ptr() or live.shape != t.shape or live.dtype != t.dtype:
                return False
            if not self._track(f"model/{name}", holder, leaf, live):
                return False
        return True

    def _optim(self, wrapped: Any) -> bool:
        import torch

        opt = getattr(wrapped, "optimizer", wrapped)  # accelerate's AcceleratedOptimizer
        osd = wrapped.state_dict()
        index: dict[int, int] = {}
        by_index: list[Any] = []
        groups = []
        for group in opt.param_groups:
            params = group["params"]
            for p in params:
                if id(p) not in index:
                    index[id(p)] = len(by_index)
                    by_index.append(p)
            self._groups.append((params, len(params), [index[id(p)] for p in params]))
            groups.append({k: v for k, v in group.items() if k != "params"})
        if [{**g, "params": idx[2]} for g, idx in zip(groups, self._groups, strict=True)] != osd[
            "param_groups"
        ]:
            return False
        if len(osd) != 2 or len(osd["state"]) != len(opt.state):
            return False
        for i, saved in osd["state"].items():
            if not isinstance(i, int) or not 0 <= i < len(by_index):
                return False
            entry = opt.state.get(by_index[i])
            if entry is None or len(entry) != len(saved):
                return False
            keys = set()
            for key, value in saved.items():
                live = entry.get(key)
                if isinstance(value, torch.Tensor):
                    if not isinstance(live, torch.Tensor) or live.data_ptr() != value.data_ptr():
                        return False
                    if not self._track(f"optimizer/{i}/{key}", entry, key, live):
                        return False
                    keys.add(key)
                elif live is not value and live != value:
                    return False
            self._entries.append((i, entry, frozenset(keys)))
            self._entry_params.append(by_index[i])
            self._entry_dicts.append(entry)
            self._entry_lens.append(len(entry))
        self._optimizer = opt
        self._n_state = len(opt.state)
        return True

    def valid(self) -> bool:
        """Whether the plan still describes the trainer: call it where the state is a step
        boundary's (outside the update section)."""
        import torch

        if self._epoch != _EPOCH or not _HOOKS:
            return False
        held = self._held
        if not all(map(is_, map(dict.get, self._holders, self._keys), held)):
            return False
        if list(map(torch.Tensor.data_ptr, held)) != self._ptrs:
            return False
        if list(map(_NBYTES, held)) != self._sizes:
            return False
        opt = self._optimizer
        if len(opt.state) != self._n_state or len(opt.param_groups) != len(self._groups):
            return False
        for group, (params, n, _) in zip(opt.param_groups, self._groups, strict=True):
            if group["params"] is not params or len(params) != n:
                return False
        dicts = self._entry_dicts
        return (
            all(map(is_, map(opt.state.get, self._entry_params), dicts))
            and list(map(len, dicts)) == self._entry_lens
        )

    def optimizer_rest(self) -> dict[str, Any]:
        """The optimizer's state dict as it is now, without the tensors in `tensors`."""
        groups = []
        for group, (_, _, indices) in zip(self._optimizer.param_groups, self._groups, strict=True):
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = indices
            groups.append(packed)
        rest = {
            i: {k: v for k, v in entry.items() if k not in keys} for i, entry, keys in self._entries
        }
        return {"state": rest, "param_groups": groups}
