"""Children of test_store_files.py."""

from __future__ import annotations

import os
import sys

import percolite


def open_in_read_only_directory(parent_dir, target):
    """Opens a store at ``target`` inside the read-only ``parent_dir``, as an
    unprivileged user (root ignores directory permissions: as root, this drops
    to nobody first). Prints the StorageError; exits nonzero if it opened."""
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    assert not os.access(parent_dir, os.W_OK), "the directory is writable: the test proves nothing"
    try:
        percolite.open(target, sync="none")
    except percolite.StorageError as e:
        print("StorageError:", e)
    else:
        sys.exit("opened a store in a read-only directory")
