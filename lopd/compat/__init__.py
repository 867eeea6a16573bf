"""Adapters around third-party internals: every read of a library's private API lives here, one
module per library, so an upgrade that moves one breaks in one place (and a test names it). ``kernels``
pins the CPU kernels PyTorch, MKL and oneDNN choose at run time (their environment knobs), before torch
computes anything."""
