import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_configure(config):
    # Tiny models gain nothing from threads, and oversubscribed threads stall on a busy machine.
    try:
        import torch

        torch.set_num_threads(int(os.environ.get("VSKIP_TEST_THREADS", "1")))
    except ImportError:
        pass
