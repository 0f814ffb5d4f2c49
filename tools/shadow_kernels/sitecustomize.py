# Shadow run of fla 0.6.0 and causal-conv1d 1.7.0 on CPU: every Triton launch and the causal-conv1d CUDA
# entry points only zero the tensors they are given, so what runs is the packages' Python -- every torch
# allocation, every saved tensor -- on zeros. Memory only. Loaded by Python at start-up from PYTHONPATH
# (tools/shadow_kernels/setup.sh), so every rank of a DeepSpeed run gets it.
try:
    import sys, types
    import triton.runtime.jit as _jit
    import torch as _torch
    def _zero(*args, **kwargs):  # finite values (zeros) in every tensor the kernel sees, inputs too; no allocation
        for t in list(args) + list(kwargs.values()):
            if isinstance(t, _torch.Tensor) and t.is_floating_point():
                t.data.zero_()  # .data: autograd's version counters stay as they are
    _jit.KernelInterface.__getitem__ = lambda self, grid: _zero
    _cc = types.ModuleType("causal_conv1d_cuda")
    _cc.causal_conv1d_fwd = _cc.causal_conv1d_bwd = _cc.causal_conv1d_update = _zero
    sys.modules["causal_conv1d_cuda"] = _cc
    # As on an H100 (check_shared_mem('hopper') holds): the tilings that size dqkwg's per-block dg.
    import fla.utils as _fu
    _fu.check_shared_mem = lambda *a, **k: True
except ImportError:  # a Python without torch
    pass
