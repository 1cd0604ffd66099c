/**
 * NpuExtAttentionUpdate: tiling and per-tile address arithmetic, shared by host and kernel.
 *
 * This header has no AscendC or CANN dependency. It is included by
 *   - op_host/npu_ext_attention_update_tiling.cpp (the real tiling function),
 *   - op_kernel/npu_ext_attention_update_kernel.h (the AscendC kernel),
 *   - tests/host/ (the coverage sweep, compiled with g++),
 * so the numbers the kernel uses on the NPU are the numbers the host tests check (the kernel
 * itself also runs on the host: host_kernel/).
 *
 * Tensors (all contiguous, row = one (batch, head) pair, N = B*S*Hc rows):
 *   lse     fp32            [sp, N]      shard i is the row block starting at i * N
 *   go      fp32/fp16/bf16  [sp, N, D]   shard i is the block starting at i * N * D
 *   out     go's dtype      [N, D]
 *   lse_out fp32            [N]          written only when update_type == 1
 *
 * Work split: the N rows are split over `usedCoreNum` vector cores (the first `formerNum`
 * cores take one row more). Each core walks its rows in tiles of `tileLength` rows (the last
 * tile may be shorter); a tile holds the rows of all sp shards at once, so shard i of tile p
 * of a core whose first row is `coreStart` is read from element
 *     i * N + coreStart + p * tileLength          (lse; times D for go).
 * All global-memory offsets are 64-bit: sp * N * D exceeds 2^32 for real decode shapes.
 */
#ifndef NPU_EXT_ATTENTION_UPDATE_TILING_MATH_H
#define NPU_EXT_ATTENTION_UPDATE_TILING_MATH_H

#if defined(__CCE_AICORE__) || defined(__CCE_KT_TEST__)
// AscendC kernel build: uint32_t & co. come from kernel_operator.h, included before this.
#define NPU_EXT_AU_FN __aicore__ inline
#else
#include <cstdint>
#define NPU_EXT_AU_FN inline
#endif

// Not `npu_ext_attention_update`: that is the kernel entry's name (the op type in snake_case,
// op_kernel/npu_ext_attention_update.cpp), and a namespace and a function of one name in the
// global scope do not compile (the op build's -D<entry>=<entry>_<key>_tilingkey renames both).
namespace npu_ext_au {

// ---- Operator limits (the same rules as vllm_npu_ext.ops.attention_update and op_api) ----
constexpr uint32_t kMinSp = 1;
constexpr uint32_t kMaxSp = 16;
constexpr uint32_t kMinHeadDim = 8;
constexpr uint32_t kMaxHeadDim = 512;
constexpr uint32_t kHeadDimMultiple = 8;
// Rows are counted in uint32 tiling fields and int32 loop variables; larger N is rejected.
constexpr uint64_t kMaxTotalLength = 0x7FFFFFFFULL;

// ---- Hardware facts the layout depends on ----
constexpr uint32_t kUbBlockBytes = 32;   // UB addresses and DMA bursts are 32-byte aligned
constexpr uint32_t kBufferNum = 2;       // every queue is double-buffered
constexpr uint32_t kLseElemBytes = 4;    // lse and lse_out are fp32
constexpr uint32_t kFloatBytes = 4;      // the merge is computed in fp32
// Fewer rows per core than one 32-byte block of fp32 lse is not worth a core launch.
constexpr uint32_t kMinRowsPerCore = kUbBlockBytes / kLseElemBytes;

enum class TilingStatus : uint32_t {
    kOk = 0,
    kBadSp = 1,
    kBadHeadDim = 2,
    kBadTotalLength = 3,
    kBadElemBytes = 4,
    kBadUpdateType = 5,
    kBadCoreNum = 6,
    kUbTooSmall = 7,
};

/** Everything the kernel needs; op_host copies it field by field into the TilingData. */
struct AttentionUpdateTiling {
    uint32_t sp;            // number of KV shards, lse.shape[0]
    uint32_t totalLength;   // N, rows per shard
    uint32_t hDim;          // D
    uint32_t goElemBytes;   // 4 (fp32) or 2 (fp16/bf16)
    uint32_t updateType;    // 1: write lse_out
    uint32_t usedCoreNum;   // block dim of the launch
    uint32_t formerNum;     // cores [0, formerNum) take formerLength rows
    uint32_t formerLength;  // tailLength + 1
    uint32_t tailLength;    // rows of the remaining cores
    uint32_t tileLength;    // rows per tile (the last tile of a core may have fewer)
};

/** Bytes of each UB buffer for one tile (a queue allocates kBufferNum of these). */
struct UbBuffers {
    uint32_t lseIn;    // queue: sp shards * AlignedRows(tileLength) fp32
    uint32_t goIn;     // queue: sp shards * GoShardStride elements of go's dtype
    uint32_t out;      // queue: tileLength * D elements of go's dtype
    uint32_t lseOut;   // queue: AlignedRows(tileLength) fp32
    uint32_t lseMax;   // AlignedRows fp32
    uint32_t lseSum;   // AlignedRows fp32: sum of weights, then its reciprocal
    uint32_t weights;  // sp * AlignedRows fp32
    uint32_t goFloat;  // tileLength * D fp32 (fp16/bf16 only, else 0): one shard cast to fp32
    uint32_t acc;      // tileLength * D fp32 (fp16/bf16 only, else 0): the fp32 sum
};

/** Rows [start, start + rows) of one core. */
struct CoreRows {
    uint32_t start;
    uint32_t rows;
};

NPU_EXT_AU_FN uint64_t CeilDiv(uint64_t value, uint64_t divisor)
{
    return (value + divisor - 1) / divisor;
}

NPU_EXT_AU_FN uint64_t AlignUp(uint64_t value, uint64_t alignment)
{
    return CeilDiv(value, alignment) * alignment;
}

/** Rows rounded up to a whole 32-byte block of fp32 lse: the vector length of lse math. */
NPU_EXT_AU_FN uint32_t AlignedRows(uint32_t rows)
{
    return static_cast<uint32_t>(AlignUp(rows, kUbBlockBytes / kLseElemBytes));
}

/** Elements between two go shards in UB: tileLength * D rounded up to a 32-byte block. */
NPU_EXT_AU_FN uint64_t GoShardStride(uint32_t tileLength, uint32_t hDim, uint32_t goElemBytes)
{
    const uint64_t elements = static_cast<uint64_t>(tileLength) * hDim;
    return AlignUp(elements, kUbBlockBytes / goElemBytes);
}

/** UB bytes per buffer for tiles of `tileLength` rows (64-bit: callers probe huge tiles). */
NPU_EXT_AU_FN uint64_t UbBytesOfTile(uint32_t sp, uint32_t hDim, uint32_t goElemBytes,
                                     uint32_t tileLength, UbBuffers *buffers)
{
    const uint64_t alignedRows = AlignedRows(tileLength);
    const uint64_t tileElements = static_cast<uint64_t>(tileLength) * hDim;
    const uint64_t lseIn = sp * alignedRows * kLseElemBytes;
    const uint64_t goIn = sp * GoShardStride(tileLength, hDim, goElemBytes) * goElemBytes;
    const uint64_t out = AlignUp(tileElements * goElemBytes, kUbBlockBytes);
    const uint64_t rowVector = alignedRows * kFloatBytes;
    const uint64_t castBuffer = goElemBytes == kFloatBytes ? 0 : tileElements * kFloatBytes;
    if (buffers != nullptr) {
        buffers->lseIn = static_cast<uint32_t>(lseIn);
        buffers->goIn = static_cast<uint32_t>(goIn);
        buffers->out = static_cast<uint32_t>(out);
        buffers->lseOut = static_cast<uint32_t>(rowVector);
        buffers->lseMax = static_cast<uint32_t>(rowVector);
        buffers->lseSum = static_cast<uint32_t>(rowVector);
        buffers->weights = static_cast<uint32_t>(sp * rowVector);
        buffers->goFloat = static_cast<uint32_t>(castBuffer);
        buffers->acc = static_cast<uint32_t>(castBuffer);
    }
    const uint64_t queues = kBufferNum * (lseIn + goIn + out + rowVector);
    return queues + 2 * rowVector + sp * rowVector + 2 * castBuffer;
}

/** The largest tile (<= maxRows) whose buffers fit in ubBytes; 0 when one row does not fit. */
NPU_EXT_AU_FN uint32_t LargestTileLength(uint32_t sp, uint32_t hDim, uint32_t goElemBytes,
                                         uint64_t ubBytes, uint32_t maxRows)
{
    if (UbBytesOfTile(sp, hDim, goElemBytes, 1, nullptr) > ubBytes) {
        return 0;
    }
    // UB use grows with the tile, so binary-search the last length that fits.
    uint32_t fits = 1;
    uint32_t tooBig = maxRows + 1;  // sentinel: never probed
    while (tooBig - fits > 1) {
        const uint32_t probe = fits + (tooBig - fits) / 2;
        if (UbBytesOfTile(sp, hDim, goElemBytes, probe, nullptr) <= ubBytes) {
            fits = probe;
        } else {
            tooBig = probe;
        }
    }
    return fits;
}

NPU_EXT_AU_FN TilingStatus CheckShape(uint64_t sp, uint64_t totalLength, uint64_t hDim,
                                      uint32_t goElemBytes, uint32_t updateType)
{
    if (sp < kMinSp || sp > kMaxSp) {
        return TilingStatus::kBadSp;
    }
    if (hDim < kMinHeadDim || hDim > kMaxHeadDim || hDim % kHeadDimMultiple != 0) {
        return TilingStatus::kBadHeadDim;
    }
    if (totalLength < 1 || totalLength > kMaxTotalLength) {
        return TilingStatus::kBadTotalLength;
    }
    if (goElemBytes != 2 && goElemBytes != 4) {
        return TilingStatus::kBadElemBytes;
    }
    if (updateType > 1) {
        return TilingStatus::kBadUpdateType;
    }
    return TilingStatus::kOk;
}

/**
 * Fill `tiling` for lse [sp, N], go [sp, N, D] on `coreNum` vector cores of `ubBytes` UB each.
 * Shape values are taken 64-bit so that out-of-range inputs are rejected, not truncated.
 */
NPU_EXT_AU_FN TilingStatus ComputeTiling(uint64_t sp, uint64_t totalLength, uint64_t hDim,
                                         uint32_t goElemBytes, uint32_t updateType,
                                         uint32_t coreNum, uint64_t ubBytes,
                                         AttentionUpdateTiling *tiling)
{
    const TilingStatus shapeStatus = CheckShape(sp, totalLength, hDim, goElemBytes, updateType);
    if (shapeStatus != TilingStatus::kOk) {
        return shapeStatus;
    }
    if (coreNum < 1) {
        return TilingStatus::kBadCoreNum;
    }
    const uint64_t wantedCores = CeilDiv(totalLength, kMinRowsPerCore);
    const uint32_t usedCores = static_cast<uint32_t>(wantedCores < coreNum ? wantedCores : coreNum);
    const uint32_t rows = static_cast<uint32_t>(totalLength);
    tiling->sp = static_cast<uint32_t>(sp);
    tiling->totalLength = rows;
    tiling->hDim = static_cast<uint32_t>(hDim);
    tiling->goElemBytes = goElemBytes;
    tiling->updateType = updateType;
    tiling->usedCoreNum = usedCores;
    tiling->tailLength = rows / usedCores;
    tiling->formerNum = rows % usedCores;
    tiling->formerLength = tiling->tailLength + 1;
    const uint32_t maxCoreRows = tiling->formerNum > 0 ? tiling->formerLength : tiling->tailLength;
    tiling->tileLength = LargestTileLength(tiling->sp, tiling->hDim, goElemBytes, ubBytes,
                                           maxCoreRows);
    return tiling->tileLength == 0 ? TilingStatus::kUbTooSmall : TilingStatus::kOk;
}

// ---- Per-core and per-tile arithmetic (what the kernel's Init/CopyIn/CopyOut compute) ----

NPU_EXT_AU_FN CoreRows RowsOfCore(const AttentionUpdateTiling &tiling, uint32_t blockIdx)
{
    CoreRows range;
    if (blockIdx < tiling.formerNum) {
        range.start = blockIdx * tiling.formerLength;
        range.rows = tiling.formerLength;
    } else {
        range.start = tiling.formerNum * tiling.formerLength +
                      (blockIdx - tiling.formerNum) * tiling.tailLength;
        range.rows = tiling.tailLength;
    }
    return range;
}

NPU_EXT_AU_FN uint32_t TileCount(uint32_t coreRows, uint32_t tileLength)
{
    return static_cast<uint32_t>(CeilDiv(coreRows, tileLength));
}

/** Rows in tile `progress`: tileLength, except the tail tile which takes what is left. */
NPU_EXT_AU_FN uint32_t RowsOfTile(uint32_t coreRows, uint32_t tileLength, uint32_t progress)
{
    const uint32_t done = progress * tileLength;
    const uint32_t left = coreRows - done;
    return left < tileLength ? left : tileLength;
}

/** First row of tile `progress` inside the N rows of one shard. */
NPU_EXT_AU_FN uint64_t TileFirstRow(const AttentionUpdateTiling &tiling, uint32_t coreStart,
                                    uint32_t progress)
{
    return static_cast<uint64_t>(coreStart) + static_cast<uint64_t>(progress) * tiling.tileLength;
}

/** Element offset in lse [sp, N] of shard `shard`, tile `progress`. */
NPU_EXT_AU_FN uint64_t LseGmOffset(const AttentionUpdateTiling &tiling, uint32_t shard,
                                   uint32_t coreStart, uint32_t progress)
{
    return static_cast<uint64_t>(shard) * tiling.totalLength +
           TileFirstRow(tiling, coreStart, progress);
}

/** Element offset in go [sp, N, D] of shard `shard`, tile `progress`. */
NPU_EXT_AU_FN uint64_t GoGmOffset(const AttentionUpdateTiling &tiling, uint32_t shard,
                                  uint32_t coreStart, uint32_t progress)
{
    return LseGmOffset(tiling, shard, coreStart, progress) * tiling.hDim;
}

/** Element offset in out [N, D] of tile `progress`. */
NPU_EXT_AU_FN uint64_t OutGmOffset(const AttentionUpdateTiling &tiling, uint32_t coreStart,
                                   uint32_t progress)
{
    return TileFirstRow(tiling, coreStart, progress) * tiling.hDim;
}

/** Element offset in lse_out [N] of tile `progress`. */
NPU_EXT_AU_FN uint64_t LseOutGmOffset(const AttentionUpdateTiling &tiling, uint32_t coreStart,
                                      uint32_t progress)
{
    return TileFirstRow(tiling, coreStart, progress);
}

/** fp32 element offset of shard `shard` inside the lse tile buffer. */
NPU_EXT_AU_FN uint32_t LseLocalOffset(const AttentionUpdateTiling &tiling, uint32_t shard)
{
    return shard * AlignedRows(tiling.tileLength);
}

/** Element offset (go's dtype) of shard `shard` inside the go tile buffer. */
NPU_EXT_AU_FN uint32_t GoLocalOffset(const AttentionUpdateTiling &tiling, uint32_t shard)
{
    // A tile fits in UB, so the stride fits in 32 bits.
    return shard * static_cast<uint32_t>(GoShardStride(tiling.tileLength, tiling.hDim,
                                                       tiling.goElemBytes));
}

}  // namespace npu_ext_au

#endif  // NPU_EXT_ATTENTION_UPDATE_TILING_MATH_H
