/*
 * Stand-ins for the Hypervisor.framework functions the hvf backend calls,
 * compiled from Apple's prototypes (apple_hv.h) for aarch64 Linux. Each
 * records its arguments as it received them (the C compiler decides where
 * it looks for each), keeps just enough state for the backend's code paths
 * to go on, and returns HV_SUCCESS unless the test asked for an error.
 * hv_vcpu_set_simd_fp_reg is simd_setter.S, which calls
 * probe_set_simd_fp_reg here.
 */
#include "apple_hv.h"

#include <string.h>

#define HV_SUCCESS 0
#define HV_UNSUPPORTED ((hv_return_t)0xfae9400f)

/* The id every vCPU gets: all 64 bits matter. */
#define PROBE_VCPU 0x0123456789abcdefULL
/* mach_absolute_time's answer. */
#define PROBE_TIME 0x00fedcba98765432ULL

/* One recorded call (mirrored by the crate's `Call`). */
struct probe_call {
    char name[48];
    uint64_t args[5];
    uint8_t vec[16];
    uint32_t nargs;
    uint32_t pad;
};
_Static_assert(sizeof(struct probe_call) == 112, "mirrored in src/lib.rs");

#define LOG_MAX 1024
static struct probe_call calls[LOG_MAX];
static uint32_t ncalls;
static hv_return_t next_ret;
static hv_return_t sme_ret = HV_UNSUPPORTED;
static hv_vcpu_sme_state_t sme_state;
static hv_vcpu_exit_t exit_record;
static hv_vcpu_exit_t next_exit;
static uint64_t regs[35];
static hv_simd_fp_uchar16_t simd[32];
static uint64_t sys_regs[1 << 16];
static uint64_t icc_regs[1 << 16];
static char gic_config_object;
static char gic_state_object;

static struct probe_call *rec(const char *name, uint32_t n, uint64_t a0, uint64_t a1, uint64_t a2,
                              uint64_t a3, uint64_t a4) {
    static struct probe_call overflow;
    struct probe_call *c = ncalls < LOG_MAX ? &calls[ncalls++] : &overflow;
    memset(c, 0, sizeof(*c));
    strncpy(c->name, name, sizeof(c->name) - 1);
    c->nargs = n;
    c->args[0] = a0;
    c->args[1] = a1;
    c->args[2] = a2;
    c->args[3] = a3;
    c->args[4] = a4;
    return c;
}

static hv_return_t ret(void) {
    hv_return_t r = next_ret;
    next_ret = HV_SUCCESS;
    return r;
}

#define P(p) ((uint64_t)(uintptr_t)(p))

/* ---- the test's controls ---- */

uint32_t hvf_probe_take(struct probe_call *out, uint32_t max) {
    uint32_t n = ncalls < max ? ncalls : max;
    memcpy(out, calls, n * sizeof(*out));
    ncalls = 0;
    return n;
}

void hvf_probe_fail_next(hv_return_t r) { next_ret = r; }

void hvf_probe_set_sme(hv_return_t r, bool streaming, bool za) {
    sme_ret = r;
    sme_state.streaming_sve_mode_enabled = streaming;
    sme_state.za_storage_enabled = za;
}

void hvf_probe_set_exit(uint32_t reason, uint64_t esr, uint64_t far, uint64_t ipa) {
    next_exit.reason = reason;
    next_exit.exception.syndrome = esr;
    next_exit.exception.virtual_address = far;
    next_exit.exception.physical_address = ipa;
}

/* ---- hv_vm.h ---- */

hv_return_t hv_vm_create(hv_vm_config_t config) {
    rec(__func__, 1, P(config), 0, 0, 0, 0);
    return ret();
}

hv_return_t hv_vm_destroy(void) {
    rec(__func__, 0, 0, 0, 0, 0, 0);
    return ret();
}

hv_return_t hv_vm_get_max_vcpu_count(uint32_t *max_vcpu_count) {
    rec(__func__, 1, P(max_vcpu_count), 0, 0, 0, 0);
    *max_vcpu_count = 8;
    return ret();
}

hv_return_t hv_vm_map(void *addr, hv_ipa_t ipa, size_t size, hv_memory_flags_t flags) {
    rec(__func__, 4, P(addr), ipa, size, flags, 0);
    return ret();
}

hv_return_t hv_vm_unmap(hv_ipa_t ipa, size_t size) {
    rec(__func__, 2, ipa, size, 0, 0, 0);
    return ret();
}

hv_return_t hv_vm_protect(hv_ipa_t ipa, size_t size, hv_memory_flags_t flags) {
    rec(__func__, 3, ipa, size, flags, 0, 0);
    return ret();
}

/* ---- hv_vcpu.h ---- */

hv_return_t hv_vcpu_create(hv_vcpu_t *vcpu, hv_vcpu_exit_t **exit, hv_vcpu_config_t config) {
    rec(__func__, 3, P(vcpu), P(exit), P(config), 0, 0);
    *vcpu = PROBE_VCPU;
    *exit = &exit_record;
    return ret();
}

hv_return_t hv_vcpu_destroy(hv_vcpu_t vcpu) {
    rec(__func__, 1, vcpu, 0, 0, 0, 0);
    return ret();
}

hv_return_t hv_vcpu_run(hv_vcpu_t vcpu) {
    rec(__func__, 1, vcpu, 0, 0, 0, 0);
    exit_record = next_exit;
    return ret();
}

hv_return_t hv_vcpus_exit(hv_vcpu_t *vcpus, uint32_t vcpu_count) {
    rec(__func__, 3, P(vcpus), vcpu_count, vcpu_count ? vcpus[0] : 0, 0, 0);
    return ret();
}

hv_return_t hv_vcpu_get_reg(hv_vcpu_t vcpu, hv_reg_t reg, uint64_t *value) {
    rec(__func__, 3, vcpu, reg, P(value), 0, 0);
    *value = reg < 35 ? regs[reg] : 0;
    return ret();
}

hv_return_t hv_vcpu_set_reg(hv_vcpu_t vcpu, hv_reg_t reg, uint64_t value) {
    rec(__func__, 3, vcpu, reg, value, 0, 0);
    if (reg < 35)
        regs[reg] = value;
    return ret();
}

hv_return_t hv_vcpu_get_simd_fp_reg(hv_vcpu_t vcpu, hv_simd_fp_reg_t reg,
                                    hv_simd_fp_uchar16_t *value) {
    rec(__func__, 3, vcpu, reg, P(value), 0, 0);
    *value = simd[reg % 32];
    return ret();
}

/* Called by simd_setter.S's hv_vcpu_set_simd_fp_reg with its arguments
 * untouched. */
hv_return_t probe_set_simd_fp_reg(hv_vcpu_t vcpu, hv_simd_fp_reg_t reg,
                                  hv_simd_fp_uchar16_t value) {
    struct probe_call *c = rec("hv_vcpu_set_simd_fp_reg", 3, vcpu, reg, 0, 0, 0);
    memcpy(c->vec, &value, 16);
    simd[reg % 32] = value;
    return ret();
}

hv_return_t hv_vcpu_get_sys_reg(hv_vcpu_t vcpu, hv_sys_reg_t reg, uint64_t *value) {
    rec(__func__, 3, vcpu, reg, P(value), 0, 0);
    *value = sys_regs[reg];
    return ret();
}

hv_return_t hv_vcpu_set_sys_reg(hv_vcpu_t vcpu, hv_sys_reg_t reg, uint64_t value) {
    rec(__func__, 3, vcpu, reg, value, 0, 0);
    sys_regs[reg] = value;
    return ret();
}

hv_return_t hv_vcpu_set_pending_interrupt(hv_vcpu_t vcpu, hv_interrupt_type_t type, bool pending) {
    rec(__func__, 3, vcpu, type, pending, 0, 0);
    return ret();
}

hv_return_t hv_vcpu_set_trap_debug_exceptions(hv_vcpu_t vcpu, bool value) {
    rec(__func__, 2, vcpu, value, 0, 0, 0);
    return ret();
}

hv_return_t hv_vcpu_set_trap_debug_reg_accesses(hv_vcpu_t vcpu, bool value) {
    rec(__func__, 2, vcpu, value, 0, 0, 0);
    return ret();
}

hv_return_t hv_vcpu_set_vtimer_mask(hv_vcpu_t vcpu, bool vtimer_is_masked) {
    rec(__func__, 2, vcpu, vtimer_is_masked, 0, 0, 0);
    return ret();
}

hv_return_t hv_vcpu_set_vtimer_offset(hv_vcpu_t vcpu, uint64_t vtimer_offset) {
    rec(__func__, 2, vcpu, vtimer_offset, 0, 0, 0);
    return ret();
}

hv_return_t hv_vcpu_get_sme_state(hv_vcpu_t vcpu, hv_vcpu_sme_state_t *state) {
    rec(__func__, 2, vcpu, P(state), 0, 0, 0);
    *state = sme_state;
    return sme_ret;
}

/* ---- hv_gic*.h ---- */

hv_gic_config_t hv_gic_config_create(void) {
    rec(__func__, 0, 0, 0, 0, 0, 0);
    return &gic_config_object;
}

hv_return_t hv_gic_config_set_distributor_base(hv_gic_config_t config,
                                               hv_ipa_t distributor_base_address) {
    rec(__func__, 2, P(config), distributor_base_address, 0, 0, 0);
    return ret();
}

hv_return_t hv_gic_config_set_redistributor_base(hv_gic_config_t config,
                                                 hv_ipa_t redistributor_base_address) {
    rec(__func__, 2, P(config), redistributor_base_address, 0, 0, 0);
    return ret();
}

hv_return_t hv_gic_create(hv_gic_config_t gic_config) {
    rec(__func__, 1, P(gic_config), 0, 0, 0, 0);
    return ret();
}

hv_return_t hv_gic_set_spi(uint32_t intid, bool level) {
    rec(__func__, 2, intid, level, 0, 0, 0);
    return ret();
}

#define GETTER(fn, value)                                                                          \
    hv_return_t fn(size_t *out) {                                                                  \
        rec(#fn, 1, P(out), 0, 0, 0, 0);                                                           \
        *out = (value);                                                                            \
        return ret();                                                                              \
    }

GETTER(hv_gic_get_distributor_size, 0x10000)
GETTER(hv_gic_get_distributor_base_alignment, 0x10000)
GETTER(hv_gic_get_redistributor_region_size, 0x100000)
GETTER(hv_gic_get_redistributor_size, 0x20000)
GETTER(hv_gic_get_redistributor_base_alignment, 0x20000)

hv_return_t hv_gic_get_spi_interrupt_range(uint32_t *spi_intid_base, uint32_t *spi_intid_count) {
    rec(__func__, 2, P(spi_intid_base), P(spi_intid_count), 0, 0, 0);
    *spi_intid_base = 32;
    *spi_intid_count = 256;
    return ret();
}

hv_return_t hv_gic_get_icc_reg(hv_vcpu_t vcpu, hv_gic_icc_reg_t reg, uint64_t *value) {
    rec(__func__, 3, vcpu, reg, P(value), 0, 0);
    *value = icc_regs[reg];
    return ret();
}

hv_return_t hv_gic_set_icc_reg(hv_vcpu_t vcpu, hv_gic_icc_reg_t reg, uint64_t value) {
    rec(__func__, 3, vcpu, reg, value, 0, 0);
    icc_regs[reg] = value;
    return ret();
}

#define STATE_SIZE 24

hv_gic_state_t hv_gic_state_create(void) {
    rec(__func__, 0, 0, 0, 0, 0, 0);
    return &gic_state_object;
}

hv_return_t hv_gic_state_get_size(hv_gic_state_t state, size_t *gic_state_size) {
    rec(__func__, 2, P(state), P(gic_state_size), 0, 0, 0);
    *gic_state_size = STATE_SIZE;
    return ret();
}

hv_return_t hv_gic_state_get_data(hv_gic_state_t state, void *gic_state_data) {
    rec(__func__, 2, P(state), P(gic_state_data), 0, 0, 0);
    for (int i = 0; i < STATE_SIZE; i++)
        ((uint8_t *)gic_state_data)[i] = (uint8_t)(i * 7 + 1);
    return ret();
}

hv_return_t hv_gic_set_state(const void *gic_state_data, size_t gic_state_size) {
    struct probe_call *c = rec(__func__, 2, P(gic_state_data), gic_state_size, 0, 0, 0);
    memcpy(c->vec, gic_state_data, gic_state_size < 16 ? gic_state_size : 16);
    return ret();
}

/* ---- os/object.h ---- */

void os_release(void *object) { rec(__func__, 1, P(object), 0, 0, 0, 0); }

/* ---- the host ---- */

uint64_t mach_absolute_time(void) {
    rec(__func__, 0, 0, 0, 0, 0, 0);
    return PROBE_TIME;
}

int mach_timebase_info(struct mach_timebase_info *info) {
    rec(__func__, 1, P(info), 0, 0, 0, 0);
    info->numer = 125;
    info->denom = 3;
    return 0;
}

int sysctlbyname(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen) {
    struct probe_call *c = rec(__func__, 5, P(name), P(oldp), P(oldlenp), P(newp), newlen);
    strncpy((char *)c->vec, name, sizeof(c->vec) - 1);
    if (strcmp(name, "kern.hv_support") == 0 && *oldlenp >= 4) {
        *(uint32_t *)oldp = 1;
        *oldlenp = 4;
        return 0;
    }
    if (strcmp(name, "hw.tbfrequency") == 0 && *oldlenp >= 8) {
        *(uint64_t *)oldp = 24000000;
        *oldlenp = 8;
        return 0;
    }
    return -1;
}
