"""Leaves: the settings table, range names, messages, path templates, the MPI rank.

Everything above may import these; they import nothing of the package above
``common`` and nothing heavy (the ``.pth`` start-up check imports settings).
"""
