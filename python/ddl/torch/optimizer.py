"""DistributedOptimizer: each gradient's allreduce starts as soon as backward produces it."""

import contextlib
import warnings
from collections import defaultdict

import torch

from ddl.common.reductions import refuse_adasum
from ddl.torch import mpi_ops as ops
from ddl.torch.compression import Compression
from ddl.torch.process_sets import global_process_set


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1, op=ops.Average,
                 gradient_predivide_factor=1.0, groups=None, sparse_as_dense=False, process_set=global_process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self._ddl_distributed = True
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [(f"allreduce.noname.{i}.{j}", v) for i, group in enumerate(self.param_groups)
                                for j, v in enumerate(group["params"])]
        if any(not isinstance(p, tuple) for p in named_parameters):
            raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                             "usually produced by model.named_parameters()")
        names = [k for k, _ in named_parameters]
        duplicates = sorted({k for k in names if names.count(k) > 1})
        if duplicates:
            raise ValueError(f"parameter names in named_parameters must be unique; duplicates: {', '.join(duplicates)}")
        all_ids = {id(v) for group in self.param_groups for v in group["params"]}
        named_ids = {id(v) for _, v in named_parameters}
        if all_ids - named_ids:
            raise ValueError("named_parameters was given, but one or more model parameters were not named: pass "
                             "every parameter of the optimizer in named_parameters (or leave it None)")
        self._parameter_names = {v: k for k, v in sorted(named_parameters, key=lambda kv: kv[0])}
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for _, v in sorted(named_parameters, key=lambda kv: kv[0])}
        refuse_adasum(op)
        if op != ops.Average and gradient_predivide_factor != 1.0:
            raise ValueError("gradient_predivide_factor applies to op=Average only")
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        self._groups = self._resolve_groups(groups)
        self._group_of = {p: i for i, group in enumerate(self._groups or []) for p in group}
        self._group_ready = defaultdict(set)
        if self.process_set.included():
            self._register_hooks()

    def _resolve_groups(self, groups):
        if groups is None:
            return None
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        if isinstance(groups, int):
            if groups < 1:
                raise ValueError("groups must be a positive int or a list of lists of parameters")
            per = -(-len(params) // groups)
            return [params[i:i + per] for i in range(0, len(params), per)]
        if isinstance(groups, (list, tuple)) and all(isinstance(g, (list, tuple)) for g in groups):
            seen = set()
            for g in groups:
                for p in g:
                    if not isinstance(p, torch.Tensor) or id(p) in seen:
                        raise ValueError("groups must list each parameter tensor at most once")
                    seen.add(id(p))
            # As Horovod: a group keeps only what this optimizer updates with a gradient. A frozen
            # parameter in a group would get a zero gradient, which weight decay and momentum act on.
            updated = {id(p) for p in params}
            kept = [[p for p in g if id(p) in updated] for g in groups]
            return [g for g in kept if g]
        raise ValueError("groups must be an int or a list of lists of parameters")

    def load_state_dict(self, *args, **kwargs):
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        super(self.__class__, self).load_state_dict(*args, **kwargs)

    @staticmethod
    def find_duplicates(lst):
        seen, dups = set(), set()
        for el in lst:
            if el in seen:
                dups.add(el)
            seen.add(el)
        return dups

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _register_hooks(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
                    grad_acc.register_hook(self._make_hook(p))
                    self._grad_accs.append(grad_acc)

    def _allreduce_grad_async(self, p):
        if p.grad is None:
            # Not computed here, but another rank may have computed it (dynamic graphs): send zeros.
            p.grad = p.data.new(p.size()).zero_()
        name = self._parameter_names.get(p)
        tensor = p.grad
        if tensor.is_sparse:
            if self.sparse_as_dense:
                tensor = tensor.to_dense()
            else:
                return ops.sparse_allreduce_async(tensor, name=name, op=self.op, process_set=self.process_set), None
        compressed, ctx = self._compression.compress(tensor)
        prescale, postscale = self._scales()
        handle = ops.allreduce_async_(compressed, name=name, op=self.op, prescale_factor=prescale,
                                      postscale_factor=postscale, process_set=self.process_set)
        return handle, ctx

    def _scales(self):
        if self.op == ops.Average:
            # Average = sum / size: predividing by gradient_predivide_factor and multiplying back after.
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _grouped_allreduce_async(self, group):
        for p in group:
            if p.grad is None:
                p.grad = p.data.new(p.size()).zero_()
        pairs = [self._compression.compress(p.grad.to_dense() if p.grad.is_sparse else p.grad) for p in group]
        prescale, postscale = self._scales()
        name = "group." + ".".join(self._parameter_names[p] for p in group[:2]) + f".{len(group)}"
        handle = ops.grouped_allreduce_async_([t for t, _ in pairs], name=name, op=self.op, prescale_factor=prescale,
                                              postscale_factor=postscale, process_set=self.process_set)
        return handle, [c for _, c in pairs]

    def _make_hook(self, p):
        def hook(*ignore):
            if p in self._handles and self._handles[p][0] is not None and self._allreduce_delay[p] <= 0:
                raise AssertionError("Gradients were computed more than backward_passes_per_step times before call "
                                     "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
            assert not p.grad.requires_grad
            assert self._allreduce_delay[p] > 0
            handle, ctx = None, None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                if self._groups is None:
                    handle, ctx = self._allreduce_grad_async(p)
                elif p in self._group_of:
                    index = self._group_of[p]
                    ready = self._group_ready[index]
                    ready.add(p)
                    if len(ready) == len(self._groups[index]):
                        group = self._groups[index]
                        self._handles[tuple(group)] = self._grouped_allreduce_async(group)
                        ready.clear()
                        for q in group:
                            self._handles.pop(q, None)
                        return
                else:
                    handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def synchronize(self):
        """Waits for every gradient's allreduce (starting those backward did not produce)."""
        if not self.process_set.included():
            self._synchronized = True
            return
        completed = set()
        for key in self._handles:
            completed.update(key if isinstance(key, tuple) else (key,))
        if self._groups is not None:
            for index, group in enumerate(self._groups):
                if tuple(group) not in self._handles:
                    for q in group:
                        self._handles.pop(q, None)
                    self._handles[tuple(group)] = self._grouped_allreduce_async(group)
                    self._group_ready[index].clear()
                    completed.update(group)
        for p in sorted(self._requires_update - completed, key=lambda q: self._parameter_names.get(q, "")):
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in self._handles.items():
            if isinstance(p, tuple):
                outputs = ops.synchronize(handle)
                for gp, output, gctx in zip(p, outputs, ctx):
                    self._allreduce_delay[gp] = self.backward_passes_per_step
                    gp.grad.set_(self._compression.decompress(output, gctx))
            else:
                output = handle() if callable(handle) else ops.synchronize(handle)
                self._allreduce_delay[p] = self.backward_passes_per_step
                aggregated = output if output.is_sparse else self._compression.decompress(output, ctx)
                if p.grad.is_sparse:  # sparse grads have no set_(); sparse_as_dense turns them back
                    p.grad.zero_().add_(aggregated if aggregated.is_sparse else aggregated.to_sparse())
                else:
                    p.grad.set_(aggregated)
        self._handles.clear()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Lets step() skip synchronize(), after an explicit synchronize() (e.g. to clip gradients)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
                              "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in "
                              "your code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(). This is prohibited as it can cause "
                                 "a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none, backward_passes_per_step=1,
                         op=ops.Average, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=global_process_set):
    """Wraps a torch optimizer so that gradients are averaged (op) over the process set before each step.
    Each gradient's allreduce starts from a hook the moment backward produces it, overlapping
    communication with the rest of backward; libddl fuses the small ones."""
    if num_groups != 0:
        warnings.warn("num_groups is deprecated: use groups", DeprecationWarning)
        if groups is None:
            groups = num_groups
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, groups, sparse_as_dense, process_set)
