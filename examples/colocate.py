# SPDX-License-Identifier: Apache-2.0
"""Two PyTorch programs that share a GPU: a latency-critical inference service and a
best-effort training job (benchmarks/bench_colocate.py runs them side by side).

    colocate.py infer [--mode sync|copy|graph] [--requests 400] [--gap-ms 10]
                      [--layers 8] [--width 1024]
    colocate.py train [--size light|heavy] [--layers 12] [--width 768]

infer: a transformer encoder's forward pass in bf16 (8 layers, d_model 1024, batch 8 x 512
tokens). After a warm-up it prints `ready`, waits for a line on its standard input (`go`, so
that a benchmark can start it in step with other work), then serves `--requests` requests
that arrive every `--gap-ms` milliseconds (an open loop: request i arrives at start + i * gap,
whether the one before it has finished or not). A request's latency runs from its arrival to
the end of its wait for the GPU, which --mode chooses, as serving programs differ in it:

    sync    the forward pass, then torch.cuda.synchronize() (cudaDeviceSynchronize)
    copy    the forward pass, then a blocking copy of a small result to the host (each
            sequence's argmax at its last position, 8 integers): the stream's own wait
            inside the copy, no device synchronize
    graph   the replay of a CUDA graph of the forward pass (captured once, after the
            warm-up), then an event recorded after it and waited on: no device or stream
            synchronize, the kernels launched by the graph

It prints

    window <start> <end>            time.monotonic() seconds: the first arrival, the last end
    latencies_ms <l0>,<l1>,...      every request's latency, in arrival order

train: a training step repeated until SIGTERM or SIGINT. With --size, a GPT-2-like decoder
(token and position embeddings, causal self-attention through scaled_dot_product_attention, an
MLP 4x as wide, pre-LayerNorm, the output layer tied to the token embedding, vocabulary 50257)
learning to predict random token ids, bf16 autocast, AdamW:

    light   12 layers, width 768, batch 16 x 512 tokens (124 M parameters)
    heavy   16 layers, width 2048, batch 16 x 1024 tokens (911 M parameters)

The heavy one's memory: 16 bytes a parameter for the fp32 weights, gradients and AdamW's two
moments (14.6 GB), a bf16 copy of the weights made by autocast (1.8 GB), about 36 bytes per
token, layer and unit of width kept for the backward pass (16,384 tokens x 16 layers x 2048:
19.3 GB) and the logits (16,384 x 50,257: 1.6 GB in bf16, 3.3 GB each for their fp32
log-softmax and its gradient): about 45 GB at its peak, which leaves room for the service on
an 80 GB GPU. Without --size, a transformer encoder (--layers, --width; 12 x 768, batch 16 x
512 of random vectors) as before.

After 3 steps of warm-up it prints `ready`; at the signal it prints, and exits 0:

    peak_gib <x>                    the most GPU memory PyTorch held at once, GiB
    steps <t0>,<t1>,...             time.monotonic() at the end of each step after the warm-up

time.monotonic() is CLOCK_MONOTONIC, one clock for every process of the machine, so a
benchmark can count the training steps that ended inside the inference's window.

Only running a program needs PyTorch: the options can be read (--help, or build_parser from
another program) without it.
"""

import argparse
import signal
import sys
import time

__all__ = ["MODES", "TRAIN_SIZES", "VOCAB", "build_parser", "main"]

MODES = ("sync", "copy", "graph")
TRAIN_SIZES = {
    "light": {"layers": 12, "width": 768, "heads": 12, "batch": 16, "tokens": 512},
    "heavy": {"layers": 16, "width": 2048, "heads": 16, "batch": 16, "tokens": 1024},
}
VOCAB = 50257
ENCODER_LAYERS = 12
ENCODER_WIDTH = 768
# The captured graph must compute what the eager pass does; the outputs are LayerNorm'd (unit
# scale), so a mean difference this large means a wrong graph, not bf16 rounding.
GRAPH_MEAN_DIFF = 0.01


def _torch():
    try:
        import torch
    except ImportError:
        sys.exit("colocate: PyTorch is not installed in this Python")
    return torch


def encoder(torch, layers, width, heads):
    layer = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, batch_first=True,
                                             dropout=0.0)
    return torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


def gpt(torch, layers, width, heads, vocab, context):
    """A GPT-2-like decoder: logits of shape (batch, tokens, vocab) from token ids."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(width)
            self.qkv = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)
            self.ln2 = nn.LayerNorm(width)
            self.fc = nn.Linear(width, 4 * width)
            self.out = nn.Linear(4 * width, width)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2)
                       for z in self.qkv(self.ln1(x)).split(c, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, width)
            self.pos = nn.Embedding(context, width)
            # GPT-2's scale: unit-variance embeddings, tied to the output layer, would make
            # logits of size sqrt(width) and a loss that diverges
            nn.init.normal_(self.tok.weight, std=0.02)
            nn.init.normal_(self.pos.weight, std=0.02)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab, bias=False)
            self.head.weight = self.tok.weight

        def forward(self, ids):
            x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    return Gpt()


def _sync_serve(torch, model, x):
    def serve():
        model(x)
        torch.cuda.synchronize()
    return serve


def _copy_serve(torch, model, x):
    def serve():
        # a copy to pageable host memory returns once the stream's work before it is done
        model(x)[:, -1].argmax(-1).to("cpu")
    return serve


def _graph_serve(torch, model, x):
    eager = model(x)
    # the warm-up before capture runs on a side stream, as torch.cuda.graphs documents, so
    # that lazily made state (cuBLAS workspaces, autotuning) is not made during the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(x)
    graph.replay()
    torch.cuda.synchronize()
    diff = (out.float() - eager.float()).abs().mean().item()
    if not diff <= GRAPH_MEAN_DIFF:
        sys.exit(f"colocate infer: the captured graph's output differs from the eager pass's "
                 f"(mean absolute difference {diff:.4f})")
    done = torch.cuda.Event()

    def serve():
        graph.replay()
        done.record()
        done.synchronize()
    return serve


SERVES = {"sync": _sync_serve, "copy": _copy_serve, "graph": _graph_serve}


def infer(args):
    torch = _torch()
    torch.manual_seed(0)
    model = encoder(torch, args.layers, args.width, 16).cuda().to(torch.bfloat16).eval()
    x = torch.randn(8, 512, args.width, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        for _ in range(10):
            model(x)
        torch.cuda.synchronize()
        serve = SERVES[args.mode](torch, model, x)
        torch.cuda.synchronize()
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            sys.exit("colocate infer: expected `go` on standard input")
        gap = args.gap_ms / 1e3
        start = time.monotonic() + 0.01
        latencies = []
        for i in range(args.requests):
            arrival = start + i * gap
            wait = arrival - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            serve()
            latencies.append((time.monotonic() - arrival) * 1e3)
        end = time.monotonic()
    print(f"window {start:.6f} {end:.6f}")
    print("latencies_ms " + ",".join(f"{v:.3f}" for v in latencies), flush=True)


def _gpt_step(torch, size):
    s = TRAIN_SIZES[size]
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model = gpt(torch, s["layers"], s["width"], s["heads"], VOCAB, s["tokens"]).cuda()
    ids = torch.randint(VOCAB, (s["batch"], s["tokens"] + 1), device="cuda")
    inputs, targets = ids[:, :-1].contiguous(), ids[:, 1:].reshape(-1)

    def loss():
        return torch.nn.functional.cross_entropy(model(inputs).reshape(-1, VOCAB), targets)
    return model, loss


def _encoder_step(torch, args):
    model = encoder(torch, args.layers, args.width, 12).cuda()
    x = torch.randn(16, 512, args.width, device="cuda")

    def loss():
        return model(x).float().pow(2).mean()
    return model, loss


def train(args):
    torch = _torch()
    torch.manual_seed(0)
    model, loss_of = _gpt_step(torch, args.size) if args.size else _encoder_step(torch, args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    ends = []
    step = 0
    while not stop:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        step += 1
        if step == 3:
            print("ready", flush=True)
        elif step > 3:
            ends.append(time.monotonic())
    print(f"peak_gib {torch.cuda.max_memory_allocated() / 2**30:.2f}")
    print("steps " + ",".join(f"{t:.6f}" for t in ends), flush=True)


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="role", required=True)
    i = sub.add_parser("infer", help="the latency-critical service")
    i.add_argument("--mode", choices=MODES, default="sync",
                   help="how a request waits for the GPU (default sync)")
    i.add_argument("--requests", type=int, default=400)
    i.add_argument("--gap-ms", type=float, default=10.0)
    i.add_argument("--layers", type=int, default=8)
    i.add_argument("--width", type=int, default=1024)
    t = sub.add_parser("train", help="the best-effort training job")
    t.add_argument("--size", choices=tuple(TRAIN_SIZES),
                   help="a GPT-2-like decoder of this size (default: the encoder)")
    t.add_argument("--layers", type=int, help=f"the encoder's (default {ENCODER_LAYERS})")
    t.add_argument("--width", type=int, help=f"the encoder's (default {ENCODER_WIDTH})")
    return ap


def main(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.role == "infer":
        if args.requests < 1 or not args.gap_ms > 0:
            ap.error("infer: --requests must be at least 1 and --gap-ms more than 0")
        infer(args)
        return
    if args.size and (args.layers is not None or args.width is not None):
        ap.error(f"train: --size {args.size} sets its own layers and width; --layers and "
                 "--width are the encoder's")
    args.layers = ENCODER_LAYERS if args.layers is None else args.layers
    args.width = ENCODER_WIDTH if args.width is None else args.width
    train(args)


if __name__ == "__main__":
    main()
