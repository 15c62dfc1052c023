"""Benchmarks (not tests): each module is a front-end run as `python3 -m ignition.bench.<name>`.

  boot           Ignition's boot time against QEMU TCG
  qemu_boot      QEMU TCG start to `login:` alone
  snapshot       saving and restoring a running VM, Ignition against QEMU TCG
  diff_snapshot  the cost and the payoff of diff snapshots
  restore_disk   what a restore costs its disk (the overlay against a copy or a clone)
  net            guest<->host TCP throughput through passt (and vsock), against QEMU TCG
  oci            vmstore push/pull against a local registry, beside skopeo
  cpu            guest CPU work (hashing, compression, a shell loop) against QEMU TCG

Each writes its JSON (and some a Markdown table) to bench-results/ (ignition.paths.RESULTS_DIR).
"""
