"""ignition.image without a registry or a VM: layers applied in order with OCI whiteouts, entries
that would leave the root refused, symbolic links never followed on the host, bounded reads and
sizes, the init made from an image config, and an ext4 image whose modes, owners and device nodes
are the image's (read back with debugfs)."""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from ignition import image
from ignition.image import ImageError, Staging


def layer(path: Path, entries: list[tuple[Any, ...]]) -> Path:
    """A tar of (name, kind, arg) entries: kind 'f' (arg: bytes), 'd', 'l' (symlink to arg),
    'h' (hard link to arg), 'c' (character device (major, minor)); mode 0o644/0o755, owner 0."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as t:
        for name, kind, *rest in entries:
            arg: Any = rest[0] if rest else None
            ti = tarfile.TarInfo(name)
            ti.mode = 0o755 if kind == "d" else 0o644
            data = None
            if kind == "f":
                data = arg if isinstance(arg, bytes) else b""
                ti.size = len(data)
            elif kind == "d":
                ti.type = tarfile.DIRTYPE
            elif kind == "l":
                ti.type, ti.linkname = tarfile.SYMTYPE, arg
            elif kind == "h":
                ti.type, ti.linkname = tarfile.LNKTYPE, arg
            elif kind == "c":
                ti.type, (ti.devmajor, ti.devminor) = tarfile.CHRTYPE, arg
            if len(rest) > 1:
                ti.uid, ti.gid, ti.mode = rest[1]
            t.addfile(ti, io.BytesIO(data) if data is not None else None)
    return path


@pytest.fixture
def st(tmp_path) -> Staging:
    return Staging.new(tmp_path / "root")


def apply(st: Staging, tmp_path: Path, i: int, entries: list[tuple[Any, ...]]) -> None:
    st.apply_layer(layer(tmp_path / f"l{i}.tar", entries), f"layer {i} (sha256:x{i})")


def test_whiteouts_remove_lower_layers_entries_only(st, tmp_path):
    apply(
        st,
        tmp_path,
        0,
        [("etc", "d"), ("etc/keep", "f", b"k"), ("etc/gone", "f", b"g"), ("opt/sub/a", "f", b"a"), ("opt/b", "f")],
    )
    apply(
        st,
        tmp_path,
        1,
        [
            ("etc/.wh.gone", "f"),
            ("opt/new", "f", b"n"),  # before the opaque marker in the same layer: kept
            ("opt/.wh..wh..opq", "f"),
            ("etc/.wh.notthere", "f"),
        ],
    )
    r = st.root
    assert (r / "etc/keep").read_bytes() == b"k"
    assert not (r / "etc/gone").exists() and "etc/gone" not in st.meta
    assert sorted(os.listdir(r / "opt")) == ["new"]
    assert "opt/sub/a" not in st.meta
    assert not any(".wh." in p for p in st.meta)
    # A later layer replaces a file with a directory and a directory with a file.
    apply(st, tmp_path, 2, [("etc/keep", "d"), ("etc/keep/x", "f", b"x"), ("opt", "f", b"now a file")])
    assert (r / "etc/keep/x").read_bytes() == b"x"
    assert (r / "opt").read_bytes() == b"now a file" and "opt/new" not in st.meta


def test_a_directory_entry_keeps_the_lower_layers_children(st, tmp_path):
    apply(st, tmp_path, 0, [("usr", "d"), ("usr/a", "f", b"a")])
    apply(st, tmp_path, 1, [("usr", "d", None, (0, 0, 0o700)), ("usr/b", "f", b"b")])
    assert sorted(os.listdir(st.root / "usr")) == ["a", "b"]
    assert st.meta["usr"].mode == 0o40700


@pytest.mark.parametrize("name", ["../escape", "a/../../escape", "./../x"])
def test_entries_leaving_the_root_are_refused_naming_the_layer(st, tmp_path, name):
    with pytest.raises(ImageError, match=r"layer 0 \(sha256:x0\): entry .* leaves the root"):
        apply(st, tmp_path, 0, [(name, "f", b"x")])
    assert not (tmp_path / "escape").exists() and not (tmp_path / "x").exists()


def test_symlinks_resolve_inside_the_root_never_on_the_host(st, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    apply(
        st,
        tmp_path,
        0,
        [
            ("usr/bin", "d"),
            ("bin", "l", "usr/bin"),
            ("abs", "l", str(outside)),  # absolute: the image's own /<tmp>/outside
            ("up", "l", "../../../../../../.."),  # above the root: the root
        ],
    )
    apply(st, tmp_path, 1, [("bin/tool", "f", b"t"), ("abs/planted", "f", b"p"), ("up/at-root", "f", b"r")])
    assert (st.root / "usr/bin/tool").read_bytes() == b"t"
    assert os.readlink(st.root / "abs") == str(outside)
    assert not (outside / "planted").exists()
    assert (st.root / str(outside).lstrip("/") / "planted").read_bytes() == b"p"
    assert (st.root / "at-root").read_bytes() == b"r"
    # A hard link through a symlink to the host is refused, not made.
    with pytest.raises(ImageError, match="layer 2"):
        apply(st, tmp_path, 2, [("h", "h", "abs/../../etc/passwd")])


def test_symlink_loops_and_missing_hard_link_targets_are_errors(st, tmp_path):
    with pytest.raises(ImageError, match="layer 0 .*symbolic links"):
        apply(st, tmp_path, 0, [("a", "l", "b"), ("b", "l", "a"), ("a/x", "f")])
    with pytest.raises(ImageError, match="layer 1 .*not a file of the image"):
        apply(st, tmp_path, 1, [("y", "h", "nothere")])


def test_hard_links_share_the_inode(st, tmp_path):
    apply(st, tmp_path, 0, [("a", "f", b"data"), ("b", "h", "a")])
    assert os.lstat(st.root / "a").st_ino == os.lstat(st.root / "b").st_ino


def test_tar_headers_are_read_within_a_bound(st, tmp_path, monkeypatch):
    monkeypatch.setattr(image, "MAX_HEADER_BYTES", 4096)
    long = "d/" + "n" * 8000  # a pax header longer than the bound
    with pytest.raises(ImageError, match="layer 0 .*more than 4096"):
        apply(st, tmp_path, 0, [(long, "f", b"x")])


def test_a_corrupt_tar_is_an_error_naming_the_layer(st, tmp_path):
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"\x01" * 2048)
    with pytest.raises(ImageError, match="layer 3 .*not a valid tar"):
        st.apply_layer(bad, "layer 3 (sha256:x3)")


def test_unpacking_is_bounded(tmp_path):
    import gzip

    blob = tmp_path / "blob"
    blob.write_bytes(gzip.compress(b"\0" * (1 << 20)))
    out = tmp_path / "out.tar"
    assert image.unpack_layer(blob, "application/vnd.oci.image.layer.v1.tar+gzip", out, 2 << 20, "l") == 1 << 20
    with pytest.raises(ImageError, match="more than 1000 bytes"):
        image.unpack_layer(blob, "application/vnd.oci.image.layer.v1.tar+gzip", out, 1000, "layer 0")
    if shutil.which("zstd"):
        zeros, z = tmp_path / "zeros", tmp_path / "blob.zst"
        zeros.write_bytes(b"\0" * (1 << 20))
        subprocess.run(["zstd", "-q", "-o", str(z), str(zeros)], check=True)
        assert image.unpack_layer(z, "application/vnd.oci.image.layer.v1.tar+zstd", out, 2 << 20, "l") == 1 << 20
        with pytest.raises(ImageError, match="more than"):
            image.unpack_layer(z, "application/vnd.oci.image.layer.v1.tar+zstd", out, 1000, "layer 0")


def test_the_init_runs_entrypoint_and_cmd_with_env_in_workdir():
    cfg = {
        "config": {
            "Entrypoint": ["/bin/sh", "-c"],
            "Cmd": ['echo "$X" it\'s > out'],
            "Env": ["X=a b", "PATH=/opt/bin:/bin"],
            "WorkingDir": "/srv/app",
        }
    }
    s = image.init_script(cfg)
    assert s.startswith("#!/.ignition/busybox sh\n")
    assert "( cd /srv/app && exec $B env -i 'X=a b' PATH=/opt/bin:/bin /bin/sh -c 'echo \"$X\" it'\"'\"'s > out' )" in s
    assert "/bin/ignition-agent" in s and "poweroff -f" in s
    # The quoting survives a shell: busybox is not on the host, but sh parses the same way.
    words = subprocess.run(
        ["sh", "-c", "printf '%s\\n' 'echo \"$X\" it'\"'\"'s > out'"], capture_output=True, text=True
    )
    assert words.stdout == 'echo "$X" it\'s > out\n'
    bare = image.init_script({"config": {}})
    assert "PATH=/usr/local/sbin" in bare and "poweroff" not in bare and "sleep 3600" in bare


def test_the_guest_pieces_give_the_init_and_the_agent_their_network_tools(st):
    s = image.init_script({"config": {"Cmd": ["/app"]}})
    agent_line = next(ln for ln in s.splitlines() if "/bin/ignition-agent" in ln)
    assert "/bin/ignition-agent --net-tools /.ignition;" in agent_line
    assert "/.ignition/udhcpc -i eth0 " in s and "-s /.ignition/udhcpc.script" in s
    # Ready is printed once the agent is started, before the image's command runs.
    lines = s.splitlines()
    ready = lines.index(f"echo {image.READY_LINE!r} >/dev/console")
    assert lines.index(agent_line) < ready < next(i for i, ln in enumerate(lines) if "/app" in ln)
    image.add_guest(st, b"agent ... --net-tools ...", b"busybox", s)
    for applet in ("ip", "udhcpc"):
        assert os.readlink(st.root / ".ignition" / applet) == "busybox"
        assert st.meta[f".ignition/{applet}"].mode == stat.S_IFLNK | 0o777
    assert (st.root / ".ignition/udhcpc.script").read_text().startswith("#!/.ignition/busybox sh\n")
    assert (st.root / "sbin/init").read_text() == s


def test_an_agent_older_than_net_tools_is_refused(st):
    with pytest.raises(ImageError, match="predates --net-tools"):
        image.add_guest(st, b"an agent without the option", b"busybox", "#!/bin/sh\n")


@pytest.mark.skipif(shutil.which("mkfs.ext4") is None and not Path("/sbin/mkfs.ext4").exists(), reason="no e2fsprogs")
def test_the_ext4_image_has_the_image_s_modes_owners_and_devices(st, tmp_path):
    apply(
        st,
        tmp_path,
        0,
        [
            ("bin/su", "f", b"#!", (0, 0, 0o4755)),
            ("home/user/f", "f", b"mine", (1000, 1001, 0o600)),
            ("dev/null", "c", (1, 3), (0, 0, 0o666)),
            ("secret", "f", b"s", (0, 0, 0o000)),
        ],
    )
    st.finish()
    out = tmp_path / "rootfs.ext4"
    image.make_ext4(st, out)

    def stat_of(path: str) -> str:
        return subprocess.run(["debugfs", "-R", f"stat {path}", str(out)], capture_output=True, text=True).stdout

    su = stat_of("/bin/su")
    assert "Mode:  04755" in su and "User:     0" in su, su
    f = stat_of("/home/user/f")
    assert "Mode:  0600" in f and "User:  1000" in f and "Group:  1001" in f, f
    null = stat_of("/dev/null")
    assert "Type: character special" in null and "Mode:  0666" in null, null
    assert "Device major/minor number: 01:03" in null, null
    assert "Mode:  0000" in stat_of("/secret")
    fsck = subprocess.run(["e2fsck", "-fn", str(out)], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    assert stat.S_IMODE(os.lstat(st.root / "secret").st_mode) == 0o600  # the host copy stays readable
