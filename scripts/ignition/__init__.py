"""Ignition's Python harness: drive `boot` and QEMU over a pty, parse the VMM's log lines."""
