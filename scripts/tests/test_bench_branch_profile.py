"""ignition.bench.branch_profile's sorting of perf samples (the recording itself needs perf and
root, which CI does not have: the book lists the command as not run)."""

from ignition.bench.branch_profile import CATEGORIES, category, parse, split

BOOT = "/work/target/release/boot"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
K = "[kernel.kallsyms]"

# `perf script -F comm,pid,tid,ip,sym,dso` of a recording with -g: a source (pid 100, its
# vCPU thread 101 forking) and a child (pid 200; 200 is its main thread, 201 its vCPU thread).
SCRIPT = f"""\
vcpu0   100/101
\tffffffff81001 copy_page_range ({K})
\tffffffff81002 dup_mmap ({K})
\tffffffff81003 copy_process ({K})
\t       d5000 __libc_fork ({LIBC})

vcpu0   100/101
\t      5f2000 tcg_optimize_aarch64 ({BOOT})

vcpu0   200/200
\tffffffff8158e3e1 next_uptodate_folio ({K})
\tffffffff8158e7dd filemap_map_pages ({K})
\tffffffff821f51c6 exc_page_fault ({K})

vcpu0   200/201
\tffffffff821eb5f6 copy_mc_enhanced_fast_string ({K})
\tffffffff815e54c7 do_wp_page ({K})
\tffffffff815ee45a __handle_mm_fault ({K})
\tffffffff821f51c6 exc_page_fault ({K})
\tffffffff81000c82 asm_exc_page_fault ({K})
\t           98154 _int_malloc ({LIBC})
\t               0 [unknown] ([unknown])

vcpu0   200/201
\tffffffff815e6e4c do_fault ({K})
\tffffffff821f51c6 exc_page_fault ({K})
\t    7f0e500348c1 [unknown] (/tmp/perf-100.map)

vcpu0   200/201
\tffffffff81234 __x64_sys_write ({K})
\tffffffff81235 do_syscall_64 ({K})

vcpu0   200/201
\t    7f0e500348c1 [unknown] (/tmp/perf-100.map)

vcpu0   200/201
\t    7f0e500348c1 [unknown] ([unknown])

vcpu0   200/201
\t      5f203e tcg_optimize_aarch64 ({BOOT})

vcpu0   200/201
\t      4d812a qht_lookup_custom ({BOOT})

vcpu0   200/201
\t      4d8200 helper_lookup_tb_ptr_aarch64 ({BOOT})

vcpu0   200/201
\t      4d8300 ignition_vmm::hv::emu::hooks::block_hook ({BOOT})

vcpu0   200/201
\t       98154 _int_malloc ({LIBC})

virtio-vsock   200/205
\t      4d8400 ignition_vmm::devices::virtio::vsock::x ({BOOT})

rustc   300/300
\t      100 something (/usr/bin/rustc)
"""


def test_samples_parse_with_their_call_chains():
    samples = list(parse(SCRIPT))
    assert len(samples) == 15
    first = samples[0]
    assert (first.pid, first.tid, first.comm) == (100, 101, "vcpu0")
    assert first.frames[0] == ("copy_page_range", K)
    assert first.frames[-1] == ("__libc_fork", LIBC)
    assert samples[3].frames[-1] == ("[unknown]", "[unknown]")
    assert samples[13].comm == "virtio-vsock"


def test_each_child_sample_lands_in_its_category():
    got = [category(s) for s in parse(SCRIPT) if s.pid == 200]
    assert got == [
        "restore",
        "copy-on-write faults",
        "other page faults",
        "kernel, other",
        "running translated code",
        "running translated code",
        "translating guest code",
        "finding translated blocks",
        "finding translated blocks",
        "emulation helpers and VMM hooks",
        "libc",
        "other threads",
    ]
    assert set(got) <= set(CATEGORIES)


def test_split_counts_the_children_and_the_sources_fork_only():
    r = split(parse(SCRIPT), children={200}, source=100)
    assert r["children_samples"] == 12
    assert r["source_samples"] == 2
    assert r["source_fork_samples"] == 1
    assert r["categories"]["running translated code"] == 2
    assert r["categories"]["finding translated blocks"] == 2
    assert list(r["categories"]) == list(CATEGORIES)
    top = dict(r["top_functions"])
    assert sum(top.values()) == 12
    assert top["tcg_optimize_aarch64 (boot)"] == 1
