#!/usr/bin/python3
"""PyTorch golden values for the built-in models and a layer graph (tests/unit/test_models_parity.c
reads them).

PyTorch 2.x from PyPI in a virtual environment (the CPU wheel index, when reachable, avoids the
CUDA packages; plain PyPI works too, it is only larger):
    python3 -m venv /tmp/venv-torch
    /tmp/venv-torch/bin/pip install torch numpy --index-url https://download.pytorch.org/whl/cpu \
        || /tmp/venv-torch/bin/pip install torch numpy
    /tmp/venv-torch/bin/python tests/gen_fixtures.py            # every fixture
    /tmp/venv-torch/bin/python tests/gen_fixtures.py graph      # only tests/fixtures/graph.bin
(Debian's python3-torch 1.13, /usr/bin/python3, is a fallback.) graph.bin was written with torch
2.15; mlp, cnn and gpt.bin with 1.13: 2.15 gives them the same parameters, x and y but results
that differ in the last bits (f64 max abs 1.3e-15, f32 7.2e-7), so they were kept. It writes
tests/fixtures/mlp.bin, cnn.bin, gpt.bin and graph.bin (a few KB to ~30 KB each; commit them, so
CI needs no Python). The output is deterministic: a second run gives
identical files (cmp). mlp, cnn and gpt draw in turn from one generator (so they are written
together); graph has its own, so regenerating it never changes the others.

The models are built in PyTorch with the layers mirror's models/models.c uses and the same
state_dict names and layouts:
    mlp  6-5-4-3 (fc1, fc2, fc3; ReLU between), batch 4
    cnn  input 1x8x8; conv1 1->2, conv2 2->3 (3x3, pad 1, ReLU, 2x2 max-pool each),
         flatten as torch.flatten(x, 1), fc1 12->5 (ReLU), fc2 5->4; batch 2
    gpt  nanoGPT without the "transformer." prefix: vocab 11, context 6, 2 layers, 2 heads,
         embd 8, dropout 0, pre-LayerNorm (eps 1e-5), causal attention (-inf mask, softmax),
         c_attn split into q, k, v in that order, GELU tanh form, MLP width 4C, output head tied
         to wte (so there is no lm_head entry); batch 2 sequences of 6 tokens
    graph  the layer graph GRAPH_YAML below (model.type graph), as the nn.Sequential it names:
         input 2x6x6, a conv stem with batch norm, a residual block with an identity shortcut, a
         stride-2 residual block with a 1x1-conv + batch-norm shortcut, global average pooling,
         flatten, linear; batch 3. The same YAML text is in the fixture (tensor "yaml", u8) and
         the C test builds its model from it.
and every loss is the mean cross-entropy (gpt: logits (B*T, vocab) against labels (B*T)).

Every parameter (biases, LayerNorm and BatchNorm weights too) is drawn from a normal distribution
under a fixed seed, in float64, then rounded to float32, so the float64 and the float32 runs see
exactly the same values. Inputs are rounded to float32 likewise; labels and token ids are int32.
The forward and backward run twice, in float64 and in float32.

File format (all little-endian):
    magic   6 bytes  "MRFX1\n"
    count   u32      number of tensors
    then `count` tensors, each:
        name_len u16, name (name_len bytes of ASCII, no terminator)
        dtype    u8   0 = f32, 1 = f64, 2 = i32, 3 = u8
        ndim     u8   0..8
        dims     ndim x i64
        data     prod(dims) elements of dtype, row-major
Tensors in mlp, cnn and gpt.bin:
    <param>               f32  every state_dict entry, e.g. "fc1.weight" [5, 6]
    x                     f32 (mlp, cnn) or i32 (gpt token ids [B, T])
    y                     i32  labels [B] (gpt: next tokens [B, T])
    f64/logits, f32/logits         [B, classes] (gpt: [B*T, vocab])
    f64/loss, f32/loss             [1]
    f64/<param>.grad, f32/<param>.grad   d loss / d param, in the run's dtype
Tensors in graph.bin (<buffer>: a batch norm's running_mean, running_var [C] or
num_batches_tracked [], the state_dict's buffers):
    yaml                  u8   the YAML text of the model (GRAPH_YAML)
    <param>               f32  every parameter (named_parameters), e.g. "stem.weight" [3, 2, 3, 3]
    buffers/<buffer>      f32  the running statistics both runs start from (random: mean ~
                               N(0, 0.3^2), var ~ 0.5 + U(0, 1), num_batches_tracked 7)
    x, y                  f32 [B, 2, 6, 6], i32 [B]
    then for <run> in f64, f32:
    <run>/train/logits, <run>/train/loss, <run>/train/<param>.grad   training mode (batch statistics)
    <run>/train/<buffer>  the buffer after that one training forward (running_var unbiased,
                          num_batches_tracked 8)
    <run>/eval/logits, <run>/eval/loss, <run>/eval/<param>.grad      evaluation mode (the
                          running statistics of buffers/<buffer>)
"""
import argparse
import math
import os
import struct
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F

SEED = 1234
DTYPE_CODE = {torch.float32: 0, torch.float64: 1, torch.int32: 2, torch.uint8: 3}


class MLP(nn.Module):
    def __init__(self, sizes):
        super().__init__()
        self.n = len(sizes) - 1
        for i in range(1, len(sizes)):
            setattr(self, f"fc{i}", nn.Linear(sizes[i - 1], sizes[i]))

    def forward(self, x):
        for i in range(1, self.n + 1):
            x = getattr(self, f"fc{i}")(x)
            if i < self.n:
                x = F.relu(x)
        return x


class CNN(nn.Module):
    def __init__(self, cin, h, w, ch1, ch2, hidden, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, ch1, 3, 1, 1)
        self.conv2 = nn.Conv2d(ch1, ch2, 3, 1, 1)
        self.fc1 = nn.Linear(ch2 * (h // 4) * (w // 4), hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2, 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2, 2)
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


class Attention(nn.Module):
    def __init__(self, C, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):
        B, T, C = x.shape
        H, D = self.heads, C // self.heads
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, H, D).transpose(1, 2)  # (B,H,T,D)
        k = k.view(B, T, H, D).transpose(1, 2)
        v = v.view(B, T, H, D).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLPBlock(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = nn.Linear(C, 4 * C)
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = Attention(C, heads)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = MLPBlock(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab, context, layers, heads, C):
        super().__init__()
        self.wte = nn.Embedding(vocab, C)
        self.wpe = nn.Embedding(context, C)
        self.h = nn.ModuleList([Block(C, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)

    def forward(self, idx):
        B, T = idx.shape
        pos = torch.arange(T)
        x = self.wte(idx) + self.wpe(pos)
        for b in self.h:
            x = b(x)
        x = self.ln_f(x)
        return x.view(B * T, -1) @ self.wte.weight.t()  # tied head: (B*T, vocab)


# The layer graph of the "graph" fixture (model.type graph, launch/config_model.c's syntax). Layer
# i of a sequence is named "i" unless it has a name; a residual's body and shortcut are
# Sequentials "body" and "shortcut" (models/layers.h); GraphNet below is the same nn.Sequential.
GRAPH_YAML = """\
model:
  type: graph
  input: [2, 6, 6]
  layers:
    - conv2d: {out: 3, kernel: 3, pad: 1}
      name: stem
    - batchnorm2d: {}
      name: stem_bn
    - relu
    - residual:
        body: [{conv2d: {out: 3, kernel: 3, pad: 1, bias: false}}, batchnorm2d, relu,
               {conv2d: {out: 3, kernel: 3, pad: 1, bias: false}}, {batchnorm2d: {momentum: 0.2, eps: 1.0e-3}}]
    - relu
    - residual:
        body: [{conv2d: {out: 4, kernel: 3, stride: 2, pad: 1, bias: false}}, batchnorm2d, relu,
               {conv2d: {out: 4, kernel: 3, pad: 1}}, batchnorm2d]
        shortcut: [{conv2d: {out: 4, kernel: 1, stride: 2, bias: false}}, batchnorm2d]
      name: stage2
    - relu
    - global_avgpool
    - flatten
    - linear: {out: 5}
      name: fc
"""


class Residual(nn.Module):
    """y = body(x) + shortcut(x); the identity when there is no shortcut (mirror's residual)."""

    def __init__(self, body, shortcut=None):
        super().__init__()
        self.body = nn.Sequential(*body)
        if shortcut is not None:
            self.shortcut = nn.Sequential(*shortcut)

    def forward(self, x):
        return self.body(x) + (self.shortcut(x) if hasattr(self, "shortcut") else x)


def GraphNet():
    """GRAPH_YAML as a torch module: input 2x6x6, 5 classes."""
    return nn.Sequential(OrderedDict([
        ("stem", nn.Conv2d(2, 3, 3, 1, 1)),
        ("stem_bn", nn.BatchNorm2d(3)),
        ("2", nn.ReLU()),
        ("3", Residual([nn.Conv2d(3, 3, 3, 1, 1, bias=False), nn.BatchNorm2d(3), nn.ReLU(),
                        nn.Conv2d(3, 3, 3, 1, 1, bias=False), nn.BatchNorm2d(3, eps=1e-3, momentum=0.2)])),
        ("4", nn.ReLU()),
        ("stage2", Residual([nn.Conv2d(3, 4, 3, 2, 1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                             nn.Conv2d(4, 4, 3, 1, 1), nn.BatchNorm2d(4)],
                            [nn.Conv2d(3, 4, 1, 2, 0, bias=False), nn.BatchNorm2d(4)])),
        ("6", nn.ReLU()),
        ("7", nn.AdaptiveAvgPool2d(1)),
        ("8", nn.Flatten(1)),
        ("fc", nn.Linear(4, 5)),
    ]))


def randomize(model, gen):
    """Weights and embeddings ~ N(0, 1/fan_in) (fan_in = numel / shape[0]), biases ~ N(0, 0.3^2),
    LayerNorm and BatchNorm weights ~ 1 + N(0, 0.3^2), drawn in f64 and rounded to f32
    (non-trivial values everywhere, logits of order 1); returns {name: f32 tensor} in state_dict
    order, parameters only (the buffers are drawn by graph_fixture)."""
    out = {}
    buffers = dict(model.named_buffers())
    bn = {f"{m}.weight" for m, mod in model.named_modules() if isinstance(mod, nn.modules.batchnorm._BatchNorm)}
    for name, p in model.state_dict().items():
        if name in buffers:
            continue
        z = torch.randn(p.shape, generator=gen, dtype=torch.float64)
        if p.dim() >= 2:
            v = z / math.sqrt(p.numel() // p.shape[0])
        elif (".ln_" in "." + name and name.endswith(".weight")) or name in bn:
            v = 1.0 + 0.3 * z
        else:
            v = 0.3 * z
        out[name] = v.to(torch.float32)
    return out


def run(model, params, x, y, dtype):
    """Forward and backward in dtype; returns (logits, loss, {name: grad})."""
    m = model.to(dtype)
    m.load_state_dict({k: v.to(dtype) for k, v in params.items()})
    m.zero_grad()
    xin = x.to(dtype) if x.is_floating_point() else x.long()
    logits = m(xin)
    loss = F.cross_entropy(logits, y.reshape(-1).long())
    loss.backward()
    named = dict(m.named_parameters())
    grads = {k: named[k].grad.detach().clone() for k in params}
    return logits.detach(), loss.detach().reshape(1), grads


def write(path, tensors):
    with open(path, "wb") as f:
        f.write(b"MRFX1\n")
        f.write(struct.pack("<I", len(tensors)))
        for name, t in tensors:
            t = t.detach().contiguous()
            nb = name.encode("ascii")
            f.write(struct.pack("<H", len(nb)))
            f.write(nb)
            f.write(struct.pack("<BB", DTYPE_CODE[t.dtype], t.dim()))
            for d in t.shape:
                f.write(struct.pack("<q", d))
            f.write(t.numpy().astype(t.numpy().dtype.newbyteorder("<"), copy=False).tobytes())


def fixture(name, model, x, y, gen, outdir):
    params = randomize(model, gen)
    tensors = list(params.items()) + [("x", x), ("y", y)]
    for dtype, tag in ((torch.float64, "f64"), (torch.float32, "f32")):
        logits, loss, grads = run(model, params, x, y, dtype)
        tensors += [(f"{tag}/logits", logits), (f"{tag}/loss", loss)]
        tensors += [(f"{tag}/{k}.grad", g) for k, g in grads.items()]
        print(f"{name} {tag}: loss {loss.item():.10f}")
    path = os.path.join(outdir, f"{name}.bin")
    write(path, tensors)
    print(f"wrote {path} ({os.path.getsize(path)} bytes, {len(tensors)} tensors)")


def graph_run(model, params, buffers, x, y, dtype, training):
    """Forward and backward in dtype from the given parameters and buffers, in training or
    evaluation mode; returns (logits, loss, {param: grad}, {buffer: value after the forward})."""
    m = model.to(dtype)
    state = {k: v.to(dtype) for k, v in params.items()}
    state.update({k: v.long() if k.endswith(".num_batches_tracked") else v.to(dtype) for k, v in buffers.items()})
    m.load_state_dict(state, strict=True)
    m.train(training)
    m.zero_grad()
    logits = m(x.to(dtype))
    loss = F.cross_entropy(logits, y.long())
    loss.backward()
    named = dict(m.named_parameters())
    grads = {k: named[k].grad.detach().clone() for k in params}
    after = {k: b.detach().clone().to(dtype) for k, b in m.named_buffers()}
    return logits.detach(), loss.detach().reshape(1), grads, after


def graph_fixture(outdir):
    """tests/fixtures/graph.bin: GRAPH_YAML's model in training and in evaluation mode."""
    gen = torch.Generator().manual_seed(SEED + 4)  # its own stream: mlp, cnn, gpt stay as they are
    model = GraphNet()
    params = randomize(model, gen)
    buffers = {}
    for name, b in model.named_buffers():
        if name.endswith(".running_mean"):
            v = 0.3 * torch.randn(b.shape, generator=gen, dtype=torch.float64)
        elif name.endswith(".running_var"):
            v = 0.5 + torch.rand(b.shape, generator=gen, dtype=torch.float64)
        else:  # num_batches_tracked
            v = torch.full(b.shape, 7.0, dtype=torch.float64)
        buffers[name] = v.to(torch.float32)
    x = torch.randn((3, 2, 6, 6), generator=gen, dtype=torch.float64).to(torch.float32)
    y = torch.randint(0, 5, (3,), generator=gen, dtype=torch.int64).to(torch.int32)
    text = torch.tensor(list(GRAPH_YAML.encode("ascii")), dtype=torch.uint8)
    tensors = [("yaml", text)] + list(params.items()) + [(f"buffers/{k}", v) for k, v in buffers.items()]
    tensors += [("x", x), ("y", y)]
    for dtype, tag in ((torch.float64, "f64"), (torch.float32, "f32")):
        for mode in ("train", "eval"):
            logits, loss, grads, after = graph_run(model, params, buffers, x, y, dtype, mode == "train")
            tensors += [(f"{tag}/{mode}/logits", logits), (f"{tag}/{mode}/loss", loss)]
            tensors += [(f"{tag}/{mode}/{k}.grad", g) for k, g in grads.items()]
            if mode == "train":
                tensors += [(f"{tag}/train/{k}", v) for k, v in after.items()]
            else:
                assert all(torch.equal(v, buffers[k].to(dtype)) for k, v in after.items()), "eval changed a buffer"
            print(f"graph {tag} {mode}: loss {loss.item():.10f}")
    path = os.path.join(outdir, "graph.bin")
    write(path, tensors)
    print(f"wrote {path} ({os.path.getsize(path)} bytes, {len(tensors)} tensors)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("which", nargs="*", metavar="{mlp,cnn,gpt,graph}",
                    help="the fixtures to write (default: all); mlp, cnn and gpt share one random stream, "
                         "so any of them writes all three")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"),
                    help="the directory to write to (default: tests/fixtures)")
    args = ap.parse_args()
    which = set(args.which) or {"mlp", "cnn", "gpt", "graph"}
    if which - {"mlp", "cnn", "gpt", "graph"}:
        ap.error(f"unknown fixture(s) {sorted(which - {'mlp', 'cnn', 'gpt', 'graph'})}")
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}")
    outdir = args.out
    os.makedirs(outdir, exist_ok=True)
    if "graph" in which:
        graph_fixture(outdir)
    if not which & {"mlp", "cnn", "gpt"}:
        return
    gen = torch.Generator().manual_seed(SEED)

    def randx(*shape):
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(torch.float32)

    def randint(hi, *shape):
        return torch.randint(0, hi, shape, generator=gen, dtype=torch.int64).to(torch.int32)

    fixture("mlp", MLP([6, 5, 4, 3]), randx(4, 6), randint(3, 4), gen, outdir)
    fixture("cnn", CNN(1, 8, 8, 2, 3, 5, 4), randx(2, 1, 8, 8), randint(4, 2), gen, outdir)
    fixture("gpt", GPT(11, 6, 2, 2, 8), randint(11, 2, 6), randint(11, 2, 6), gen, outdir)


if __name__ == "__main__":
    main()
