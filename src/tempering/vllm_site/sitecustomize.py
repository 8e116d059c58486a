"""Run at the start of every process that vLLM starts for tempering: importing tempering hides
CUDA-only torch extensions beside a CPU torch (``tempering.torch_extensions``)."""

import tempering  # noqa: F401
