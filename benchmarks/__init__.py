"""benchmarks: time every numpy_attn operation against its torch twin and PyTorch's built-in.

Run ``python -m benchmarks --help`` for the options. What one run does, in order:

1. The parent process builds the list of (op, sequence length) cases from the registry
   (``registry.py``, one entry per operation, named by the stem its files share:
   ``numpy_attn/<stem>.py``, ``torch_attn/<stem>.py``, ``parity_tests/test_<stem>.py``).
2. Parity: at every benchmark size, before any timing, the parent runs the NumPy forward and
   backward and every torch implementation that will be timed, and stops with exit status 1 if
   any output or gradient differs by more than the dtype's tolerance (``parity.py``).
3. Timing: one subprocess per library and device (``_worker.py``): NumPy's OpenBLAS threads and
   torch's OpenMP threads slow each other down by 1.3-4x when both are used in one process, so
   no process that is timed ever runs the other library's kernels. Each worker measures its
   own matmul peak first, then warms up and times every case (``measure.py``): one worker after
   the other, or all at once taking turns, one sample each, with ``--interleave``
   (``--against REV`` adds a worker timing numpy_attn at git revision REV). ``--ops decode``
   times generation in the same workers (``decode.py``).
4. Report: an aligned table on stdout, optionally JSON, CSV, Markdown and a PNG (``report.py``);
   ``--from-json`` prints a saved run again. ``python -m benchmarks.flash_breakdown`` accounts
   for the tuned flash kernel's time line by line (docs/flash_attention_breakdown.md).

FLOP convention: each op counts the FLOPs of its dominant terms in the forward (attention:
``4*B*nh*T*S*hs``, half that when causal); the backward of a matmul costs two matmuls, so
forward+backward counts ``3x`` the forward unless an op states another factor (softmax does).
"""
