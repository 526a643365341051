/**
 * DeviceArena: the allocator over the device memory the backend reserves once at start-up
 * (one cudaMalloc), so a decode step never calls cudaMalloc. First fit over an address-
 * ordered free list, 256-byte aligned blocks, neighbours coalesced on free. Pure bookkeeping
 * on offsets: it never touches device memory, so it is tested without a GPU.
 */
import { HybridgenError } from "@hybridgen/spec";

export const ARENA_ALIGN = 256;

export interface ArenaStats {
  /** Bytes the allocator manages. */
  readonly capacityBytes: number;
  readonly usedBytes: number;
  readonly freeBytes: number;
  /** The largest single allocation that would succeed now. */
  readonly largestFreeBytes: number;
  readonly liveBlocks: number;
  /** The most bytes in use at once since creation. */
  readonly peakBytes: number;
}

export class DeviceArena {
  // Free blocks, sorted by offset, never adjacent (coalesced).
  private readonly freeOff: number[] = [];
  private readonly freeLen: number[] = [];
  private readonly live = new Map<number, number>(); // offset -> aligned size
  private used = 0;
  private peak = 0;

  constructor(readonly capacityBytes: number) {
    if (!Number.isSafeInteger(capacityBytes) || capacityBytes < 0) throw new HybridgenError(`CUDA arena: bad capacity ${capacityBytes}`);
    const usable = capacityBytes - (capacityBytes % ARENA_ALIGN);
    if (usable > 0) {
      this.freeOff.push(0);
      this.freeLen.push(usable);
    }
  }

  /** Offset of a new block of at least `bytes`, or a one-line error naming what was asked and what is free. */
  allocate(bytes: number, what: string): number {
    if (!Number.isSafeInteger(bytes) || bytes < 0) throw new HybridgenError(`CUDA arena: bad allocation size ${bytes} for ${what}`);
    const size = Math.max(ARENA_ALIGN, Math.ceil(bytes / ARENA_ALIGN) * ARENA_ALIGN);
    for (let i = 0; i < this.freeOff.length; i++) {
      if (this.freeLen[i] < size) continue;
      const off = this.freeOff[i];
      if (this.freeLen[i] === size) {
        this.freeOff.splice(i, 1);
        this.freeLen.splice(i, 1);
      } else {
        this.freeOff[i] += size;
        this.freeLen[i] -= size;
      }
      this.live.set(off, size);
      this.used += size;
      if (this.used > this.peak) this.peak = this.used;
      return off;
    }
    const s = this.stats();
    const frag = s.freeBytes >= size ? ` (fragmented: the largest free block is ${s.largestFreeBytes} bytes)` : "";
    throw new HybridgenError(
      `CUDA out of memory: ${what} needs ${bytes} bytes, but the device arena has ${s.freeBytes} bytes free of ${s.capacityBytes}${frag}`,
      "ECUDAOOM",
    );
  }

  /** Returns a block to the free list. */
  release(offset: number): void {
    const size = this.live.get(offset);
    if (size === undefined) throw new HybridgenError(`CUDA arena: no live block at offset ${offset}`);
    this.live.delete(offset);
    this.used -= size;
    // Insert in order, then merge with the neighbours.
    let i = 0;
    while (i < this.freeOff.length && this.freeOff[i] < offset) i++;
    this.freeOff.splice(i, 0, offset);
    this.freeLen.splice(i, 0, size);
    if (i + 1 < this.freeOff.length && this.freeOff[i] + this.freeLen[i] === this.freeOff[i + 1]) {
      this.freeLen[i] += this.freeLen[i + 1];
      this.freeOff.splice(i + 1, 1);
      this.freeLen.splice(i + 1, 1);
    }
    if (i > 0 && this.freeOff[i - 1] + this.freeLen[i - 1] === this.freeOff[i]) {
      this.freeLen[i - 1] += this.freeLen[i];
      this.freeOff.splice(i, 1);
      this.freeLen.splice(i, 1);
    }
  }

  /** Forget every block (the backend closes). */
  reset(): void {
    this.live.clear();
    this.freeOff.length = 0;
    this.freeLen.length = 0;
    this.used = 0;
    const usable = this.capacityBytes - (this.capacityBytes % ARENA_ALIGN);
    if (usable > 0) {
      this.freeOff.push(0);
      this.freeLen.push(usable);
    }
  }

  stats(): ArenaStats {
    let free = 0, largest = 0;
    for (const len of this.freeLen) {
      free += len;
      if (len > largest) largest = len;
    }
    return { capacityBytes: this.capacityBytes, usedBytes: this.used, freeBytes: free, largestFreeBytes: largest, liveBlocks: this.live.size, peakBytes: this.peak };
  }
}
