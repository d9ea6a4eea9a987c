"""Keep the models tests on one thread: the machine's cores are shared, and tiny matmuls gain nothing."""

import torch

torch.set_num_threads(1)
