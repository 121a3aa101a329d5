"""Sinks: where ranges go (NVTX, the in-process recorder).  They know nothing of Chainer."""
