"""FlashAttention's speed baselines: PyTorch's SDPA (its FlashAttention and cuDNN backends) and naive PyTorch
attention, forward alone and forward + backward through autograd, each called on a benchmark's inputs.
"""

from __future__ import annotations

import torch

from grader.exercises.flash_attention_reference import softmax_scale


def _sdpa(backend: str):
    def run(inputs: dict, backward: bool = False):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        which = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
        q, k, v = (inputs[n].detach().requires_grad_(backward) for n in ("q", "k", "v"))
        with sdpa_kernel(which):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=inputs["causal"], scale=inputs["scale"])
        if backward:
            o.backward(inputs["do"])
            return {"o": o, "dq": q.grad, "dk": k.grad, "dv": v.grad}  # named as the part's outputs
        return o

    return run


def _naive(backward: bool = False):
    """Naive PyTorch attention (S and P in HBM, softmax in fp32), a few heads at a time so the score
    matrices stay under 2 GiB: the same work and traffic per head as one big call, without the OOM."""

    def run(inputs: dict):
        q, k, v, do = (inputs[n].detach() for n in ("q", "k", "v", "do" if backward else "q"))
        n_q, n_k = q.shape[-2], k.shape[-2]
        q3, k3, v3, do3 = (t.reshape(-1, *t.shape[-2:]) for t in (q, k, v, do))
        chunk = max(1, 2**31 // (n_q * n_k * 4))
        mask = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).triu(1) if inputs["causal"] else None
        outs = []
        for i in range(0, q3.shape[0], chunk):
            qc, kc, vc = (t[i : i + chunk].requires_grad_(backward) for t in (q3, k3, v3))
            s = (qc @ kc.transpose(-1, -2)).float() * softmax_scale(inputs)
            if mask is not None:
                s = s.masked_fill(mask, float("-inf"))
            o = torch.softmax(s, dim=-1).to(q.dtype) @ vc
            if backward:
                o.backward(do3[i : i + chunk])
            outs.append(o.detach())
        return torch.cat(outs).view(q.shape)

    return run


FORWARD_BASELINES = {"sdpa-flash": _sdpa("flash"), "sdpa-cudnn": _sdpa("cudnn"), "torch": _naive()}
AUTOGRAD_BASELINES = {
    "sdpa-flash": lambda inp: _sdpa("flash")(inp, backward=True),
    "sdpa-cudnn": lambda inp: _sdpa("cudnn")(inp, backward=True),
    "torch": _naive(backward=True),
}
