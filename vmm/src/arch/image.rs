//! Loading a Linux arm64 `Image` (or an `Image.gz`) and placing the DTB
//! and the initrd, per the kernel's `Documentation/arch/arm64/booting.rst`.
//!
//! Guest RAM at boot, from [`RAM_BASE`](crate::arch::layout::RAM_BASE):
//!
//! ```text
//! RAM_BASE + text_offset      kernel Image, image_size bytes (incl. BSS)
//! next 2 MiB boundary         DTB, in a slot of DTB_MAX_SIZE (2 MiB)
//! end of the DTB's slot       initrd (boot --initrd), if any
//! last 16 KiB page            VM generation ID (layout::vmgenid_gpa)
//! ```
//!
//! We parse the header ourselves: linux-loader's PE/Image loader is compiled
//! only when the *host* is aarch64 (`cfg(target_arch = "aarch64")`), and the
//! `emu` backend must boot the same Image on x86_64 hosts.
//!
//! Header (64 bytes, little-endian):
//!
//! ```text
//! 0x00 u32 code0        0x08 u64 text_offset   0x10 u64 image_size
//! 0x04 u32 code1        0x18 u64 flags         0x20..0x38 reserved
//! 0x38 u32 magic = 0x644d5241 ("ARM\x64")      0x3c u32 PE header offset
//! ```
//!
//! A file cut short is refused ([`ImageError::Truncated`]) rather than run
//! with zeros where its code should be. `image_size` cannot tell: it counts
//! the BSS and initial page tables, which the file does not hold (most of
//! a small kernel's footprint). What the file must hold: the code its first
//! instructions jump to (code0 or code1, an unconditional `B`: the
//! kernel's branch to its entry code), and for an EFI-stub kernel (code0
//! starts with `MZ`) every byte its PE section table places in the file
//! (`PointerToRawData + SizeOfRawData`, PE/COFF spec §3).

use crate::arch::layout::{RamRange, KERNEL_ALIGN};
use vm_memory::{Bytes, GuestAddress, GuestMemoryError};

/// `"ARM\x64"` read as a little-endian u32 at offset 0x38.
pub const IMAGE_MAGIC: u32 = 0x644d_5241;
/// Size of the Image header in bytes.
pub const HEADER_SIZE: usize = 64;
/// `text_offset` to assume when `image_size` is 0 (kernels before 3.17).
pub const LEGACY_TEXT_OFFSET: u64 = 0x8_0000;
/// Largest DTB the boot protocol allows, in bytes.
pub const DTB_MAX_SIZE: u64 = 2 * 1024 * 1024;
/// Alignment used for the DTB (the protocol requires 8 bytes; we use 2 MiB so
/// it never shares a 2 MiB block with the kernel).
pub const DTB_ALIGN: u64 = 2 * 1024 * 1024;
/// The initrd and the kernel Image must both lie in one window of this size
/// starting at a [`INITRD_WINDOW_ALIGN`]-aligned address (booting.rst).
pub const INITRD_WINDOW: u64 = 32 << 30;
/// Alignment of the initrd's window.
pub const INITRD_WINDOW_ALIGN: u64 = 1 << 30;

const MIB: u64 = 1024 * 1024;

/// Errors loading a kernel Image or placing the DTB.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// Shorter than the header.
    #[error("not an arm64 Image: {len} bytes is shorter than the {HEADER_SIZE}-byte header")]
    TooShort {
        /// File length in bytes.
        len: usize,
    },
    /// Wrong magic number.
    #[error("not an arm64 Image (bad magic {found:#010x} at offset 0x38, expected {IMAGE_MAGIC:#010x} \"ARM\\x64\")")]
    BadMagic {
        /// The value found.
        found: u32,
    },
    /// The file is shorter than its header implies.
    #[error(
        "truncated arm64 Image: the file is {len} bytes, but {what} implies at least {needed}"
    )]
    Truncated {
        /// File length in bytes.
        len: u64,
        /// Bytes the file must hold at least.
        needed: u64,
        /// What says so: `image_size N` or `its PE section table`.
        what: String,
    },
    /// Header flags bit 0 is set.
    #[error("big-endian kernel (Image header flags {flags:#x}, bit 0 set): only little-endian kernels boot")]
    BigEndian {
        /// The header's flags field.
        flags: u64,
    },
    /// The kernel and its BSS do not fit in RAM.
    #[error("kernel ({size} bytes incl. BSS, at offset {offset:#x} into RAM) does not fit in {} of RAM", fmt_size(*.ram_size))]
    DoesNotFit {
        /// Bytes the kernel occupies: max(image_size, file length).
        size: u64,
        /// Load offset from the start of RAM (2 MiB alignment + text_offset).
        offset: u64,
        /// RAM size in bytes.
        ram_size: u64,
    },
    /// The DTB is larger than the boot protocol allows.
    #[error("device tree is {len} bytes; the arm64 boot protocol allows at most 2 MiB")]
    DtbTooLarge {
        /// DTB length in bytes.
        len: u64,
    },
    /// No room for the DTB above the kernel.
    #[error("no room for the {len}-byte device tree above the kernel (ends at {image_end:#x}) in {} of RAM", fmt_size(*.ram_size))]
    DtbDoesNotFit {
        /// DTB length in bytes.
        len: u64,
        /// Guest-physical end of the kernel.
        image_end: u64,
        /// RAM size in bytes.
        ram_size: u64,
    },
    /// No room for the initrd above the DTB's slot.
    #[error("no room for the {len}-byte initrd at {gpa:#x} (above the kernel and the device tree) in {} of RAM", fmt_size(*.ram_size))]
    InitrdDoesNotFit {
        /// Initrd length in bytes.
        len: u64,
        /// Where it would start.
        gpa: u64,
        /// RAM size in bytes.
        ram_size: u64,
    },
    /// The initrd would end outside the window the protocol confines it to.
    #[error("the {len}-byte initrd at {gpa:#x} would end past {window_end:#x}: the arm64 boot protocol needs the kernel and the initrd in one 32 GiB window from a 1 GiB boundary")]
    InitrdOutsideWindow {
        /// Initrd length in bytes.
        len: u64,
        /// Where it would start.
        gpa: u64,
        /// End of the window (exclusive).
        window_end: u64,
    },
    /// A compressed kernel in a format `boot` does not decompress.
    #[error("the kernel is {format}-compressed: boot decompresses gzip (Image.gz) only; decompress it to the raw Image first")]
    Compressed {
        /// The format its magic number names (`zstd`, `xz`, ...).
        format: &'static str,
    },
    /// An EFI zboot image (`CONFIG_EFI_ZBOOT`).
    #[error("the kernel is an EFI zboot image ({compression}-compressed Image behind an EFI decompressor, for UEFI firmware): boot needs the Image or Image.gz (build with CONFIG_EFI_ZBOOT off, or use the Image from the kernel build)")]
    EfiZboot {
        /// The payload's compression, from the zboot header.
        compression: String,
    },
    /// A gzip-compressed kernel that does not decompress.
    #[error("cannot decompress the gzip-compressed kernel: {0}")]
    Gzip(std::io::Error),
    /// A gzip-compressed kernel larger than RAM once decompressed.
    #[error(
        "the gzip-compressed kernel decompresses to more than {limit} bytes (the guest's RAM)"
    )]
    GzipTooLarge {
        /// The bound in bytes.
        limit: u64,
    },
    /// Writing guest memory failed.
    #[error("cannot write the kernel to guest RAM at {gpa:#x}: {source}")]
    Write {
        /// Where.
        gpa: u64,
        /// vm-memory's error.
        #[source]
        source: GuestMemoryError,
    },
}

fn fmt_size(bytes: u64) -> String {
    if bytes % MIB == 0 {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes} bytes")
    }
}

/// The parsed 64-byte Image header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageHeader {
    /// Offset of the image from a 2 MiB-aligned base ([`LEGACY_TEXT_OFFSET`]
    /// when `image_size` is 0).
    pub text_offset: u64,
    /// Bytes the kernel needs from its start, including BSS; 0 if unknown
    /// (pre-3.17 kernels).
    pub image_size: u64,
    /// Header flags: bit 0 big-endian, bits 1-2 page size, bit 3 placement.
    pub flags: u64,
}

impl ImageHeader {
    /// Parses and checks the header: length, magic, little-endian.
    pub fn parse(image: &[u8]) -> Result<Self, ImageError> {
        let header = image
            .get(..HEADER_SIZE)
            .ok_or(ImageError::TooShort { len: image.len() })?;
        let u64_at = |off: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&header[off..off + 8]);
            u64::from_le_bytes(b)
        };
        let mut m = [0u8; 4];
        m.copy_from_slice(&header[0x38..0x3c]);
        let magic = u32::from_le_bytes(m);
        if magic != IMAGE_MAGIC {
            return Err(ImageError::BadMagic { found: magic });
        }
        let image_size = u64_at(0x10);
        // "Where image_size is zero, text_offset can be assumed to be 0x80000"
        // (its endianness was unspecified before 3.17).
        let text_offset = if image_size == 0 {
            LEGACY_TEXT_OFFSET
        } else {
            u64_at(0x08)
        };
        let flags = if image_size == 0 { 0 } else { u64_at(0x18) };
        if flags & 1 != 0 {
            return Err(ImageError::BigEndian { flags });
        }
        Ok(ImageHeader {
            text_offset,
            image_size,
            flags,
        })
    }

    /// The kernel's page size from flags bits 1-2 (informational), if given.
    pub fn page_size(&self) -> Option<u64> {
        match (self.flags >> 1) & 3 {
            1 => Some(4 * 1024),
            2 => Some(16 * 1024),
            3 => Some(64 * 1024),
            _ => None,
        }
    }
}

/// Where a kernel was loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadedImage {
    /// Guest-physical address of the first byte of the Image: the entry point
    /// (boot CPU starts here with X0 = DTB address, X1..X3 = 0).
    pub entry: u64,
    /// Guest-physical address just past the kernel's footprint
    /// (`entry + max(image_size, file length)`): free memory starts here.
    pub image_end: u64,
    /// The kernel's page size from the header, if it says.
    pub page_size: Option<u64>,
}

/// `"MZ"`, the start of an EFI-stub kernel's code0 (its PE/COFF DOS header).
const EFI_STUB_MAGIC: &[u8; 2] = b"MZ";
/// Size of a PE section table entry, and of the COFF file header after the
/// `PE\0\0` signature (PE/COFF spec §3, §3.3).
const PE_SECTION_SIZE: u64 = 40;
const COFF_HEADER_SIZE: u64 = 20;

/// The kernel's branch to its entry code: code0 or code1 (the first that
/// is an unconditional `B`: A64 bits 31:26 `0b000101`, a signed 26-bit word
/// offset from the instruction), as the field's name and the file offset
/// it jumps to (forward only).
fn entry_branch(image: &[u8]) -> Option<(&'static str, u64)> {
    [("code0", 0u64), ("code1", 4)]
        .into_iter()
        .find_map(|(code, at)| {
            let bytes = image.get(at as usize..at as usize + 4)?;
            let insn = u32::from_le_bytes(bytes.try_into().ok()?);
            if insn >> 26 != 0b000101 {
                return None;
            }
            // Sign-extend imm26, in words.
            let words = i64::from((insn << 6) as i32 >> 6);
            let target = u64::try_from(at as i64 + words * 4).ok()?;
            Some((code, target))
        })
}

/// Checks that `image` holds what its header implies it holds (see the
/// module's doc).
fn check_length(image: &[u8]) -> Result<(), ImageError> {
    let len = image.len() as u64;
    let truncated = |needed: u64, what: String| ImageError::Truncated { len, needed, what };
    if let Some((code, target)) = entry_branch(image) {
        if len < target + 4 {
            return Err(truncated(
                target + 4,
                format!("its entry branch ({code}: b {target:#x})"),
            ));
        }
    }
    if image.get(..2) != Some(&EFI_STUB_MAGIC[..]) {
        return Ok(());
    }
    let what = || "its PE section table".to_string();
    let u16_at = |off: u64| -> Option<u64> {
        let off = usize::try_from(off).ok()?;
        Some(u16::from_le_bytes(image.get(off..off.checked_add(2)?)?.try_into().ok()?).into())
    };
    let u32_at = |off: u64| -> Option<u64> {
        let off = usize::try_from(off).ok()?;
        Some(u32::from_le_bytes(image.get(off..off.checked_add(4)?)?.try_into().ok()?).into())
    };
    // The header's fields are inside `image` once each length is checked.
    let pe = u32_at(0x3c).unwrap_or(0);
    let coff_end = pe + 4 + COFF_HEADER_SIZE;
    if len < coff_end {
        return Err(truncated(coff_end, what()));
    }
    if image.get(pe as usize..pe as usize + 4) != Some(&b"PE\0\0"[..]) {
        // "MZ" but no PE header: not an EFI stub after all.
        return Ok(());
    }
    let sections = u16_at(pe + 6).unwrap_or(0);
    let table = coff_end + u16_at(pe + 20).unwrap_or(0);
    let table_end = table + sections * PE_SECTION_SIZE;
    if len < table_end {
        return Err(truncated(table_end, what()));
    }
    let mut needed = 0;
    for i in 0..sections {
        let entry = table + i * PE_SECTION_SIZE;
        let (size, at) = (u32_at(entry + 16), u32_at(entry + 20));
        if let (Some(size), Some(at)) = (size, at) {
            needed = needed.max(at + size);
        }
    }
    if len < needed {
        return Err(truncated(needed, what()));
    }
    Ok(())
}

/// Copies `image` into guest memory `mem` at the first 2 MiB-aligned address
/// of `ram` plus `text_offset`, after checking the header, that the file is
/// not cut short ([`ImageError::Truncated`]), and that `image_size` bytes
/// (the whole footprint including BSS) fit in `ram`.
pub fn load_image<M>(mem: &M, ram: RamRange, image: &[u8]) -> Result<LoadedImage, ImageError>
where
    M: Bytes<GuestAddress, E = GuestMemoryError> + ?Sized,
{
    let header = ImageHeader::parse(image)?;
    let ram_base = ram.base;
    let ram_size = ram.size;
    let file_len = image.len() as u64;
    let size = header.image_size.max(file_len);
    // RAM_BASE is 2 MiB aligned; round anyway so a different base stays correct.
    let base = ram_base.next_multiple_of(KERNEL_ALIGN);
    let offset = (base - ram_base).saturating_add(header.text_offset);
    let end_offset = offset
        .checked_add(size)
        .filter(|&end| end <= ram_size)
        .ok_or(ImageError::DoesNotFit {
            size,
            offset,
            ram_size,
        })?;
    check_length(image)?;
    let entry = ram_base + offset;
    mem.write_slice(image, GuestAddress(entry))
        .map_err(|source| ImageError::Write { gpa: entry, source })?;
    Ok(LoadedImage {
        entry,
        image_end: ram_base + end_offset,
        page_size: header.page_size(),
    })
}

/// Start of the DTB's slot: the first [`DTB_ALIGN`] boundary at or above
/// `image_end` (and `ram.base`); `None` on overflow.
fn dtb_slot(ram: RamRange, image_end: u64) -> Option<u64> {
    image_end.max(ram.base).checked_next_multiple_of(DTB_ALIGN)
}

/// Guest-physical address for a DTB of `dtb_len` bytes: the first
/// [`DTB_ALIGN`] boundary at or above `image_end`, so it overlaps neither the
/// kernel nor its BSS and sits in its own 2 MiB block. Checks the 2 MiB size
/// limit and that it ends inside `ram`.
pub fn dtb_address(ram: RamRange, image_end: u64, dtb_len: u64) -> Result<u64, ImageError> {
    if dtb_len > DTB_MAX_SIZE {
        return Err(ImageError::DtbTooLarge { len: dtb_len });
    }
    let no_room = || ImageError::DtbDoesNotFit {
        len: dtb_len,
        image_end,
        ram_size: ram.size,
    };
    let addr = dtb_slot(ram, image_end).ok_or_else(no_room)?;
    if !ram.contains_range(addr, dtb_len) {
        return Err(no_room());
    }
    Ok(addr)
}

/// Guest-physical address for an initrd of `len` bytes, given the kernel
/// loaded at `entry` with its footprint ending at `image_end`: the end of
/// the DTB's slot (the DTB is at [`dtb_address`] and at most
/// [`DTB_MAX_SIZE`] bytes), so it overlaps neither the kernel, nor its
/// BSS, nor the DTB, whatever the DTB's length. The address is 2 MiB
/// aligned (the protocol asks none; this keeps it out of the DTB's
/// block). Checks that `[addr, addr + len)` lies in `ram` and in the
/// protocol's window: [`INITRD_WINDOW`] bytes from the
/// [`INITRD_WINDOW_ALIGN`] boundary at or below `entry`.
pub fn initrd_address(
    ram: RamRange,
    entry: u64,
    image_end: u64,
    len: u64,
) -> Result<u64, ImageError> {
    let gpa = dtb_slot(ram, image_end)
        .and_then(|dtb| dtb.checked_add(DTB_MAX_SIZE))
        .unwrap_or(u64::MAX);
    if !ram.contains_range(gpa, len) {
        return Err(ImageError::InitrdDoesNotFit {
            len,
            gpa,
            ram_size: ram.size,
        });
    }
    let window_end = (entry - entry % INITRD_WINDOW_ALIGN).saturating_add(INITRD_WINDOW);
    if gpa.checked_add(len).is_none_or(|end| end > window_end) {
        return Err(ImageError::InitrdOutsideWindow {
            len,
            gpa,
            window_end,
        });
    }
    Ok(gpa)
}

/// How a kernel file is packed, from its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelPacking {
    /// Not compressed: an `Image` (or something else [`load_image`] refuses).
    Raw,
    /// gzip (RFC 1952 magic `1f 8b`): `Image.gz`, which [`unpack_kernel`]
    /// decompresses.
    Gzip,
}

/// Magic numbers of the compressed formats `boot` refuses (those the
/// kernel's `make` targets and distributions produce), with their names.
const REFUSED_MAGICS: [(&[u8], &str); 6] = [
    (&[0x28, 0xb5, 0x2f, 0xfd], "zstd"),
    (&[0xfd, b'7', b'z', b'X', b'Z', 0x00], "xz"),
    (&[0x04, 0x22, 0x4d, 0x18], "lz4"),
    // The lz4 "legacy" frame, which the kernel's `lz4 -l` writes.
    (&[0x02, 0x21, 0x4c, 0x18], "lz4"),
    (b"BZh", "bzip2"),
    (&[0x89, b'L', b'Z', b'O'], "lzo"),
];

/// How `file` is packed: [`KernelPacking::Gzip`], or raw; an EFI zboot
/// image (`MZ`, then `zimg` at offset 4, its payload's compression named
/// at offset 0x18) and the formats of `REFUSED_MAGICS` are refused.
pub fn kernel_packing(file: &[u8]) -> Result<KernelPacking, ImageError> {
    if file.starts_with(&[0x1f, 0x8b]) {
        return Ok(KernelPacking::Gzip);
    }
    if file.starts_with(EFI_STUB_MAGIC) && file.get(4..8) == Some(&b"zimg"[..]) {
        // A NUL-terminated name in a 32-byte field; printed, so only its
        // printable ASCII.
        let field = file.get(0x18..0x38).unwrap_or_default();
        let compression = field
            .iter()
            .take_while(|&&b| b != 0)
            .filter(|b| b.is_ascii_graphic())
            .map(|&b| char::from(b))
            .collect();
        return Err(ImageError::EfiZboot { compression });
    }
    match REFUSED_MAGICS
        .iter()
        .find(|(magic, _)| file.starts_with(magic))
    {
        Some(&(_, format)) => Err(ImageError::Compressed { format }),
        None => Ok(KernelPacking::Raw),
    }
}

/// The Image in the kernel file `file`: `file` itself if it is raw, else
/// its gzip stream decompressed, refused past `limit` bytes
/// ([`ImageError::GzipTooLarge`]) before more is held in memory. Other
/// compressions are refused ([`kernel_packing`]).
pub fn unpack_kernel(file: Vec<u8>, limit: u64) -> Result<(Vec<u8>, KernelPacking), ImageError> {
    use std::io::Read;
    let packing = kernel_packing(&file)?;
    if packing == KernelPacking::Raw {
        return Ok((file, packing));
    }
    let mut image = Vec::new();
    flate2::read::GzDecoder::new(file.as_slice())
        .take(limit.saturating_add(1))
        .read_to_end(&mut image)
        .map_err(ImageError::Gzip)?;
    if image.len() as u64 > limit {
        return Err(ImageError::GzipTooLarge { limit });
    }
    Ok((image, packing))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::layout::RAM_BASE;
    use vm_memory::GuestMemoryMmap;

    /// A synthetic Image: header fields as given, then `body` bytes of 0xAA.
    fn image(text_offset: u64, image_size: u64, flags: u64, body: usize) -> Vec<u8> {
        let mut v = vec![0u8; HEADER_SIZE + body];
        v[0..4].copy_from_slice(&0x9100_0000u32.to_le_bytes()); // code0: an A64 `add`
        v[4..8].copy_from_slice(&0x1400_0010u32.to_le_bytes()); // code1: `b` over the header
        v[0x08..0x10].copy_from_slice(&text_offset.to_le_bytes());
        v[0x10..0x18].copy_from_slice(&image_size.to_le_bytes());
        v[0x18..0x20].copy_from_slice(&flags.to_le_bytes());
        v[0x38..0x3c].copy_from_slice(&IMAGE_MAGIC.to_le_bytes());
        v[HEADER_SIZE..].fill(0xaa);
        v
    }

    const RAM: u64 = 16 * MIB;

    /// 16 MiB of guest memory at [`RAM_BASE`] and its range.
    fn guest_ram() -> (GuestMemoryMmap, RamRange) {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(RAM_BASE), RAM as usize)]).unwrap();
        let range = RamRange {
            base: RAM_BASE,
            size: RAM,
        };
        (mem, range)
    }

    #[test]
    fn loads_modern_image_with_bss() {
        let (mem, ram) = guest_ram();
        // text_offset 0 (Linux >= 5.8), 16K pages (flags bits 1-2 = 2),
        // image_size larger than the file because of BSS.
        let img = image(0, 3 * MIB, 2 << 1 | 1 << 3, 4096);
        let loaded = load_image(&mem, ram, &img).unwrap();
        assert_eq!(loaded.entry, RAM_BASE);
        assert_eq!(loaded.image_end, RAM_BASE + 3 * MIB);
        assert_eq!(loaded.page_size, Some(16 * 1024));
        let mut back = vec![0u8; img.len()];
        mem.read_slice(&mut back, GuestAddress(RAM_BASE)).unwrap();
        assert_eq!(back, img);
        let dtb = dtb_address(ram, loaded.image_end, 1800).unwrap();
        assert_eq!(dtb, RAM_BASE + 4 * MIB);
        assert_eq!(dtb % 8, 0);
    }

    #[test]
    fn honours_text_offset_and_legacy_header() {
        let (mem, ram) = guest_ram();
        let loaded = load_image(&mem, ram, &image(0x8_0000, MIB, 0, 64)).unwrap();
        assert_eq!(loaded.entry, RAM_BASE + 0x8_0000);
        assert_eq!(loaded.image_end, RAM_BASE + 0x8_0000 + MIB);
        assert_eq!(loaded.page_size, None);
        // image_size 0: text_offset is taken as 0x80000 whatever the field
        // says, flags are ignored and the file size is the footprint.
        let old = image(0xdead_beef, 0, 1, 1000);
        let loaded = load_image(&mem, ram, &old).unwrap();
        assert_eq!(loaded.entry, RAM_BASE + LEGACY_TEXT_OFFSET);
        assert_eq!(loaded.image_end, loaded.entry + old.len() as u64);
        // The DTB goes at the next 2 MiB boundary.
        assert_eq!(
            dtb_address(ram, loaded.image_end, 100).unwrap(),
            RAM_BASE + 2 * MIB
        );
        // image_end already aligned: no gap.
        assert_eq!(
            dtb_address(ram, RAM_BASE + 2 * MIB, 100).unwrap(),
            RAM_BASE + 2 * MIB
        );
    }

    #[test]
    fn rejects_bad_headers_with_one_line_messages() {
        let (mem, ram) = guest_ram();
        let e = load_image(&mem, ram, &[0u8; 10]).unwrap_err();
        assert!(matches!(e, ImageError::TooShort { len: 10 }));
        assert!(e.to_string().starts_with("not an arm64 Image"));

        let mut elf = image(0, MIB, 0, 100);
        elf[0x38..0x3c].copy_from_slice(b"\x7fELF");
        let e = load_image(&mem, ram, &elf).unwrap_err();
        assert_eq!(
            e.to_string(),
            "not an arm64 Image (bad magic 0x464c457f at offset 0x38, expected 0x644d5241 \"ARM\\x64\")"
        );

        let e = load_image(&mem, ram, &image(0, MIB, 1, 100)).unwrap_err();
        assert!(matches!(e, ImageError::BigEndian { flags: 1 }));
        assert!(e.to_string().starts_with("big-endian kernel"));
    }

    #[test]
    fn rejects_kernels_that_do_not_fit() {
        let (mem, ram) = guest_ram();
        // The file fits but its BSS does not.
        let e = load_image(&mem, ram, &image(0, 17 * MIB, 0, 100)).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "kernel ({} bytes incl. BSS, at offset 0x0 into RAM) does not fit in 16 MiB of RAM",
                17 * MIB
            )
        );
        // Exactly full is fine.
        assert!(load_image(&mem, ram, &image(0, 16 * MIB, 0, 100)).is_ok());
        // text_offset pushes it out.
        assert!(matches!(
            load_image(&mem, ram, &image(MIB, 16 * MIB, 0, 100)),
            Err(ImageError::DoesNotFit {
                offset: 0x10_0000,
                ..
            })
        ));
        // Overflowing header values do not panic.
        assert!(load_image(&mem, ram, &image(u64::MAX, u64::MAX, 0, 100)).is_err());
        assert!(load_image(&mem, ram, &image(0, u64::MAX, 0, 100)).is_err());
    }

    /// `image`, its code1 a branch to `target` (as the guest's kernel:
    /// code0 a `nop`, code1 `b primary_entry`).
    fn branching(target: u64, image_size: u64, body: usize) -> Vec<u8> {
        let mut v = image(0, image_size, 2 << 1, body);
        v[0..4].copy_from_slice(&0xd503_201fu32.to_le_bytes());
        let b = 0x1400_0000 | ((target - 4) / 4) as u32;
        v[4..8].copy_from_slice(&b.to_le_bytes());
        v
    }

    #[test]
    fn refuses_a_truncated_kernel() {
        let (mem, ram) = guest_ram();
        // A valid header, 100 bytes in all, of a kernel whose entry code
        // is 5 MiB in (as the guest's, whose code1 jumps to 0x521038).
        let cut = branching(0x52_1038, 7 * MIB + MIB / 2, 100 - HEADER_SIZE);
        let e = load_image(&mem, ram, &cut).unwrap_err();
        assert!(matches!(e, ImageError::Truncated { len: 100, .. }), "{e}");
        assert_eq!(
            e.to_string(),
            "truncated arm64 Image: the file is 100 bytes, but its entry branch (code1: b 0x521038) implies at least 5378108"
        );
        // Whole, it loads.
        let whole = branching(0x52_1038, 7 * MIB + MIB / 2, 7 * MIB as usize);
        assert!(load_image(&mem, ram, &whole).is_ok());
        // A small kernel with a large BSS (the conformance images: 16 KiB
        // of file, 1.6 MiB of image) loads: code0 jumps to 0x800.
        let mut small = image(0x8_0000, 1_671_360, 0, 16_679 - HEADER_SIZE);
        small[0..4].copy_from_slice(&(0x1400_0000u32 | (0x800 / 4)).to_le_bytes());
        assert!(load_image(&mem, ram, &small).is_ok());
        small.truncate(0x700);
        assert!(matches!(
            load_image(&mem, ram, &small),
            Err(ImageError::Truncated { needed: 0x804, .. })
        ));
    }

    /// An EFI-stub Image: `MZ`, a PE header at 0x40 with `sections`
    /// `(raw offset, raw size)`, and `body` bytes in all after the header.
    fn efi_image(sections: &[(u32, u32)], len: usize) -> Vec<u8> {
        let mut v = image(0, MIB, 0, len - HEADER_SIZE);
        v[0..2].copy_from_slice(b"MZ");
        v[0x3c..0x40].copy_from_slice(&0x40u32.to_le_bytes());
        let pe = 0x40;
        let table = pe + 24;
        v[pe..pe + 4].copy_from_slice(b"PE\0\0");
        v[pe + 6..pe + 8].copy_from_slice(&(sections.len() as u16).to_le_bytes());
        v[pe + 20..pe + 22].copy_from_slice(&0u16.to_le_bytes());
        for (i, (at, size)) in sections.iter().enumerate() {
            let e = table + i * 40;
            v[e..e + 40].fill(0);
            v[e + 16..e + 20].copy_from_slice(&size.to_le_bytes());
            v[e + 20..e + 24].copy_from_slice(&at.to_le_bytes());
        }
        v
    }

    #[test]
    fn refuses_an_efi_stub_kernel_shorter_than_its_sections() {
        let (mem, ram) = guest_ram();
        let len = (MIB as usize) * 3 / 4;
        let ok = efi_image(&[(0x1000, 0x8000), (0x9000, (len - 0x9000) as u32)], len);
        assert!(load_image(&mem, ram, &ok).is_ok());
        // The last section's raw data runs past the end of the file.
        let short = efi_image(&[(0x1000, 0x8000), (0x9000, len as u32)], len);
        let e = load_image(&mem, ram, &short).unwrap_err();
        assert!(
            matches!(e, ImageError::Truncated { needed, .. } if needed == 0x9000 + len as u64),
            "{e}"
        );
        assert!(e.to_string().contains("its PE section table"), "{e}");
        // Cut inside the PE header itself.
        let mut cut = ok.clone();
        cut[0x3c..0x40].copy_from_slice(&(len as u32 - 8).to_le_bytes());
        let e = load_image(&mem, ram, &cut).unwrap_err();
        assert!(matches!(e, ImageError::Truncated { .. }), "{e}");
    }

    #[test]
    fn dtb_placement_limits() {
        let (_, ram) = guest_ram();
        assert!(matches!(
            dtb_address(ram, RAM_BASE + MIB, DTB_MAX_SIZE + 1),
            Err(ImageError::DtbTooLarge { .. })
        ));
        assert_eq!(
            dtb_address(ram, RAM_BASE + 13 * MIB, DTB_MAX_SIZE).unwrap(),
            RAM_BASE + 14 * MIB
        );
        let e = dtb_address(ram, RAM_BASE + 14 * MIB + 1, 4096).unwrap_err();
        assert!(e
            .to_string()
            .starts_with("no room for the 4096-byte device tree"));
        assert!(dtb_address(ram, u64::MAX - 5, 16).is_err());
        assert!(dtb_address(ram, RAM_BASE + 15 * MIB, DTB_MAX_SIZE).is_err());
    }

    #[test]
    fn the_initrd_goes_after_the_dtb_slot_and_overlaps_nothing() {
        let (mem, ram) = guest_ram();
        let img = image(0, 3 * MIB + 4096, 2 << 1, 4096);
        let k = load_image(&mem, ram, &img).unwrap();
        let dtb = dtb_address(ram, k.image_end, DTB_MAX_SIZE).unwrap();
        let len = 3 * MIB + 5;
        let initrd = initrd_address(ram, k.entry, k.image_end, len).unwrap();
        // Kernel [0, 3 MiB + 4 KiB), DTB at 4 MiB (up to 2 MiB), initrd at 6 MiB.
        assert_eq!(dtb, RAM_BASE + 4 * MIB);
        assert_eq!(initrd, RAM_BASE + 6 * MIB);
        assert!(initrd >= k.image_end && initrd >= dtb + DTB_MAX_SIZE);
        // The DTB's address does not depend on its length, so the initrd
        // never overlaps it whatever the DTB's final size.
        assert_eq!(dtb_address(ram, k.image_end, 1).unwrap(), dtb);
        // Up to the end of RAM fits; one byte more does not.
        let room = RAM_BASE + RAM - initrd;
        assert_eq!(
            initrd_address(ram, k.entry, k.image_end, room).unwrap(),
            initrd
        );
        let e = initrd_address(ram, k.entry, k.image_end, room + 1).unwrap_err();
        assert!(matches!(e, ImageError::InitrdDoesNotFit { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            format!(
                "no room for the {}-byte initrd at 0x40600000 (above the kernel and the device tree) in 16 MiB of RAM",
                room + 1
            )
        );
        // A kernel filling RAM leaves no room; huge values do not panic.
        assert!(initrd_address(ram, k.entry, RAM_BASE + RAM, 1).is_err());
        assert!(initrd_address(ram, k.entry, u64::MAX - 5, 1).is_err());
        assert!(initrd_address(ram, k.entry, k.image_end, u64::MAX).is_err());
    }

    #[test]
    fn the_initrd_stays_in_the_32_gib_window_of_the_kernel() {
        // 40 GiB of RAM (no memory behind it: placement only).
        let ram = RamRange {
            base: RAM_BASE,
            size: 40 << 30,
        };
        let entry = RAM_BASE;
        let image_end = RAM_BASE + 3 * MIB;
        let gpa = RAM_BASE + 6 * MIB;
        let window_end = RAM_BASE + INITRD_WINDOW;
        assert_eq!(
            initrd_address(ram, entry, image_end, window_end - gpa).unwrap(),
            gpa
        );
        let e = initrd_address(ram, entry, image_end, window_end - gpa + 1).unwrap_err();
        assert!(
            matches!(e, ImageError::InitrdOutsideWindow { window_end: w, .. } if w == window_end),
            "{e}"
        );
        assert!(e.to_string().contains("one 32 GiB window"), "{e}");
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn a_gzip_kernel_is_decompressed_within_its_bound() {
        let img = image(0, MIB, 2 << 1, 100_000);
        let gz = gzip(&img);
        assert_eq!(kernel_packing(&gz).unwrap(), KernelPacking::Gzip);
        let (out, packing) = unpack_kernel(gz.clone(), img.len() as u64).unwrap();
        assert_eq!(
            (out.as_slice(), packing),
            (img.as_slice(), KernelPacking::Gzip)
        );
        // One byte over the bound is refused.
        let e = unpack_kernel(gz.clone(), img.len() as u64 - 1).unwrap_err();
        assert!(matches!(e, ImageError::GzipTooLarge { .. }), "{e}");
        // A stream cut short or corrupted is an error, not a short Image.
        let e = unpack_kernel(gz[..gz.len() / 2].to_vec(), 1 << 30).unwrap_err();
        assert!(matches!(e, ImageError::Gzip(_)), "{e}");
        assert!(e
            .to_string()
            .starts_with("cannot decompress the gzip-compressed kernel"));
        let mut bad = gz.clone();
        let mid = bad.len() / 2;
        bad[mid] ^= 0xff;
        assert!(unpack_kernel(bad, 1 << 30).is_err());
        // A raw Image passes through untouched.
        let (out, packing) = unpack_kernel(img.clone(), 0).unwrap();
        assert_eq!((out, packing), (img, KernelPacking::Raw));
    }

    #[test]
    fn other_compressions_and_efi_zboot_are_refused_by_name() {
        for (magic, name) in REFUSED_MAGICS {
            let mut file = magic.to_vec();
            file.resize(4096, 0);
            let e = kernel_packing(&file).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("the kernel is {name}-compressed: boot decompresses gzip (Image.gz) only; decompress it to the raw Image first")
            );
        }
        // EFI zboot: MZ, "zimg", payload offset and size, then the
        // compression's name at 0x18.
        let mut zboot = vec![0u8; 4096];
        zboot[0..2].copy_from_slice(b"MZ");
        zboot[4..8].copy_from_slice(b"zimg");
        zboot[0x18..0x1c].copy_from_slice(b"zstd");
        let e = kernel_packing(&zboot).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("the kernel is an EFI zboot image (zstd-compressed Image"),
            "{e}"
        );
        // The name is the file's: only its printable ASCII is shown.
        zboot[0x18..0x20].copy_from_slice(b"g\x1b[2Jzip");
        let e = kernel_packing(&zboot).unwrap_err();
        assert!(
            matches!(&e, ImageError::EfiZboot { compression } if compression == "g[2Jzip"),
            "{e}"
        );
        // An EFI-stub Image (MZ, no zimg) is a raw Image.
        let efi = efi_image(&[(0x1000, 0x100)], 0x2000);
        assert_eq!(kernel_packing(&efi).unwrap(), KernelPacking::Raw);
    }
}
