"""Training steps of a decoder in PyTorch eager, for bench/llama/vs_pytorch.sh.

Two implementations of each architecture:
  --family llama (RMSNorm, rotary q/k in the half-rotation convention, grouped-query attention,
                  SwiGLU MLP, untied head, no biases, no dropout)
  --family gpt2  (learned positions, LayerNorm, fused q/k/v with biases, GELU (tanh) MLP of 4C,
                  head tied to the token embedding, no dropout)
  hf     Hugging Face transformers' LlamaForCausalLM / GPT2LMHeadModel (attn_implementation
         "sdpa").
  plain  a short module written here that calls torch.nn.functional.scaled_dot_product_attention.
Random tokens, AdamW, fp32 (or, with --precision bf16, torch.autocast to bf16 on the CPU: the
GEMMs in bf16 with fp32 accumulation, the parameters, gradients and optimizer state fp32, as
tessera's --precision bf16), the global gradient norm clipped to 1.0 as tessera train does by
default (--grad-clip 1.0): the same step's work on both sides. Prints one JSON line: the median step time and tokens/s of the steps
after the warm-up ones. Needs torch (and transformers for hf), e.g. a venv with
`pip install torch transformers`; nothing in tessera's build or tests needs them.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Block(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        self.heads, self.kv, self.hd = a.heads, a.kv_heads, a.dim // a.heads
        self.n1, self.n2 = RMSNorm(a.dim, 1e-5), RMSNorm(a.dim, 1e-5)
        self.q = torch.nn.Linear(a.dim, a.heads * self.hd, bias=False)
        self.k = torch.nn.Linear(a.dim, a.kv_heads * self.hd, bias=False)
        self.v = torch.nn.Linear(a.dim, a.kv_heads * self.hd, bias=False)
        self.o = torch.nn.Linear(a.heads * self.hd, a.dim, bias=False)
        self.gate = torch.nn.Linear(a.dim, a.ffn, bias=False)
        self.up = torch.nn.Linear(a.dim, a.ffn, bias=False)
        self.down = torch.nn.Linear(a.ffn, a.dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.n1(x)
        q = self.q(h).view(B, T, self.heads, self.hd).transpose(1, 2)
        k = self.k(h).view(B, T, self.kv, self.hd).transpose(1, 2)
        v = self.v(h).view(B, T, self.kv, self.hd).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Gpt2Block(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        self.heads = a.heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(a.dim), torch.nn.LayerNorm(a.dim)
        self.qkv = torch.nn.Linear(a.dim, 3 * a.dim)
        self.proj = torch.nn.Linear(a.dim, a.dim)
        self.fc = torch.nn.Linear(a.dim, 4 * a.dim)
        self.fc_proj = torch.nn.Linear(4 * a.dim, a.dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class PlainGpt2(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        self.wte = torch.nn.Embedding(a.vocab, a.dim)
        self.wpe = torch.nn.Embedding(a.seq, a.dim)
        self.blocks = torch.nn.ModuleList(Gpt2Block(a) for _ in range(a.layers))
        self.ln_f = torch.nn.LayerNorm(a.dim)
        torch.nn.init.normal_(self.wte.weight, std=0.02)
        torch.nn.init.normal_(self.wpe.weight, std=0.01)

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.t()


class PlainLlama(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed = torch.nn.Embedding(a.vocab, a.dim)
        self.blocks = torch.nn.ModuleList(Block(a) for _ in range(a.layers))
        self.norm = RMSNorm(a.dim, 1e-5)
        self.head = torch.nn.Linear(a.dim, a.vocab, bias=False)
        hd = a.dim // a.heads
        inv = 1.0 / (a.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.outer(torch.arange(a.seq, dtype=torch.float64), inv)  # [T, hd / 2]
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        T = tokens.shape[1]
        for b in self.blocks:
            x = b(x, self.cos[:T], self.sin[:T])
        return self.head(self.norm(x))


def build(a):
    if a.impl == "plain":
        return PlainLlama(a) if a.family == "llama" else PlainGpt2(a)
    if a.family == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(vocab_size=a.vocab, n_positions=a.seq, n_embd=a.dim, n_layer=a.layers,
                         n_head=a.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         use_cache=False, bos_token_id=None, eos_token_id=None)
        return GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa")
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.dim, intermediate_size=a.ffn,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, max_position_embeddings=a.seq,
                      rms_norm_eps=1e-5, rope_theta=a.rope_theta, tie_word_embeddings=False,
                      attention_dropout=0.0, use_cache=False)
    return LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--impl", choices=["hf", "plain"], required=True)
    p.add_argument("--family", choices=["llama", "gpt2"], default="llama")
    p.add_argument("--threads", type=int, default=1)
    for k, v in dict(layers=12, dim=768, heads=12, kv_heads=4, ffn=2048, vocab=16384, seq=256,
                     batch=4, steps=8, warmup=2).items():
        p.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    p.add_argument("--rope-theta", type=float, default=500000.0)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = build(a).train()
    n = sum(t.numel() for t in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1))
    x, y = tokens[:, :-1], tokens[:, 1:]
    times, losses = [], []
    for step in range(a.steps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            out = model(x)
            logits = out if a.impl == "plain" else out.logits
        loss = F.cross_entropy(logits.float().reshape(-1, a.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    med = statistics.median(times[a.warmup:])
    print(json.dumps({"family": a.family, "impl": a.impl, "precision": a.precision,
                      "threads": a.threads, "params": n,
                      "step_ms": round(med * 1e3, 1),
                      "tokens_per_s": round(a.batch * a.seq / med), "loss": round(losses[-1], 4),
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
