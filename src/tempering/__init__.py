"""tempering: reinforcement-learning post-training with verifiable rewards."""

from tempering.torch_extensions import hide_cuda_extensions

__version__ = "0.1.0"

hide_cuda_extensions()  # before anything imports transformers
