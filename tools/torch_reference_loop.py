#!/usr/bin/env python3
"""The same model as a plan's ModelSpec, trained by a plain PyTorch (Python)
loop, for zrun's throughput comparison: bf16 parameters (or, with --weights
fp32-master, fp32 parameters under torch.autocast), fused AdamW, SDPA or
eager attention, synthetic tokens. Prints one JSON line with tokens/s and
model FLOPs utilisation (PaLM's formula, as zrun's report).

  python3 tools/torch_reference_loop.py plan.json --steps 10 [--peak-flops 989.4e12]
"""
import argparse, json, math, sys, time

import torch
import torch.nn.functional as F


def flops_per_token(m, seq):
    h, a, kv, d, f = m["hidden_size"], m["num_attention_heads"], m["num_kv_heads"], m["head_dim"], m["ffn_hidden_size"]
    ffn_mats = 3 if m.get("ffn_type", "FFN_SWIGLU") == "FFN_SWIGLU" else 2
    per_layer = h * a * d * 2 + h * kv * d * 2 + ffn_mats * h * f
    weights = m["num_layers"] * per_layer + m.get("vocab_size", 0) * h
    return 6 * weights + 12 * m["num_layers"] * a * d * seq


class RMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm, eager as the Trainer runs it (and zrun): upcast, mean of squares, scale."""

    def __init__(self, h, eps=1e-6):
        super().__init__()
        self.weight, self.eps = torch.nn.Parameter(torch.ones(h)), eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Block(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        h, self.a, self.kv, self.d, f = m["hidden_size"], m["num_attention_heads"], m["num_kv_heads"], m["head_dim"], m["ffn_hidden_size"]
        self.swiglu = m.get("ffn_type", "FFN_SWIGLU") == "FFN_SWIGLU"
        self.eager = m.get("attention_impl") == "ATTENTION_EAGER"
        self.n1, self.n2 = RMSNorm(h), RMSNorm(h)
        self.q = torch.nn.Linear(h, self.a * self.d, bias=False)
        self.k = torch.nn.Linear(h, self.kv * self.d, bias=False)
        self.v = torch.nn.Linear(h, self.kv * self.d, bias=False)
        self.o = torch.nn.Linear(self.a * self.d, h, bias=False)
        self.up = torch.nn.Linear(h, f, bias=False)
        self.gate = torch.nn.Linear(h, f, bias=False) if self.swiglu else None
        self.down = torch.nn.Linear(f, h, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        n = self.n1(x)
        q = self.q(n).view(b, s, self.a, self.d).transpose(1, 2)
        k = self.k(n).view(b, s, self.kv, self.d).transpose(1, 2)
        v = self.v(n).view(b, s, self.kv, self.d).transpose(1, 2)
        rot = lambda t: torch.cat((-t[..., self.d // 2:], t[..., : self.d // 2]), -1)
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(att.transpose(1, 2).reshape(b, s, -1))
        n = self.n2(x)
        mlp = F.silu(self.gate(n)) * self.up(n) if self.swiglu else F.gelu(self.up(n), approximate="tanh")
        return x + self.down(mlp)


class Model(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.embed = torch.nn.Embedding(m["vocab_size"], m["hidden_size"])
        self.blocks = torch.nn.ModuleList(Block(m) for _ in range(m["num_layers"]))
        self.norm = RMSNorm(m["hidden_size"])
        self.head = torch.nn.Linear(m["hidden_size"], m["vocab_size"], bias=False)
        if m.get("tie_word_embeddings"):
            self.head.weight = self.embed.weight
        self.d = m["head_dim"]

    def forward(self, ids, targets):
        s = ids.shape[1]
        inv = 1.0 / (500000.0 ** (torch.arange(0, self.d, 2, device=ids.device).float() / self.d))
        ang = torch.outer(torch.arange(s, device=ids.device).float(), inv)
        emb = torch.cat((ang, ang), -1)
        x = self.embed(ids)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        logits = self.head(self.norm(x)).float()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("plan_json")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--peak-flops", type=float, default=0.0)
    p.add_argument("--weights", choices=("working", "fp32-master"), default="working",
                   help="working: parameters and AdamW in the plan's dtype; fp32-master: fp32 parameters and "
                        "AdamW with the forward and backward under torch.autocast in bf16 (PyTorch's mixed "
                        "precision, the numerics of DeepSpeed's bf16 mode)")
    p.add_argument("--profile", default="",
                   help="write a Kineto trace of step 2 here (as zrun --profile-dir does) and print its top kernels")
    args = p.parse_args()
    plan = json.load(open(args.plan_json))
    m, cfg = plan["model"], plan["config"]
    for key in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim", "ffn_hidden_size", "vocab_size"):
        m[key] = int(m.get(key, 0))
    b, s = int(cfg.get("micro_batch_size", 1)), int(cfg.get("seq_length", 2048))
    dev = "cuda" if torch.cuda.is_available() and plan.get("gpu", {}).get("key") != "cpu" else "cpu"
    dtype = torch.float32 if cfg.get("precision") == "PRECISION_FP32" else torch.bfloat16
    amp = args.weights == "fp32-master" and dtype != torch.float32
    torch.manual_seed(0)
    model = Model(m).to(device=dev, dtype=torch.float32 if amp else dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator().manual_seed(0)
    times = []
    for step in range(args.steps):
        ids = torch.randint(m["vocab_size"], (b, s + 1), generator=g).to(dev)
        profiler = None
        if args.profile and step == min(2, args.steps - 1):
            acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if dev == "cuda" else [])
            profiler = torch.profiler.profile(activities=acts)
            profiler.__enter__()
        start = time.perf_counter()
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=amp):
            loss = model(ids[:, :-1], ids[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        if profiler is not None:
            profiler.__exit__(None, None, None)
            profiler.export_chrome_trace(args.profile)
            sort = "cuda_time_total" if dev == "cuda" else "self_cpu_time_total"
            print(profiler.key_averages().table(sort_by=sort, row_limit=15, max_name_column_width=60), file=sys.stderr)
    step_s = sum(times[1:]) / max(1, len(times) - 1)  # the first step warms up
    tps = b * s / step_s
    fpt = flops_per_token(m, s)
    print(json.dumps({"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "step_seconds": step_s,
                      "each_step_seconds": times[1:],
                      "tokens_per_second": tps, "model_flops_per_token": fpt,
                      "mfu": tps * fpt / args.peak_flops if args.peak_flops > 0 and dev == "cuda" else 0.0,
                      "final_loss": loss.item()}))


if __name__ == "__main__":
    main()
