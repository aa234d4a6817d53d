# SPDX-License-Identifier: Apache-2.0
"""New kernels launched by autograd's C++ threads while the main thread holds the GIL.

    python torch_gil_backward.py [--n N] [--gate-ms MS] [--hold-ms MS]

A program for clc's GPU tests. Its backward pass launches kernels that the process has never
launched before (gelu_backward, sigmoid_backward, tanh_backward, threshold_backward) from
autograd's device thread, which runs without the GIL, during a window in which the main thread
holds the GIL inside one C call. If the first launch of a kernel had to wait for the program's
GIL, the backward pass could not finish before that window closes.

Nothing in the backward pass may need the GIL itself:
- no hooks, no custom autograd.Function, no anomaly mode, no saved-tensor hooks;
- no tensor that has a Python object may lose its last C++ reference but one during the
  backward pass: PyTorch takes the GIL for that (since 2.10 the C++ side holds the Python
  object whenever a second C++ reference exists, and lets go of it under the GIL; before,
  a tensor whose Python object had died while saved was "resurrected" and freed the same way).
  So every op saves for backward either a leaf (whose AccumulateGrad node keeps a reference
  of its own for the whole pass) or its own output (saved as a new C++ tensor): gelu of a
  leaf, sigmoid, tanh, add, relu, exp, the copies to the CPU and back, sum.

How the window is made, in order:

1. Warm-up: a backward pass of other ops, run from a Python thread as in step 4, so that
   autograd's device thread exists before the window (it takes the GIL once when it starts).
   Then the GPU's spin-wait kernel (torch.cuda._sleep) is calibrated, in cycles per ms.
2. Forward pass, on the main thread, of two leaves of N floats:
   exp(relu(sigmoid(gelu(w1)) + tanh(w2))), to the CPU and back (`.cpu().cuda()`), summed.
3. The gate: a spin kernel of --gate-ms is queued on the stream. The backward pass of
   `.cuda()` copies the gradient to the CPU and waits for the stream, so everything after it
   (the new kernels) is launched only when the spin ends.
4. A Python thread calls loss.backward(): the call releases the GIL while autograd runs.
   The main thread sleeps 0.25 s (GIL released) so that the thread gets into autograd, then
   holds the GIL for --hold-ms in one call to libc's usleep through ctypes.PyDLL (PyDLL does
   not release the GIL). The gate opens about --gate-ms after step 3, inside the hold.
5. Right after the hold, still holding the GIL, the main thread looks at whether both leaves
   have their gradient already (AccumulateGrad sets them in C++, the last step of backward).

Output (one `key=value` set per line, for the tests):
    info torch=<version> device=<name> n=<N>
    gate cycles_per_ms=<c> cycles=<c> gate_ms=<ms> hold_ms=<ms>
    threads main_tid=<tid> backward_tid=<tid> backward_frame=<Python frame at hold begin>
    hold begin_ns=<CLOCK_MONOTONIC> end_ns=<CLOCK_MONOTONIC>
    check gate_closed_at_hold_begin=<0|1> stream_idle_at_hold_end=<0|1> \
grads_set_at_hold_end=<0|1>
    result loss <float.hex()>
    result grad_w1 <sha256 of the gradient's bytes>
    result grad_w2 <sha256 of the gradient's bytes>
    done <loss>
gate_closed_at_hold_begin: the spin kernel was still running when the hold began;
stream_idle_at_hold_end: it had ended when the hold ended (so the gate opened inside it);
grads_set_at_hold_end: the backward pass had finished inside the hold. Exit status 0, 1 when
the backward pass raised, 3 without CUDA.
"""

import argparse
import ctypes
import hashlib
import sys
import threading
import time

import torch
import torch.nn.functional as F

PRE_HOLD_S = 0.25
CALIBRATION_CYCLES = 100_000_000


def calibrate_sleep():
    """The spin kernel's cycles per millisecond: the fastest of a few timed spins."""
    torch.cuda._sleep(1_000_000)
    best = 0.0
    for _ in range(3):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(CALIBRATION_CYCLES)
        end.record()
        end.synchronize()
        best = max(best, CALIBRATION_CYCLES / start.elapsed_time(end))
    return best


def backward_in_thread(loss, state):
    """A Python thread (not started) that calls loss.backward(); state gets its native tid
    and any exception."""
    def run():
        state["tid"] = threading.get_native_id()
        try:
            loss.backward()
        except BaseException as exc:  # reported by the main thread
            state["error"] = repr(exc)
    thread = threading.Thread(target=run, name="backward")
    return thread


def warm_up(device, gen):
    x = torch.randn(4096, device=device, generator=gen).requires_grad_()
    loss = (x * 2.0).cpu().cuda().sum()
    state = {}
    thread = backward_in_thread(loss, state)
    thread.start()
    thread.join()
    if "error" in state:
        raise RuntimeError(f"warm-up backward failed: {state['error']}")
    torch.cuda.synchronize()


def forward(w1, w2):
    """The loss. Each op saves for backward a leaf or its own output, nothing else."""
    a = torch.sigmoid(F.gelu(w1))
    b = torch.tanh(w2)
    c = torch.exp(torch.relu(a + b))
    return c.cpu().cuda().sum()


def digest(t):
    return hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 20)
    ap.add_argument("--gate-ms", type=float, default=1000.0)
    ap.add_argument("--hold-ms", type=float, default=3500.0)
    args = ap.parse_args()

    if not torch.cuda.is_available():
        print("torch_gil_backward: CUDA is not available", file=sys.stderr)
        return 3
    device = torch.device("cuda")
    print(f"info torch={torch.__version__} device={torch.cuda.get_device_name(0).replace(' ', '_')}"
          f" n={args.n}", flush=True)

    # A generator of our own: the values do not depend on any other use of the global RNG.
    gen = torch.Generator(device=device)
    gen.manual_seed(1234)
    warm_up(device, gen)
    cycles_per_ms = calibrate_sleep()
    gate_cycles = int(cycles_per_ms * args.gate_ms)
    print(f"gate cycles_per_ms={cycles_per_ms:.0f} cycles={gate_cycles} gate_ms={args.gate_ms:g}"
          f" hold_ms={args.hold_ms:g}", flush=True)

    w1 = torch.randn(args.n, device=device, generator=gen).requires_grad_()
    w2 = torch.randn(args.n, device=device, generator=gen).requires_grad_()
    loss = forward(w1, w2)
    torch.cuda.synchronize()

    libc = ctypes.PyDLL("libc.so.6")  # PyDLL: the GIL stays held during the call
    libc.usleep.argtypes = [ctypes.c_uint]
    libc.usleep.restype = ctypes.c_int
    hold_us = int(args.hold_ms * 1000)

    state = {}
    thread = backward_in_thread(loss, state)
    torch.cuda._sleep(gate_cycles)  # the gate, queued before the backward pass's work
    thread.start()
    time.sleep(PRE_HOLD_S)  # the GIL is free: the thread gets into autograd
    stream = torch.cuda.current_stream()
    gate_closed = not stream.query()
    frame = sys._current_frames().get(thread.ident)
    where = frame.f_code.co_name if frame is not None else "none"
    begin_ns = time.monotonic_ns()
    libc.usleep(hold_us)
    end_ns = time.monotonic_ns()
    grads_set = w1.grad is not None and w2.grad is not None
    stream_idle = stream.query()
    thread.join()

    print(f"threads main_tid={threading.get_native_id()} backward_tid={state.get('tid', 0)}"
          f" backward_frame={where}", flush=True)
    print(f"hold begin_ns={begin_ns} end_ns={end_ns}", flush=True)
    print(f"check gate_closed_at_hold_begin={int(gate_closed)}"
          f" stream_idle_at_hold_end={int(stream_idle)} grads_set_at_hold_end={int(grads_set)}",
          flush=True)
    if "error" in state:
        print(f"fatal backward raised {state['error']}", flush=True)
        return 1
    torch.cuda.synchronize()
    value = loss.item()
    print(f"result loss {value.hex()}")
    print(f"result grad_w1 {digest(w1.grad)}")
    print(f"result grad_w2 {digest(w2.grad)}")
    print(f"done {value:.6g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
