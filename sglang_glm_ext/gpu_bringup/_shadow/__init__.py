"""The directory the GPU bring-up tier puts at the front of ``sys.path`` (``gpu_bringup/gate.py``): it holds only the
``sgl_kernel`` stand-in package. Never a top-level package of the wheel; never on the path unless the tier is on and
its checks passed (a CUDA GPU, no real ``sgl_kernel``, SGLang's settings for a node without one)."""
