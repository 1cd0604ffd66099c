/**
 * Coverage sweep of the NpuExtAttentionUpdate tiling and per-tile offsets (g++, no CANN).
 *
 * Over a grid of (sp, N, D, go element size, update_type, core count, UB size) it walks the
 * kernel's cores and tiles (tile_walk.h) with the offsets of attention_update_tiling_math.h
 * and proves, per configuration:
 *   - the cores' row ranges partition [0, N) and no more than coreNum cores are used;
 *   - every tile but the last of a core has tileLength rows, the tail tile 1..tileLength;
 *   - the tile's buffers fit the UB and tileLength is the largest that fits (or the core's
 *     rows); a UB too small for one row is rejected, and only then;
 *   - the lse reads of all shards and tiles cover [0, sp*N) exactly once, the go reads
 *     [0, sp*N*D) exactly once (interval union; per element for small shapes), the out
 *     writes [0, N*D) and the lse_out writes [0, N) exactly once (none for update_type 0);
 *   - UB offsets of every shard are 32-byte aligned and inside their buffer.
 * Then, for the largest supported shapes, the 64-bit offsets of the first and last tiles
 * against 128-bit arithmetic, and the rejection of every out-of-range argument.
 * Prints one summary line; exits 1 on any failure.
 */
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "attention_update_tiling_math.h"
#include "tile_walk.h"

namespace au = npu_ext_au;

namespace {

struct Interval {
    uint64_t begin;
    uint64_t end;
};

struct Stats {
    uint64_t configs = 0;
    uint64_t tiled = 0;
    uint64_t rejectedUb = 0;
    uint64_t tiles = 0;
    uint64_t intervals = 0;
    uint64_t elementsCounted = 0;
    uint64_t failures = 0;
};

// Stop sweeping after this many failures: one broken formula fails thousands of configs.
constexpr uint64_t kMaxReportedFailures = 20;

Stats stats;
std::string currentConfig;

void Fail(const std::string &what)
{
    if (stats.failures < kMaxReportedFailures) {
        std::printf("FAIL [%s]: %s\n", currentConfig.c_str(), what.c_str());
    }
    ++stats.failures;
}

void Expect(bool condition, const std::string &what)
{
    if (!condition) {
        Fail(what);
    }
}

/** The intervals, sorted, must tile [0, total) with no gap and no overlap. */
void ExpectExactCover(std::vector<Interval> intervals, uint64_t total, const char *name)
{
    stats.intervals += intervals.size();
    std::sort(intervals.begin(), intervals.end(),
              [](const Interval &a, const Interval &b) { return a.begin < b.begin; });
    uint64_t next = 0;
    for (const Interval &interval : intervals) {
        if (interval.begin != next || interval.end <= interval.begin) {
            Fail(std::string(name) + ": gap, overlap or empty interval at " +
                 std::to_string(interval.begin) + " (expected " + std::to_string(next) + ")");
            return;
        }
        next = interval.end;
    }
    Expect(next == total, std::string(name) + ": covers " + std::to_string(next) + " of " +
                              std::to_string(total));
}

/** Every element counted exactly once (independent of the interval argument). */
void ExpectEachOnce(const std::vector<Interval> &intervals, uint64_t total, const char *name)
{
    std::vector<uint8_t> counts(total, 0);
    for (const Interval &interval : intervals) {
        for (uint64_t i = interval.begin; i < interval.end && i < total; ++i) {
            ++counts[i];
        }
        Expect(interval.end <= total, std::string(name) + ": read past the end");
    }
    stats.elementsCounted += total;
    Expect(std::all_of(counts.begin(), counts.end(), [](uint8_t c) { return c == 1; }),
           std::string(name) + ": an element is not touched exactly once");
}

/** Records what the kernel would read and write, tile by tile. */
class AccessRecorder {
public:
    explicit AccessRecorder(const au::AttentionUpdateTiling &tiling) : tiling_(tiling) {}

    void BeginCore(uint32_t, const au::CoreRows &core)
    {
        Expect(core.rows >= 1, "a launched core has no rows");
        cores_.push_back({core.start, static_cast<uint64_t>(core.start) + core.rows});
    }

    void Tile(const au::CoreRows &core, uint32_t progress, uint32_t rows)
    {
        ++stats.tiles;
        const uint32_t tiles = au::TileCount(core.rows, tiling_.tileLength);
        const bool last = progress + 1 == tiles;
        Expect(last ? rows >= 1 && rows <= tiling_.tileLength : rows == tiling_.tileLength,
               "tile " + std::to_string(progress) + " has " + std::to_string(rows) + " rows");
        const uint64_t d = tiling_.hDim;
        for (uint32_t shard = 0; shard < tiling_.sp; ++shard) {
            const uint64_t lse = au::LseGmOffset(tiling_, shard, core.start, progress);
            const uint64_t go = au::GoGmOffset(tiling_, shard, core.start, progress);
            lse_.push_back({lse, lse + rows});
            go_.push_back({go, go + rows * d});
            CheckLocal(shard, rows);
        }
        const uint64_t out = au::OutGmOffset(tiling_, core.start, progress);
        out_.push_back({out, out + rows * d});
        if (tiling_.updateType == 1) {
            const uint64_t lseOut = au::LseOutGmOffset(tiling_, core.start, progress);
            lseOut_.push_back({lseOut, lseOut + rows});
        }
    }

    void Verify() const
    {
        const uint64_t sp = tiling_.sp, n = tiling_.totalLength, d = tiling_.hDim;
        ExpectExactCover(cores_, n, "core rows");
        ExpectExactCover(lse_, sp * n, "lse reads");
        ExpectExactCover(go_, sp * n * d, "go reads");
        ExpectExactCover(out_, n * d, "out writes");
        ExpectExactCover(lseOut_, tiling_.updateType == 1 ? n : 0, "lse_out writes");
        if (sp * n * d <= (1u << 20)) {
            ExpectEachOnce(lse_, sp * n, "lse reads");
            ExpectEachOnce(go_, sp * n * d, "go reads");
            ExpectEachOnce(out_, n * d, "out writes");
        }
    }

private:
    /** Shard `shard` of a `rows`-row tile lies inside its UB buffer, 32-byte aligned. */
    void CheckLocal(uint32_t shard, uint32_t rows)
    {
        au::UbBuffers bytes;
        au::UbBytesOfTile(tiling_.sp, tiling_.hDim, tiling_.goElemBytes, tiling_.tileLength,
                          &bytes);
        const uint64_t lseAt = uint64_t{au::LseLocalOffset(tiling_, shard)} * au::kLseElemBytes;
        const uint64_t goAt = uint64_t{au::GoLocalOffset(tiling_, shard)} * tiling_.goElemBytes;
        // DMA into UB fills whole 32-byte blocks, so a shard occupies its bytes rounded up.
        const uint64_t goBytes =
            au::AlignUp(uint64_t{rows} * tiling_.hDim * tiling_.goElemBytes, au::kUbBlockBytes);
        Expect(lseAt % au::kUbBlockBytes == 0 && goAt % au::kUbBlockBytes == 0,
               "UB shard offset not 32-byte aligned");
        Expect(lseAt + au::AlignedRows(rows) * au::kLseElemBytes <= bytes.lseIn,
               "lse shard outside its UB buffer");
        Expect(goAt + goBytes <= bytes.goIn, "go shard outside its UB buffer");
        if (shard + 1 < tiling_.sp) {  // the next shard starts after this one ends
            Expect(lseAt + au::AlignedRows(rows) * au::kLseElemBytes <=
                       uint64_t{au::LseLocalOffset(tiling_, shard + 1)} * au::kLseElemBytes,
                   "lse shards overlap in UB");
            Expect(goAt + goBytes <=
                       uint64_t{au::GoLocalOffset(tiling_, shard + 1)} * tiling_.goElemBytes,
                   "go shards overlap in UB");
        }
    }

    au::AttentionUpdateTiling tiling_;
    std::vector<Interval> cores_, lse_, go_, out_, lseOut_;
};

/** The total UB bytes equal the sum of the buffers the kernel allocates (queues twice). */
void CheckUbTotal(const au::AttentionUpdateTiling &tiling)
{
    au::UbBuffers b;
    const uint64_t total =
        au::UbBytesOfTile(tiling.sp, tiling.hDim, tiling.goElemBytes, tiling.tileLength, &b);
    const auto block = [](uint64_t bytes) { return au::AlignUp(bytes, au::kUbBlockBytes); };
    const uint64_t queues = block(b.lseIn) + block(b.goIn) + block(b.out) + block(b.lseOut);
    const uint64_t calc = block(b.lseMax) + block(b.lseSum) + block(b.weights) +
                          block(b.goFloat) + block(b.acc);
    Expect(total == au::kBufferNum * queues + calc, "UB total differs from its buffers' sum");
    Expect((b.goFloat == 0) == (tiling.goElemBytes == 4), "cast buffers only for fp16/bf16");
}

void CheckTileChoice(const au::AttentionUpdateTiling &tiling, uint64_t ubBytes)
{
    CheckUbTotal(tiling);
    const uint32_t maxCoreRows = tiling.formerNum > 0 ? tiling.formerLength : tiling.tailLength;
    const auto bytesOf = [&](uint32_t rows) {
        return au::UbBytesOfTile(tiling.sp, tiling.hDim, tiling.goElemBytes, rows, nullptr);
    };
    Expect(bytesOf(tiling.tileLength) <= ubBytes, "tile does not fit the UB");
    Expect(tiling.tileLength <= maxCoreRows, "tile longer than a core's rows");
    Expect(tiling.tileLength == maxCoreRows || bytesOf(tiling.tileLength + 1) > ubBytes,
           "a longer tile would still fit");
}

void SweepOne(uint32_t sp, uint32_t n, uint32_t d, uint32_t elemBytes, uint32_t updateType,
              uint32_t coreNum, uint64_t ubBytes)
{
    ++stats.configs;
    currentConfig = "sp=" + std::to_string(sp) + " N=" + std::to_string(n) +
                    " D=" + std::to_string(d) + " elem=" + std::to_string(elemBytes) +
                    " update=" + std::to_string(updateType) + " cores=" + std::to_string(coreNum) +
                    " ub=" + std::to_string(ubBytes);
    au::AttentionUpdateTiling tiling{};
    const au::TilingStatus status =
        au::ComputeTiling(sp, n, d, elemBytes, updateType, coreNum, ubBytes, &tiling);
    const bool oneRowFits = au::UbBytesOfTile(sp, d, elemBytes, 1, nullptr) <= ubBytes;
    if (!oneRowFits) {
        Expect(status == au::TilingStatus::kUbTooSmall, "a UB too small was not rejected");
        ++stats.rejectedUb;
        return;
    }
    Expect(status == au::TilingStatus::kOk, "valid shape rejected");
    if (status != au::TilingStatus::kOk) {
        return;
    }
    ++stats.tiled;
    Expect(tiling.usedCoreNum >= 1 && tiling.usedCoreNum <= coreNum, "bad core count");
    CheckTileChoice(tiling, ubBytes);
    AccessRecorder recorder(tiling);
    au::WalkTiles(tiling, recorder);
    recorder.Verify();
}

void SweepGrid()
{
    const uint32_t sps[] = {1, 2, 3, 8, 13, 16};
    const uint32_t rows[] = {1, 2, 7, 8, 9, 17, 64, 65, 255, 1000, 4097};
    const uint32_t dims[] = {8, 24, 64, 128, 136, 512};
    const uint32_t elemBytes[] = {4, 2};
    const uint32_t cores[] = {1, 3, 20, 40, 48};
    // 910B UB (192 KiB), a quarter of it, and sizes around one row of the largest shapes.
    const uint64_t ubs[] = {196608, 49152, 20480, 72000};
    for (uint32_t sp : sps)
        for (uint32_t n : rows)
            for (uint32_t d : dims)
                for (uint32_t e : elemBytes)
                    for (uint32_t c : cores)
                        for (uint64_t ub : ubs) {
                            if (stats.failures >= kMaxReportedFailures) {
                                return;
                            }
                            SweepOne(sp, n, d, e, (n + d + c) % 2, c, ub);
                        }
}

/** Largest supported shapes: offsets past 2^32 stay exact (checked against 128-bit). */
void CheckLargestShapes()
{
    const uint32_t n = static_cast<uint32_t>(au::kMaxTotalLength);
    for (uint32_t e : {4u, 2u}) {
        currentConfig = "largest shapes elem=" + std::to_string(e);
        au::AttentionUpdateTiling t{};
        const au::TilingStatus status =
            au::ComputeTiling(au::kMaxSp, n, au::kMaxHeadDim, e, 1, 48, 196608, &t);
        Expect(status == au::TilingStatus::kOk, "largest shape rejected");
        const au::CoreRows last = au::RowsOfCore(t, t.usedCoreNum - 1);
        Expect(uint64_t{last.start} + last.rows == n, "last core does not end at N");
        const uint32_t tiles = au::TileCount(last.rows, t.tileLength);
        const uint32_t tailRows = au::RowsOfTile(last.rows, t.tileLength, tiles - 1);
        const uint32_t shard = t.sp - 1;
        const unsigned __int128 wide = (static_cast<unsigned __int128>(shard) * n + last.start +
                                        static_cast<unsigned __int128>(tiles - 1) * t.tileLength) *
                                       t.hDim;
        const uint64_t go = au::GoGmOffset(t, shard, last.start, tiles - 1);
        Expect(static_cast<unsigned __int128>(go) == wide, "64-bit go offset wrong");
        Expect(go > UINT32_MAX, "largest go offset should need more than 32 bits");
        Expect(go + uint64_t{tailRows} * t.hDim == uint64_t{t.sp} * n * t.hDim,
               "last go read does not end at sp*N*D");
        ++stats.configs;
    }
}

void CheckRejections()
{
    currentConfig = "rejections";
    au::AttentionUpdateTiling t{};
    const auto status = [&](uint64_t sp, uint64_t n, uint64_t d, uint32_t e, uint32_t u,
                            uint32_t c) {
        return au::ComputeTiling(sp, n, d, e, u, c, 196608, &t);
    };
    using S = au::TilingStatus;
    Expect(status(0, 8, 128, 4, 0, 40) == S::kBadSp, "sp=0");
    Expect(status(17, 8, 128, 4, 0, 40) == S::kBadSp, "sp=17");
    Expect(status(2, 0, 128, 4, 0, 40) == S::kBadTotalLength, "N=0");
    Expect(status(2, au::kMaxTotalLength + 1, 128, 4, 0, 40) == S::kBadTotalLength, "N too big");
    Expect(status(2, 8, 0, 4, 0, 40) == S::kBadHeadDim, "D=0");
    Expect(status(2, 8, 12, 4, 0, 40) == S::kBadHeadDim, "D=12");
    Expect(status(2, 8, 520, 4, 0, 40) == S::kBadHeadDim, "D=520");
    Expect(status(2, 8, 128, 8, 0, 40) == S::kBadElemBytes, "elem=8");
    Expect(status(2, 8, 128, 4, 2, 40) == S::kBadUpdateType, "update_type=2");
    Expect(status(2, 8, 128, 4, 0, 0) == S::kBadCoreNum, "cores=0");
    stats.configs += 10;
}

}  // namespace

int main()
{
    SweepGrid();
    CheckLargestShapes();
    CheckRejections();
    std::printf("configs=%llu tiled=%llu rejected_ub=%llu tiles=%llu intervals=%llu "
                "elements_counted=%llu failures=%llu\n",
                static_cast<unsigned long long>(stats.configs),
                static_cast<unsigned long long>(stats.tiled),
                static_cast<unsigned long long>(stats.rejectedUb),
                static_cast<unsigned long long>(stats.tiles),
                static_cast<unsigned long long>(stats.intervals),
                static_cast<unsigned long long>(stats.elementsCounted),
                static_cast<unsigned long long>(stats.failures));
    return stats.failures == 0 ? 0 : 1;
}
