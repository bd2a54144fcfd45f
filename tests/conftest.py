"""Under pytest-xdist (`-n 2`, the README's test command) each worker takes one torch thread: the
workers already share the cores, and two threads each would only contend for them."""

import os

import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
