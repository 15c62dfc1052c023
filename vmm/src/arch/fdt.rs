//! The flattened device tree handed to the guest kernel, built from the
//! memory map in [`crate::arch::layout`] with `vm-fdt`.
//!
//! Node and property choices follow QEMU's `virt` machine with GICv3, so a
//! kernel that boots there finds the same description here. Bindings: Linux
//! `Documentation/devicetree/bindings/` (`arm/cpus.yaml`, `arm/psci.yaml`,
//! `timer/arm,arch_timer.yaml`, `interrupt-controller/arm,gic-v3.yaml`,
//! `serial/arm,pl011.yaml`, `rtc/arm,pl031.yaml`, `virtio/mmio.yaml`, `rng/microsoft,vmgenid.yaml`,
//! `reserved-memory/reserved-memory.yaml`, `chosen.yaml`).

use crate::arch::layout::{
    self, RamRange, APB_PCLK_HZ, GICD_BASE, GICD_SIZE, GICR_BASE, GICR_STRIDE, MAX_VCPUS,
    PAGE_SIZE, PL011, PL031, RAM_BASE, RAM_MAX, SPI_BASE_INTID, TIMER_PPIS, VIRTIO_MMIO_SLOTS,
    VMGENID_INTID, VMGENID_SIZE,
};
use crate::arch::psci::mpidr_affinity;
use vm_fdt::FdtWriter;

/// Longest kernel command line arm64 Linux accepts, excluding the NUL
/// (`COMMAND_LINE_SIZE` = 2048 in `arch/arm64/include/uapi/asm/setup.h`).
pub const CMDLINE_MAX: usize = 2047;

/// Phandle of the GIC (the root's `interrupt-parent`).
pub const GIC_PHANDLE: u32 = 1;
/// Phandle of the `apb-pclk` fixed clock.
pub const APB_PCLK_PHANDLE: u32 = 2;

/// First PPI INTID (GICv3 spec 2.2.1): PPI cells hold `intid - 16`.
const PPI_BASE_INTID: u32 = 16;
/// GIC binding interrupt type cell: SPI.
const GIC_SPI: u32 = 0;
/// GIC binding interrupt type cell: PPI.
const GIC_PPI: u32 = 1;
/// Interrupt flags cell: level-triggered, active high.
const IRQ_TYPE_LEVEL_HIGH: u32 = 4;
/// Interrupt flags cell: rising edge.
const IRQ_TYPE_EDGE_RISING: u32 = 1;

/// What the device tree describes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FdtConfig {
    /// Number of vCPUs, 1..=[`MAX_VCPUS`]. vCPU n gets `cpu@n` with
    /// `reg` = [`mpidr_affinity`]`(n)`.
    pub vcpus: usize,
    /// RAM size in bytes, at [`RAM_BASE`] (non-zero, at most [`RAM_MAX`]).
    pub ram_size: u64,
    /// Kernel command line (`/chosen/bootargs`), at most [`CMDLINE_MAX`]
    /// bytes, no NUL.
    pub cmdline: String,
    /// Entropy for `/chosen/rng-seed` (the kernel credits it to its RNG).
    /// Should be `Some` with fresh host randomness outside tests.
    pub rng_seed: Option<[u8; 32]>,
    /// Seed for `/chosen/kaslr-seed`: a kernel built with
    /// `CONFIG_RANDOMIZE_BASE` (distribution kernels) randomises its
    /// virtual layout from it, and zeroes it in the DTB. Should be `Some`
    /// with fresh host randomness outside tests.
    pub kaslr_seed: Option<u64>,
    /// virtio-mmio slots that have a device (each `< VIRTIO_MMIO_SLOTS`, no
    /// duplicates); one node per slot, in the order given.
    pub virtio_slots: Vec<u32>,
    /// Where the initrd is in guest RAM, `start..end` (guest-physical,
    /// `end` exclusive): `/chosen/linux,initrd-start` and `-end`. Non-empty
    /// and inside RAM.
    pub initrd: Option<std::ops::Range<u64>>,
}

/// Errors building the device tree.
#[derive(Debug, thiserror::Error)]
pub enum FdtError {
    /// vCPU count out of range.
    #[error("{0} vCPUs requested; the machine supports 1 to {MAX_VCPUS}")]
    VcpuCount(usize),
    /// RAM size out of range.
    #[error("RAM size {0} bytes must be a multiple of {PAGE_SIZE} bytes, at least two such pages and at most {RAM_MAX} bytes")]
    RamSize(u64),
    /// A virtio slot that does not exist.
    #[error("virtio-mmio slot {0} does not exist (slots are 0 to {last})", last = VIRTIO_MMIO_SLOTS - 1)]
    VirtioSlot(u32),
    /// A virtio slot listed twice.
    #[error("virtio-mmio slot {0} is listed twice")]
    DuplicateVirtioSlot(u32),
    /// Command line too long for the kernel.
    #[error("kernel command line is {0} bytes; arm64 Linux accepts at most {CMDLINE_MAX}")]
    CmdlineTooLong(usize),
    /// Command line with a NUL byte.
    #[error("kernel command line contains a NUL byte")]
    CmdlineNul,
    /// An initrd range that is empty or not inside RAM.
    #[error("initrd {0:#x?} is empty or not inside guest RAM")]
    InitrdRange(std::ops::Range<u64>),
    /// vm-fdt rejected the tree.
    #[error("cannot build the device tree: {0}")]
    Fdt(#[from] vm_fdt::Error),
}

fn spi(intid: u32) -> [u32; 3] {
    [GIC_SPI, intid - SPI_BASE_INTID, IRQ_TYPE_LEVEL_HIGH]
}

fn ppi(intid: u32) -> [u32; 3] {
    [GIC_PPI, intid - PPI_BASE_INTID, IRQ_TYPE_LEVEL_HIGH]
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn validate(cfg: &FdtConfig) -> Result<(), FdtError> {
    if cfg.vcpus == 0 || cfg.vcpus > MAX_VCPUS {
        return Err(FdtError::VcpuCount(cfg.vcpus));
    }
    if cfg.ram_size < 2 * PAGE_SIZE || cfg.ram_size % PAGE_SIZE != 0 || cfg.ram_size > RAM_MAX {
        return Err(FdtError::RamSize(cfg.ram_size));
    }
    if cfg.cmdline.len() > CMDLINE_MAX {
        return Err(FdtError::CmdlineTooLong(cfg.cmdline.len()));
    }
    if cfg.cmdline.contains('\0') {
        return Err(FdtError::CmdlineNul);
    }
    if let Some(initrd) = &cfg.initrd {
        let ram = RamRange {
            base: RAM_BASE,
            size: cfg.ram_size,
        };
        if initrd.is_empty() || !ram.contains_range(initrd.start, initrd.end - initrd.start) {
            return Err(FdtError::InitrdRange(initrd.clone()));
        }
    }
    for (i, &slot) in cfg.virtio_slots.iter().enumerate() {
        if slot >= VIRTIO_MMIO_SLOTS {
            return Err(FdtError::VirtioSlot(slot));
        }
        if cfg.virtio_slots[..i].contains(&slot) {
            return Err(FdtError::DuplicateVirtioSlot(slot));
        }
    }
    Ok(())
}

/// Name of the PL011 node; also the `/chosen/stdout-path`.
fn pl011_node() -> String {
    format!("pl011@{:x}", PL011.base)
}

/// Builds the DTB (a big-endian flattened device tree, version 17).
///
/// Nodes: `/` (`linux,dummy-virt`, 2 address and size cells,
/// `interrupt-parent` = GIC), `/memory@40000000`, `/cpus/cpu@N` (PSCI enable
/// method), `/psci` (1.0, method `hvc`), `/timer` (the four
/// [`TIMER_PPIS`], no `clock-frequency`: the kernel reads CNTFRQ_EL0),
/// `/intc@8000000` (GICv3; GICR sized for `vcpus`), `/apb-pclk`,
/// `/pl011@9000000`, `/pl031@9010000`, `/vmgenid@...` (the VM generation
/// ID, in the last RAM page, which `/reserved-memory` keeps from the
/// kernel), `/virtio_mmio@...` per slot (`dma-coherent`) and `/chosen`
/// (bootargs, stdout-path, rng-seed, kaslr-seed, and with an initrd
/// `linux,initrd-start`/`-end`).
pub fn build_fdt(cfg: &FdtConfig) -> Result<Vec<u8>, FdtError> {
    validate(cfg)?;
    let mut fdt = FdtWriter::new()?;

    let root = fdt.begin_node("")?;
    fdt.property_string("compatible", "linux,dummy-virt")?;
    fdt.property_string("model", "Ignition aarch64 VM")?;
    fdt.property_u32("#address-cells", 2)?;
    fdt.property_u32("#size-cells", 2)?;
    fdt.property_u32("interrupt-parent", GIC_PHANDLE)?;

    // The VM generation ID's page: out of the kernel's memory, mapped by its
    // driver (Linux `drivers/virt/vmgenid.c`, binding
    // `devicetree/bindings/rng/microsoft,vmgenid.yaml`).
    let vmgenid = layout::vmgenid_gpa(RamRange {
        base: RAM_BASE,
        size: cfg.ram_size,
    });
    memory_nodes(&mut fdt, cfg.ram_size, vmgenid)?;
    cpu_nodes(&mut fdt, cfg.vcpus)?;
    gic_node(&mut fdt, cfg.vcpus)?;
    device_nodes(&mut fdt, cfg, vmgenid)?;

    let chosen = fdt.begin_node("chosen")?;
    fdt.property_string("bootargs", &cfg.cmdline)?;
    fdt.property_string("stdout-path", &format!("/{}", pl011_node()))?;
    if let Some(seed) = &cfg.rng_seed {
        fdt.property("rng-seed", seed)?;
    }
    if let Some(seed) = cfg.kaslr_seed {
        fdt.property_u64("kaslr-seed", seed)?;
    }
    if let Some(initrd) = &cfg.initrd {
        // Linux reads either width (`of_read_number` of the property's
        // length); 64-bit as RAM may lie above 4 GiB.
        fdt.property_u64("linux,initrd-start", initrd.start)?;
        fdt.property_u64("linux,initrd-end", initrd.end)?;
    }
    fdt.end_node(chosen)?;

    fdt.end_node(root)?;
    Ok(fdt.finish()?)
}

/// `/memory@40000000`, and `/reserved-memory` keeping the VM generation
/// ID's page at `vmgenid` from the kernel.
fn memory_nodes(fdt: &mut FdtWriter, ram_size: u64, vmgenid: u64) -> Result<(), FdtError> {
    let memory = fdt.begin_node(&format!("memory@{RAM_BASE:x}"))?;
    fdt.property_string("device_type", "memory")?;
    fdt.property_array_u64("reg", &[RAM_BASE, ram_size])?;
    fdt.end_node(memory)?;

    let reserved = fdt.begin_node("reserved-memory")?;
    fdt.property_u32("#address-cells", 2)?;
    fdt.property_u32("#size-cells", 2)?;
    fdt.property_null("ranges")?;
    let page = fdt.begin_node(&format!("vmgenid@{vmgenid:x}"))?;
    fdt.property_array_u64("reg", &[vmgenid, PAGE_SIZE])?;
    fdt.property_null("no-map")?;
    fdt.end_node(page)?;
    fdt.end_node(reserved)?;
    Ok(())
}

/// `/cpus/cpu@N` for `vcpus` vCPUs (PSCI enable method), `/psci` and
/// `/timer`.
fn cpu_nodes(fdt: &mut FdtWriter, vcpus: usize) -> Result<(), FdtError> {
    let cpus = fdt.begin_node("cpus")?;
    // Aff3 is always 0 for our vCPU counts, so one address cell holds
    // Aff2..Aff0.
    fdt.property_u32("#address-cells", 1)?;
    fdt.property_u32("#size-cells", 0)?;
    for n in 0..vcpus {
        let reg = u32::try_from(mpidr_affinity(n)).map_err(|_| FdtError::VcpuCount(vcpus))?;
        let cpu = fdt.begin_node(&format!("cpu@{reg:x}"))?;
        fdt.property_string("device_type", "cpu")?;
        fdt.property_string("compatible", "arm,arm-v8")?;
        fdt.property_u32("reg", reg)?;
        fdt.property_string("enable-method", "psci")?;
        fdt.end_node(cpu)?;
    }
    fdt.end_node(cpus)?;

    let psci = fdt.begin_node("psci")?;
    fdt.property_string_list("compatible", strings(&["arm,psci-1.0", "arm,psci-0.2"]))?;
    fdt.property_string("method", "hvc")?;
    fdt.end_node(psci)?;

    let timer = fdt.begin_node("timer")?;
    fdt.property_string("compatible", "arm,armv8-timer")?;
    let cells: Vec<u32> = TIMER_PPIS.iter().flat_map(|&intid| ppi(intid)).collect();
    fdt.property_array_u32("interrupts", &cells)?;
    fdt.property_null("always-on")?;
    fdt.end_node(timer)?;
    Ok(())
}

/// `/intc@8000000`: the GICv3 with the redistributors of `vcpus` vCPUs.
fn gic_node(fdt: &mut FdtWriter, vcpus: usize) -> Result<(), FdtError> {
    let intc = fdt.begin_node(&format!("intc@{GICD_BASE:x}"))?;
    fdt.property_string("compatible", "arm,gic-v3")?;
    fdt.property_u32("#interrupt-cells", 3)?;
    // No child nodes (no ITS); dtc's interrupt_provider check wants this.
    fdt.property_u32("#address-cells", 0)?;
    fdt.property_null("interrupt-controller")?;
    let gicr_size = GICR_STRIDE * vcpus as u64;
    fdt.property_array_u64("reg", &[GICD_BASE, GICD_SIZE, GICR_BASE, gicr_size])?;
    fdt.property_u32("#redistributor-regions", 1)?;
    fdt.property_phandle(GIC_PHANDLE)?;
    fdt.end_node(intc)?;
    Ok(())
}

/// The devices: `/apb-pclk`, `/pl011@9000000`, `/vmgenid@...` (at
/// `vmgenid`) and a `/virtio_mmio@...` per slot of `cfg`.
fn device_nodes(fdt: &mut FdtWriter, cfg: &FdtConfig, vmgenid: u64) -> Result<(), FdtError> {
    let clock = fdt.begin_node("apb-pclk")?;
    fdt.property_string("compatible", "fixed-clock")?;
    fdt.property_u32("#clock-cells", 0)?;
    fdt.property_u32("clock-frequency", APB_PCLK_HZ)?;
    fdt.property_string("clock-output-names", "clk24mhz")?;
    fdt.property_phandle(APB_PCLK_PHANDLE)?;
    fdt.end_node(clock)?;

    let uart = fdt.begin_node(&pl011_node())?;
    fdt.property_string_list("compatible", strings(&["arm,pl011", "arm,primecell"]))?;
    fdt.property_array_u64("reg", &[PL011.base, PL011.size])?;
    if let Some(intid) = PL011.intid {
        fdt.property_array_u32("interrupts", &spi(intid))?;
    }
    fdt.property_array_u32("clocks", &[APB_PCLK_PHANDLE, APB_PCLK_PHANDLE])?;
    fdt.property_string_list("clock-names", strings(&["uartclk", "apb_pclk"]))?;
    fdt.end_node(uart)?;

    let rtc = fdt.begin_node(&format!("pl031@{:x}", PL031.base))?;
    fdt.property_string_list("compatible", strings(&["arm,pl031", "arm,primecell"]))?;
    fdt.property_array_u64("reg", &[PL031.base, PL031.size])?;
    if let Some(intid) = PL031.intid {
        fdt.property_array_u32("interrupts", &spi(intid))?;
    }
    fdt.property_u32("clocks", APB_PCLK_PHANDLE)?;
    fdt.property_string("clock-names", "apb_pclk")?;
    fdt.end_node(rtc)?;

    let genid = fdt.begin_node(&format!("vmgenid@{vmgenid:x}"))?;
    fdt.property_string("compatible", "microsoft,vmgenid")?;
    fdt.property_array_u64("reg", &[vmgenid, VMGENID_SIZE])?;
    fdt.property_array_u32(
        "interrupts",
        &[
            GIC_SPI,
            VMGENID_INTID - SPI_BASE_INTID,
            IRQ_TYPE_EDGE_RISING,
        ],
    )?;
    fdt.end_node(genid)?;

    for &slot in &cfg.virtio_slots {
        let region = layout::virtio_mmio(slot);
        let node = fdt.begin_node(&format!("virtio_mmio@{:x}", region.base))?;
        fdt.property_string("compatible", "virtio,mmio")?;
        fdt.property_array_u64("reg", &[region.base, region.size])?;
        if let Some(intid) = region.intid {
            fdt.property_array_u32("interrupts", &spi(intid))?;
        }
        fdt.property_null("dma-coherent")?;
        fdt.end_node(node)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::layout::{virtio_mmio, VIRTIO_BLK_SLOT};
    use std::io::Write;
    use std::process::Command;

    fn config() -> FdtConfig {
        FdtConfig {
            vcpus: 2,
            ram_size: 512 << 20,
            cmdline: "console=ttyAMA0 root=/dev/vda rw boottimer=0x9100000".into(),
            rng_seed: Some(std::array::from_fn(|i| i as u8)),
            kaslr_seed: Some(0x0123_4567_89ab_cdef),
            virtio_slots: vec![VIRTIO_BLK_SLOT, 3],
            initrd: None,
        }
    }

    /// Decompiles a DTB with `dtc` and returns (dts, stderr).
    fn dtc(blob: &[u8]) -> (String, String) {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(blob).unwrap();
        let out = Command::new("dtc")
            .args(["-I", "dtb", "-O", "dts", "-o", "-"])
            .arg(file.path())
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run `dtc` ({e}); install device-tree-compiler to run this test")
            });
        assert!(
            out.status.success(),
            "dtc failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    }

    /// The body of the first node called `name` (up to its first `};`).
    fn node<'a>(dts: &'a str, name: &str) -> &'a str {
        let start = dts
            .find(&format!("\t{name} {{"))
            .unwrap_or_else(|| panic!("no node {name} in:\n{dts}"));
        let body = &dts[start..];
        &body[..body.find("};").unwrap()]
    }

    /// `dtc`'s rendering of a 64-bit (address, size) pair: four cells
    /// printed as `0x%02x`.
    fn reg64(addr: u64, size: u64) -> String {
        [
            addr >> 32,
            addr & 0xffff_ffff,
            size >> 32,
            size & 0xffff_ffff,
        ]
        .map(|c| format!("{c:#04x}"))
        .join(" ")
    }

    /// `dtc`'s rendering of a string list: `"a", "b"` (dtc >= 1.7) or
    /// `"a\0b"` (older).
    fn string_list(list: &[&str]) -> [String; 2] {
        [
            format!("\"{}\"", list.join("\", \"")),
            format!("\"{}\"", list.join("\\0")),
        ]
    }

    #[test]
    fn dtc_accepts_the_tree_and_sees_the_layout() {
        let cfg = config();
        let (dts, stderr) = dtc(&build_fdt(&cfg).unwrap());
        assert_eq!(stderr, "", "dtc warnings");

        let has = |needle: &str| {
            assert!(dts.contains(needle), "missing `{needle}` in:\n{dts}");
        };
        let has_list = |prop: &str, list: &[&str]| {
            let forms = string_list(list).map(|v| format!("{prop} = {v};"));
            assert!(
                forms.iter().any(|f| dts.contains(f.as_str())),
                "missing {forms:?} in:\n{dts}"
            );
        };
        has("compatible = \"linux,dummy-virt\";");
        has("#address-cells = <0x02>;");
        has("#size-cells = <0x02>;");
        has("interrupt-parent = <0x01>;");
        has(&format!("memory@{RAM_BASE:x} {{"));
        has("device_type = \"memory\";");
        has(&format!("reg = <{}>;", reg64(RAM_BASE, cfg.ram_size)));

        // CPUs: one node per vCPU, reg = MPIDR affinity, PSCI enable method.
        assert_eq!(dts.matches("device_type = \"cpu\";").count(), cfg.vcpus);
        assert_eq!(dts.matches("enable-method = \"psci\";").count(), cfg.vcpus);
        assert!(node(&dts, "cpu@0").contains("reg = <0x00>;"));
        assert!(node(&dts, "cpu@1").contains("reg = <0x01>;"));
        assert!(node(&dts, "cpu@1").contains("compatible = \"arm,arm-v8\";"));
        assert!(node(&dts, "cpus").contains("#address-cells = <0x01>;"));

        has_list("compatible", &["arm,psci-1.0", "arm,psci-0.2"]);
        has("method = \"hvc\";");

        // Timer: <PPI intid-16 level-high> for 29, 30, 27, 26.
        has("compatible = \"arm,armv8-timer\";");
        has("interrupts = <0x01 0x0d 0x04 0x01 0x0e 0x04 0x01 0x0b 0x04 0x01 0x0a 0x04>;");
        has("always-on;");
        assert!(!node(&dts, "timer").contains("clock-frequency"));

        // GICv3: GICD then GICR for exactly two vCPUs.
        has(&format!("intc@{GICD_BASE:x} {{"));
        has("compatible = \"arm,gic-v3\";");
        has("#interrupt-cells = <0x03>;");
        has("interrupt-controller;");
        has(&format!(
            "reg = <{} {}>;",
            reg64(GICD_BASE, GICD_SIZE),
            reg64(GICR_BASE, 2 * GICR_STRIDE)
        ));
        has("#redistributor-regions = <0x01>;");
        has("phandle = <0x01>;");

        has("compatible = \"fixed-clock\";");
        has(&format!("clock-frequency = <{APB_PCLK_HZ:#x}>;"));
        has("phandle = <0x02>;");

        // PL011: SPI 1 (INTID 33), level-high; two clocks.
        has(&format!("pl011@{:x} {{", PL011.base));
        has_list("compatible", &["arm,pl011", "arm,primecell"]);
        has(&format!("reg = <{}>;", reg64(PL011.base, PL011.size)));
        has("interrupts = <0x00 0x01 0x04>;");
        has("clocks = <0x02 0x02>;");
        has_list("clock-names", &["uartclk", "apb_pclk"]);

        // PL031: SPI 3 (INTID 35), level-high; the APB clock.
        let rtc = node(&dts, &format!("pl031@{:x}", PL031.base));
        assert!(
            rtc.contains("compatible = \"arm,pl031\\0arm,primecell\";"),
            "{rtc}"
        );
        assert!(rtc.contains(&format!("reg = <{}>;", reg64(PL031.base, PL031.size))));
        assert!(rtc.contains("interrupts = <0x00 0x03 0x04>;"), "{rtc}");
        assert!(rtc.contains("clocks = <0x02>;"), "{rtc}");
        assert!(rtc.contains("clock-names = \"apb_pclk\";"), "{rtc}");

        // virtio-mmio slots 0 and 3 only.
        assert_eq!(dts.matches("compatible = \"virtio,mmio\";").count(), 2);
        assert_eq!(dts.matches("dma-coherent;").count(), 2);
        for slot in [0, 3] {
            let r = virtio_mmio(slot);
            has(&format!("virtio_mmio@{:x} {{", r.base));
            has(&format!("reg = <{}>;", reg64(r.base, r.size)));
            has(&format!(
                "interrupts = <0x00 {:#04x} 0x04>;",
                r.intid.unwrap() - SPI_BASE_INTID
            ));
        }
        assert!(!dts.contains(&format!("virtio_mmio@{:x}", virtio_mmio(1).base)));

        // The VM generation ID: 16 bytes at the last RAM page, which
        // /reserved-memory keeps out of the kernel's map; SPI 2, rising edge.
        let genid = RAM_BASE + cfg.ram_size - PAGE_SIZE;
        // (`node` ends at the first `};`, the reserved page's.)
        let reserved = node(&dts, "reserved-memory");
        assert!(reserved.contains("ranges;"), "{reserved}");
        let page = &reserved[reserved.find(&format!("vmgenid@{genid:x} {{")).unwrap()..];
        assert!(page.contains(&format!("reg = <{}>;", reg64(genid, PAGE_SIZE))));
        assert!(page.contains("no-map;"));
        let dev = &dts[dts.rfind(&format!("\tvmgenid@{genid:x} {{")).unwrap()..];
        let dev = &dev[..dev.find("};").unwrap()];
        assert!(dev.contains("compatible = \"microsoft,vmgenid\";"), "{dev}");
        assert!(
            dev.contains(&format!("reg = <{}>;", reg64(genid, 16))),
            "{dev}"
        );
        assert!(dev.contains("interrupts = <0x00 0x02 0x01>;"), "{dev}");

        has(&format!("bootargs = \"{}\";", cfg.cmdline));
        has(&format!("stdout-path = \"/pl011@{:x}\";", PL011.base));
        // dtc shows the 32 seed bytes 0, 1, 2, ... as big-endian cells.
        has("rng-seed = <0x10203 0x4050607 ");
        has("kaslr-seed = <0x1234567 0x89abcdef>;");
    }

    #[test]
    fn sizes_follow_the_vcpu_count() {
        let cfg = FdtConfig {
            vcpus: MAX_VCPUS,
            rng_seed: None,
            kaslr_seed: None,
            virtio_slots: vec![],
            ..config()
        };
        let (dts, stderr) = dtc(&build_fdt(&cfg).unwrap());
        assert_eq!(stderr, "", "dtc warnings");
        assert_eq!(dts.matches("device_type = \"cpu\";").count(), MAX_VCPUS);
        assert!(dts.contains(&format!(
            "reg = <{} {}>;",
            reg64(GICD_BASE, GICD_SIZE),
            reg64(GICR_BASE, layout::GICR_SIZE)
        )));
        assert!(!dts.contains("rng-seed"));
        assert!(!dts.contains("kaslr-seed"));
        assert!(!dts.contains("virtio,mmio"));
    }

    #[test]
    fn rejects_bad_configs() {
        let bad = |f: fn(&mut FdtConfig)| {
            let mut c = config();
            f(&mut c);
            build_fdt(&c).unwrap_err().to_string()
        };
        assert_eq!(
            bad(|c| c.vcpus = 0),
            format!("0 vCPUs requested; the machine supports 1 to {MAX_VCPUS}")
        );
        assert!(bad(|c| c.vcpus = MAX_VCPUS + 1).contains("vCPUs requested"));
        assert!(bad(|c| c.ram_size = 0).starts_with("RAM size 0 bytes"));
        assert!(bad(|c| c.ram_size = RAM_MAX + 1).starts_with("RAM size"));
        assert_eq!(
            bad(|c| c.virtio_slots = vec![32]),
            "virtio-mmio slot 32 does not exist (slots are 0 to 31)"
        );
        assert_eq!(
            bad(|c| c.virtio_slots = vec![1, 2, 1]),
            "virtio-mmio slot 1 is listed twice"
        );
        assert!(bad(|c| c.cmdline = "x".repeat(CMDLINE_MAX + 1)).contains("at most 2047"));
        assert!(build_fdt(&FdtConfig {
            cmdline: "x".repeat(CMDLINE_MAX),
            ..config()
        })
        .is_ok());
        assert_eq!(
            bad(|c| c.cmdline = "a\0b".into()),
            "kernel command line contains a NUL byte"
        );
        let end = RAM_BASE + (512 << 20);
        for range in [
            RAM_BASE + 4096..RAM_BASE + 4096,
            RAM_BASE - 1..RAM_BASE + 10,
            end - 10..end + 1,
            end..end + 10,
        ] {
            let mut c = config();
            c.initrd = Some(range.clone());
            let e = build_fdt(&c).unwrap_err();
            assert!(matches!(&e, FdtError::InitrdRange(r) if *r == range), "{e}");
        }
    }

    #[test]
    fn chosen_has_the_initrd_range_only_with_an_initrd() {
        let (dts, _) = dtc(&build_fdt(&config()).unwrap());
        assert!(!dts.contains("linux,initrd"), "{dts}");
        // Above 4 GiB: both cells of each 64-bit value count.
        let cfg = FdtConfig {
            ram_size: 8 << 30,
            initrd: Some(0x1_4060_0000..0x1_4060_1234),
            ..config()
        };
        let (dts, stderr) = dtc(&build_fdt(&cfg).unwrap());
        assert_eq!(stderr, "", "dtc warnings");
        let chosen = node(&dts, "chosen");
        assert!(
            chosen.contains("linux,initrd-start = <0x01 0x40600000>;"),
            "{chosen}"
        );
        assert!(
            chosen.contains("linux,initrd-end = <0x01 0x40601234>;"),
            "{chosen}"
        );
        // The whole of RAM is a valid range (end exclusive).
        let whole = FdtConfig {
            initrd: Some(RAM_BASE..RAM_BASE + (512 << 20)),
            ..config()
        };
        assert!(build_fdt(&whole).is_ok());
    }
}
