"""Residency arithmetic of kernel launches that need every warp resident at once (the
wavefront SGD kernel: a waiting warp must not hold the slot of the one it waits for).

Pure integers, no CuPy: the driver's occupancy calculator gives the blocks an SM holds
(``mgpu.backends.cupy_sgd``); :func:`blocks_by_registers` and :func:`blocks_by_shared` are
the same count from a kernel's registers a thread and shared memory a block, as the CUDA
occupancy calculator (``cuda_occupancy.h``) makes it (the smaller of the two), and
:func:`resident_launch` turns either into a launch.
"""
from __future__ import annotations

__all__ = ["blocks_by_registers", "blocks_by_shared", "resident_launch"]


def blocks_by_registers(regs: int, threads: int, *, regs_per_sm: int = 65536,
                        regs_per_block: int = 65536, max_warps_per_sm: int = 64,
                        max_blocks_per_sm: int = 32, sub_partitions: int = 4,
                        granularity: int = 256) -> int:
    """Thread blocks of ``threads`` that an SM holds at once when each thread uses ``regs``
    registers (the defaults: compute capability 7.0 to 9.0). Registers go to warps in units
    of ``granularity`` from each of the SM's ``sub_partitions`` register files, so a warp
    never straddles two; 0 where one block does not fit.

    >>> [blocks_by_registers(r, 64) for r in (164, 108, 72)]  # 12, 16, 28 warps an SM
    [6, 8, 14]
    >>> blocks_by_registers(32, 256), blocks_by_registers(255, 1024)
    (8, 0)
    """
    if regs <= 0 or threads <= 0:
        raise ValueError(f"blocks_by_registers needs regs > 0 and threads > 0. Got regs={regs!r}, "
                         f"threads={threads!r}.")
    warps = -(-threads // 32)
    per_warp = -(-regs * 32 // granularity) * granularity
    assumed = per_warp * -(-warps // sub_partitions) * sub_partitions  # the hardware's check
    if regs > 255 or per_warp * warps > regs_per_block or assumed > regs_per_block:
        return 0
    by_regs = (regs_per_sm // sub_partitions) // per_warp * sub_partitions // warps
    return int(min(by_regs, max_warps_per_sm // warps, max_blocks_per_sm))


def blocks_by_shared(shared: int, *, shared_per_sm: int = 233472, reserved: int = 1024,
                     max_blocks_per_sm: int = 32) -> int:
    """Thread blocks an SM holds at once when each takes ``shared`` bytes of static shared
    memory: the SM's whole shared memory (the defaults: compute capability 9.0, 228 KiB)
    over each block's bytes and the ``reserved`` 1 KiB the device keeps of every block
    (compute capability 8.0 on); 0 where one block does not fit.

    >>> [blocks_by_shared(b) for b in (0, 9728, 17920)]  # the ring of 4 and of 8 ratings
    [32, 21, 12]
    """
    if shared < 0:
        raise ValueError(f"blocks_by_shared needs shared >= 0. Got shared={shared!r}.")
    return int(min(shared_per_sm // (shared + reserved), max_blocks_per_sm))


def resident_launch(groups: int, sms: int, blocks_per_sm: int, warps_per_block: int,
                    max_warps: int | None = None) -> tuple[int, int, int]:
    """(warps, warps a block, blocks) of a launch of one warp per group, every warp
    resident: at most ``sms · blocks_per_sm · warps_per_block`` warps (what the device holds
    at once), ``groups`` and ``max_warps`` (None or <= 0: no cap); at least one warp. Where
    warps fall short of groups, each warp takes several groups in turn.

    >>> resident_launch(1024, 132, 6, 2)   # 164 registers a thread: 12 warps an SM
    (1024, 2, 512)
    >>> resident_launch(4096, 132, 14, 2)  # 2 in flight: 72 registers, 28 warps an SM
    (3696, 2, 1848)
    >>> resident_launch(37, 132, 6, 2, max_warps=7)
    (7, 2, 4)
    """
    if min(groups, sms, blocks_per_sm, warps_per_block) < 1:
        raise ValueError(f"resident_launch needs groups, sms, blocks_per_sm and warps_per_block "
                         f">= 1. Got {groups!r}, {sms!r}, {blocks_per_sm!r}, "
                         f"{warps_per_block!r}.")
    resident = sms * blocks_per_sm * warps_per_block
    cap = max_warps if max_warps is not None and max_warps > 0 else groups
    warps = max(1, min(groups, resident, cap))
    per_block = min(warps_per_block, warps)
    return warps, per_block, -(-warps // per_block)
