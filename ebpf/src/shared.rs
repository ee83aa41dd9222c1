//! What every program uses: the counter map and the load-time kernel offsets.

use aya_ebpf::{macros::map, maps::PerCpuArray};
use hugepage_agent_common::{counters::Counter, offsets::KernelOffsets};

#[map(name = "COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::COUNT, 0);

/// Overridden by the loader before load; the kernel freezes it, so each read is a constant.
#[unsafe(no_mangle)]
pub(crate) static KERNEL_OFFSETS: KernelOffsets = KernelOffsets::ZERO;

/// Adds one to `counter` on this CPU.
#[inline(always)]
pub fn count(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: per-CPU slot, no other writer while this program runs on this CPU.
        unsafe { *slot += 1 };
    }
}

/// Reads one field of the frozen offsets as a load the verifier resolves to its value.
macro_rules! offset {
    ($field:ident) => {
        $crate::shared::read_offset(&raw const $crate::shared::KERNEL_OFFSETS.$field)
    };
}
pub(crate) use offset;

/// Volatile so that the compiler keeps the load instead of folding the compiled-in zero.
#[inline(always)]
pub fn read_offset(field: *const u64) -> u64 {
    // SAFETY: `field` points into the `KERNEL_OFFSETS` static.
    unsafe { core::ptr::read_volatile(field) }
}
