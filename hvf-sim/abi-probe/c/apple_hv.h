/*
 * The prototypes of the Hypervisor.framework functions Ignition's hvf
 * backend calls, with the C types of Apple's headers (hv_types.h,
 * hv_error.h, hv_vm.h, hv_vcpu.h, hv_vcpu_types.h, hv_gic.h,
 * hv_gic_config.h, hv_gic_parameters.h, hv_gic_state.h, os/object.h) and of
 * the host functions it reads (mach/mach_time.h, sys/sysctl.h). Apple's
 * OS_ENUM(name, type, ...) makes `name_t` a typedef of `type`; its object
 * types (hv_*_config_t, hv_gic_state_t) are pointers; the vector type is
 * GCC's spelling of clang's ext_vector_type(16) of uint8_t: both are 16-byte
 * short vectors, which AAPCS64 passes in a SIMD register.
 */
#ifndef APPLE_HV_H
#define APPLE_HV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef int hv_return_t; /* mach_error_t, kern_return_t */
typedef uint64_t hv_ipa_t;
typedef uint64_t hv_memory_flags_t;
typedef uint64_t hv_vcpu_t;
typedef void *hv_vm_config_t;
typedef void *hv_vcpu_config_t;
typedef void *hv_gic_config_t;
typedef void *hv_gic_state_t;
typedef uint32_t hv_reg_t;
typedef uint32_t hv_simd_fp_reg_t;
typedef uint16_t hv_sys_reg_t;
typedef uint32_t hv_interrupt_type_t;
typedef uint32_t hv_exit_reason_t;
typedef uint16_t hv_gic_icc_reg_t;
typedef uint8_t hv_simd_fp_uchar16_t __attribute__((vector_size(16)));

typedef struct {
    uint64_t syndrome;
    uint64_t virtual_address;
    hv_ipa_t physical_address;
} hv_vcpu_exit_exception_t;

typedef struct {
    hv_exit_reason_t reason;
    hv_vcpu_exit_exception_t exception;
} hv_vcpu_exit_t;

typedef struct {
    bool streaming_sve_mode_enabled;
    bool za_storage_enabled;
} hv_vcpu_sme_state_t;

struct mach_timebase_info {
    uint32_t numer;
    uint32_t denom;
};

/* hv_vm.h */
hv_return_t hv_vm_create(hv_vm_config_t config);
hv_return_t hv_vm_destroy(void);
hv_return_t hv_vm_get_max_vcpu_count(uint32_t *max_vcpu_count);
hv_return_t hv_vm_map(void *addr, hv_ipa_t ipa, size_t size, hv_memory_flags_t flags);
hv_return_t hv_vm_unmap(hv_ipa_t ipa, size_t size);
hv_return_t hv_vm_protect(hv_ipa_t ipa, size_t size, hv_memory_flags_t flags);

/* hv_vcpu.h */
hv_return_t hv_vcpu_create(hv_vcpu_t *vcpu, hv_vcpu_exit_t **exit, hv_vcpu_config_t config);
hv_return_t hv_vcpu_destroy(hv_vcpu_t vcpu);
hv_return_t hv_vcpu_run(hv_vcpu_t vcpu);
hv_return_t hv_vcpus_exit(hv_vcpu_t *vcpus, uint32_t vcpu_count);
hv_return_t hv_vcpu_get_reg(hv_vcpu_t vcpu, hv_reg_t reg, uint64_t *value);
hv_return_t hv_vcpu_set_reg(hv_vcpu_t vcpu, hv_reg_t reg, uint64_t value);
hv_return_t hv_vcpu_get_simd_fp_reg(hv_vcpu_t vcpu, hv_simd_fp_reg_t reg,
                                    hv_simd_fp_uchar16_t *value);
hv_return_t hv_vcpu_set_simd_fp_reg(hv_vcpu_t vcpu, hv_simd_fp_reg_t reg,
                                    hv_simd_fp_uchar16_t value);
hv_return_t hv_vcpu_get_sys_reg(hv_vcpu_t vcpu, hv_sys_reg_t reg, uint64_t *value);
hv_return_t hv_vcpu_set_sys_reg(hv_vcpu_t vcpu, hv_sys_reg_t reg, uint64_t value);
hv_return_t hv_vcpu_set_pending_interrupt(hv_vcpu_t vcpu, hv_interrupt_type_t type, bool pending);
hv_return_t hv_vcpu_set_trap_debug_exceptions(hv_vcpu_t vcpu, bool value);
hv_return_t hv_vcpu_set_trap_debug_reg_accesses(hv_vcpu_t vcpu, bool value);
hv_return_t hv_vcpu_set_vtimer_mask(hv_vcpu_t vcpu, bool vtimer_is_masked);
hv_return_t hv_vcpu_set_vtimer_offset(hv_vcpu_t vcpu, uint64_t vtimer_offset);
hv_return_t hv_vcpu_get_sme_state(hv_vcpu_t vcpu, hv_vcpu_sme_state_t *sme_state);

/* hv_gic*.h (macOS 15.0) */
hv_gic_config_t hv_gic_config_create(void);
hv_return_t hv_gic_config_set_distributor_base(hv_gic_config_t config,
                                               hv_ipa_t distributor_base_address);
hv_return_t hv_gic_config_set_redistributor_base(hv_gic_config_t config,
                                                 hv_ipa_t redistributor_base_address);
hv_return_t hv_gic_create(hv_gic_config_t gic_config);
hv_return_t hv_gic_set_spi(uint32_t intid, bool level);
hv_return_t hv_gic_get_distributor_size(size_t *distributor_size);
hv_return_t hv_gic_get_distributor_base_alignment(size_t *distributor_base_alignment);
hv_return_t hv_gic_get_redistributor_region_size(size_t *redistributor_region_size);
hv_return_t hv_gic_get_redistributor_size(size_t *redistributor_size);
hv_return_t hv_gic_get_redistributor_base_alignment(size_t *redistributor_base_alignment);
hv_return_t hv_gic_get_spi_interrupt_range(uint32_t *spi_intid_base, uint32_t *spi_intid_count);
hv_return_t hv_gic_get_icc_reg(hv_vcpu_t vcpu, hv_gic_icc_reg_t reg, uint64_t *value);
hv_return_t hv_gic_set_icc_reg(hv_vcpu_t vcpu, hv_gic_icc_reg_t reg, uint64_t value);
hv_gic_state_t hv_gic_state_create(void);
hv_return_t hv_gic_state_get_size(hv_gic_state_t state, size_t *gic_state_size);
hv_return_t hv_gic_state_get_data(hv_gic_state_t state, void *gic_state_data);
hv_return_t hv_gic_set_state(const void *gic_state_data, size_t gic_state_size);

/* os/object.h */
void os_release(void *object);

/* mach/mach_time.h, sys/sysctl.h */
uint64_t mach_absolute_time(void);
int mach_timebase_info(struct mach_timebase_info *info);
int sysctlbyname(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen);

#endif
