"""torch_sweep.py - PyTorch's side of `bench_cuda --sweep` (issue 14): the
same ops on the same shapes, eager and torch.compile, timed with CUDA
events (median of the repetitions, after warm-up), fp32 (or --dtype bf16 /
f16, as `bench_cuda --sweep --dtype`), TF32 off.

    python3 bench/torch_sweep.py [--reps N] [--only NAME,...] [--dtype f32|bf16|f16]

Prints one line per case: eager and compiled milliseconds a call (10 calls
queued back to back a timing, as bench_cuda --sweep), the compiled rate
against the bytes bench_cuda counts for it (its `passes` column), and a
single compiled call's latency."""
import argparse

import torch
import torch.nn.functional as F

from torch_bench import median_events  # the same event timing as make bench-cuda

QUEUE = 10  # calls queued back to back a timing, as bench_cuda --sweep

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def rmsnorm(x, w):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w


# name: (fn, x shape, extra inputs (0 x only, 1 weight, 2 weight+bias, 3 y like x,
# 4 y like x's transpose), passes)
CASES = {
    "sw_softmax_vocab": (lambda x: torch.softmax(x, -1), (256, 50257), 0, 2),
    "sw_softmax_37": (lambda x: torch.softmax(x, -1), (1 << 20, 37), 0, 2),
    "sw_scaled_softmax": (lambda x: torch.softmax(x * 0.125, -1), (192, 1024, 1024), 0, 2),
    "sw_logsoftmax_slice_mean": (lambda x: torch.log_softmax(x, -1)[:, :1000].mean(), (2048, 50257), 0, 1),
    "sw_rmsnorm": (rmsnorm, (8192, 4096), 1, 2),
    "sw_rowsum_37": (lambda x: x.sum(-1), (1 << 20, 37), 0, 1),
    "sw_layernorm_1000": (lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5), (16384, 1000), 2, 2),
    "sw_colsum": (lambda x: x.sum(0), (16384, 4096), 0, 1),
    "sw_transpose_add": (lambda x, y: x.t() + y, (8192, 8192), 3, 3),
    "sw_transpose_add_odd": (lambda x, y: x.t() + y, (4099, 3001), 4, 3),
    "sw_bias_gelu": (lambda x, b: F.gelu(x + b, approximate="tanh"), (8192, 3072), 1, 2),
    # odd shapes: row lengths and counts that are multiples of nothing
    "sw_softmax_4099": (lambda x: torch.softmax(x, -1), (8191, 4099), 0, 2),
    "sw_rmsnorm_37": (rmsnorm, (1048573, 37), 1, 2),
    "sw_layernorm_4099": (lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5), (8191, 4099), 2, 2),
    "sw_bias_gelu_1001": (lambda x, b: F.gelu(x + b, approximate="tanh"), (16381, 1001), 1, 2),
    "sw_mse_loss": (lambda x, y: ((x - y) * (x - y)).mean(), (8192, 4096), 3, 2),
}

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def timed(fn, args, reps, queue=QUEUE):
    """Median milliseconds of a call of fn(*args) on CUDA events, `queue`
    calls queued back to back a timing, after 3 warm-up calls."""
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()

    def queued(*a):
        for _ in range(queue):
            fn(*a)

    return median_events(queued, args, reps) * 1e3 / queue


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--only", default="")
    ap.add_argument("--dtype", default="f32", choices=sorted(DTYPES))
    a = ap.parse_args()
    dt = DTYPES[a.dtype]
    g = torch.Generator(device="cuda").manual_seed(0)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {a.dtype}, TF32 off")
    for name, (fn, shape, extra, passes) in CASES.items():
        if a.only and name not in a.only:
            continue
        def randn(*s):
            return torch.randn(*s, device="cuda", generator=g).to(dt)

        x = randn(shape)
        cols = shape[-1]
        args = [x]
        if extra in (1, 2):
            args.append(randn(cols))
        if extra == 2:
            args.append(randn(cols))
        if extra == 3:
            args.append(randn(shape))
        if extra == 4:
            args.append(randn(shape[::-1]))
        te = timed(fn, args, a.reps)
        cfn = torch.compile(fn)
        tc = timed(cfn, args, a.reps)
        t1 = timed(cfn, args, a.reps, 1)
        nbytes = passes * x.element_size() * x.numel()
        print(f"{name:26s} eager {te:8.3f} ms  torch.compile {tc:8.3f} ms  {nbytes / tc / 1e6:7.1f} GB/s"
              f"  single call {t1:8.3f} ms", flush=True)
        del x, args
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
