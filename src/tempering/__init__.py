"""tempering: reinforcement-learning post-training with verifiable rewards."""

__version__ = "0.1.0"
