"""Patches: what is wrapped in Chainer (and ChainerMN), turned into tracer events."""
