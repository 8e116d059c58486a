"""Models this small run fastest on one thread, and on a shared CPU more threads only contend."""

import torch

torch.set_num_threads(1)
