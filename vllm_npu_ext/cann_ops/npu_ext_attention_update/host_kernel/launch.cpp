/**
 * Host launch of NpuExtAttentionUpdate, as the CANN runtime launches it on the NPU:
 *   1. op_host's tiling function (op_host/npu_ext_attention_update_tiling.cpp, unchanged)
 *      on a TilingContext with the shapes, go's dtype, update_type and the platform's vector
 *      core count and UB size; it sets the tiling data, tiling key, block dim and workspace;
 *   2. the kernel entry (op_kernel/npu_ext_attention_update.cpp, unchanged) once per block
 *      index 0..blockDim-1, each on a fresh simulated vector core (its own poisoned UB);
 *   3. the launch-wide checks: the kernel declared itself vector-only (blockDim counts vector
 *      cores), and every byte of out (and of lse_out for update_type 1, none for 0) was
 *      written exactly once, so no element is lost and no two cores or tiles race.
 * The kernel may address only the four tensors and the tiling data; the workspace it is
 * given is null (op_host asks for AscendC's system workspace only, which the kernel never
 * touches). C interface for ctypes (host_kernel/library.py).
 */
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "ascendc_host/graph.h"
#include "ascendc_host/runtime.h"
#include "attention_update_tiling_math.h"
#include "npu_ext_attention_update_io.h"
#include "npu_ext_attention_update_tiling.h"

extern "C" void npu_ext_attention_update(uint8_t *lse, uint8_t *go, uint8_t *out, uint8_t *lse_out,
                                         uint8_t *workspace, uint8_t *tiling);

namespace {

namespace au = npu_ext_au;
using optiling::DefaultTilingData;

enum Status { kOk = 0, kTilingFailed = 1, kBadArgument = 2, kViolation = 3 };
// What GetLibApiWorkSpaceSize reports here: a stand-in size (the real one is the platform's),
// passed through to the workspace size; the kernel never touches the system workspace.
constexpr uint32_t kLibApiWorkspaceBytes = 16 * 1024 * 1024;
constexpr int kAivOnly = 0;  // KERNEL_TYPE_AIV_ONLY in ascendc_host/kernel_entry.h
constexpr size_t kMaxTilingWords = 16;
constexpr size_t kOutRegion = 2;  // AddRegion order in npu_ext_au_host_launch

thread_local std::string lastError;

struct GoType {
    ge::DataType dtype;
    uint32_t bytes;
};

bool GoTypeOf(int32_t code, GoType *type)
{
    static const GoType kTypes[] = {{ge::DT_FLOAT, 4}, {ge::DT_FLOAT16, 2}, {ge::DT_BF16, 2}};
    if (code < 0 || code > 2) {
        return false;
    }
    *type = kTypes[code];
    return true;
}

std::unique_ptr<gert::TilingContext> MakeContext(uint64_t sp, uint64_t rows, uint64_t hDim,
                                                 ge::DataType goDtype, int64_t updateType,
                                                 uint32_t coreNum, uint64_t ubBytes)
{
    const auto dim = [](uint64_t value) { return static_cast<int64_t>(value); };
    std::vector<gert::StorageShape> shapes(2);
    shapes[au::kLseIndex] = gert::StorageShape(gert::Shape({dim(sp), dim(rows)}));
    shapes[au::kGoIndex] = gert::StorageShape(gert::Shape({dim(sp), dim(rows), dim(hDim)}));
    std::vector<gert::CompileTimeTensorDesc> descs(2, gert::CompileTimeTensorDesc(ge::DT_FLOAT));
    descs[au::kGoIndex] = gert::CompileTimeTensorDesc(goDtype);
    std::vector<int64_t> attrs(au::kUpdateTypeAttrIndex + 1, 0);
    attrs[au::kUpdateTypeAttrIndex] = updateType;
    const fe::PlatFormInfos platform{coreNum, ubBytes, kLibApiWorkspaceBytes};
    return std::make_unique<gert::TilingContext>(shapes, descs, gert::RuntimeAttrs(attrs),
                                                 platform);
}

}  // namespace

extern "C" {

/** What the tiling chose and what the launch did; filled by both entry points below. */
struct NpuExtAuLaunchInfo {
    uint64_t tilingKey;
    uint64_t workspaceBytes;
    uint32_t blockDim;
    uint32_t tilingWords;              // uint32 fields of the tiling data, in order
    uint32_t tiling[kMaxTilingWords];
    uint32_t ubPeakBytes;              // the most UB any core's TPipe handed out
    uint32_t outCopies;                // UB->GM copies into out
    uint32_t shortOutCopies;           // ... of fewer than tileLength rows (tail tiles)
};

const char *npu_ext_au_host_last_error() { return lastError.c_str(); }

/** UB bytes of one tile (attention_update_tiling_math.h), for tests choosing UB sizes. */
uint64_t npu_ext_au_host_ub_bytes_of_tile(uint32_t sp, uint32_t hDim, uint32_t goElemBytes,
                                          uint32_t tileLength)
{
    return au::UbBytesOfTile(sp, hDim, goElemBytes, tileLength, nullptr);
}

/** op_host's tiling for lse [sp, rows], go [sp, rows, hDim]; returns a Status. */
int npu_ext_au_host_tiling(uint64_t sp, uint64_t rows, uint64_t hDim, int32_t goDtype,
                           int64_t updateType, uint32_t coreNum, uint64_t ubBytes,
                           NpuExtAuLaunchInfo *info)
{
    GoType type{};
    if (info == nullptr || !GoTypeOf(goDtype, &type)) {
        lastError = "go dtype code must be 0 (fp32), 1 (fp16) or 2 (bf16)";
        return kBadArgument;
    }
    std::memset(info, 0, sizeof(*info));
    auto context = MakeContext(sp, rows, hDim, type.dtype, updateType, coreNum, ubBytes);
    if (optiling::NpuExtAttentionUpdateTiling(context.get()) != ge::GRAPH_SUCCESS) {
        lastError = "op_host tiling returned GRAPH_FAILED";
        return kTilingFailed;
    }
    const size_t bytes = context->GetRawTilingData()->GetDataSize();
    static_assert(sizeof(DefaultTilingData) <= kMaxTilingWords * sizeof(uint32_t),
                  "NpuExtAuLaunchInfo::tiling is too small for the tiling data");
    info->tilingKey = context->GetTilingKey();
    info->blockDim = context->GetBlockDim();
    info->tilingWords = static_cast<uint32_t>(bytes / sizeof(uint32_t));
    std::memcpy(info->tiling, context->GetRawTilingData()->GetData(),
                std::min(bytes, sizeof(info->tiling)));
    const auto &workspaces = context->Workspaces();
    info->workspaceBytes = workspaces.empty() ? 0 : workspaces[0];
    return kOk;
}

}  // extern "C"

namespace {

void AddRegion(const char *name, const void *base, uint64_t bytes, bool writable)
{
    ascendc_host::GmRegion region;
    region.name = name;
    region.base = static_cast<uint8_t *>(const_cast<void *>(base));
    region.bytes = bytes;
    region.writable = writable;
    region.writes.assign(writable ? bytes : 0, 0);
    ascendc_host::Launch().gm.push_back(std::move(region));
}

/** Every byte of `name` written `times` times, or a violation naming the first that is not. */
void CheckWrites(const char *name, uint8_t times)
{
    for (const ascendc_host::GmRegion &region : ascendc_host::Launch().gm) {
        if (region.name != name) {
            continue;
        }
        for (uint64_t i = 0; i < region.writes.size(); ++i) {
            if (region.writes[i] != times) {
                throw ascendc_host::Violation(
                    "launch: byte " + std::to_string(i) + " of " + name + " written " +
                    std::to_string(region.writes[i]) + " times, expected " + std::to_string(times));
            }
        }
    }
}

void RunCores(const NpuExtAuLaunchInfo &info, uint64_t ubBytes, uint8_t *const tensors[4],
              uint8_t *tiling, int64_t updateType)
{
    for (uint32_t block = 0; block < info.blockDim; ++block) {
        ascendc_host::BeginCore(block, info.blockDim, ubBytes);
        npu_ext_attention_update(tensors[0], tensors[1], tensors[2], tensors[3], nullptr, tiling);
    }
    if (ascendc_host::Launch().taskType != kAivOnly) {
        throw ascendc_host::Violation("launch: the tiling sized blockDim by vector cores, but the "
                                      "kernel did not declare KERNEL_TYPE_AIV_ONLY");
    }
    CheckWrites("out", 1);
    CheckWrites("lse_out", updateType == 1 ? 1 : 0);
}

}  // namespace

extern "C" {

/**
 * Run the kernel on contiguous host arrays: lse fp32 [sp, rows], go [sp, rows, hDim]
 * (fp32, or fp16/bf16 bits), out [rows, hDim] like go, lseOut fp32 [rows] (written only for
 * updateType 1). Returns a Status; the message of a failure is in npu_ext_au_host_last_error.
 */
int npu_ext_au_host_launch(const float *lse, const void *go, void *out, float *lseOut,
                           uint64_t sp, uint64_t rows, uint64_t hDim, int32_t goDtype,
                           int64_t updateType, uint32_t coreNum, uint64_t ubBytes,
                           NpuExtAuLaunchInfo *info)
{
    const int status =
        npu_ext_au_host_tiling(sp, rows, hDim, goDtype, updateType, coreNum, ubBytes, info);
    if (status != kOk) {
        return status;
    }
    GoType type{};
    GoTypeOf(goDtype, &type);
    std::vector<uint8_t> tiling(info->tilingWords * sizeof(uint32_t));
    std::memcpy(tiling.data(), info->tiling, tiling.size());
    ascendc_host::LaunchState &launch = ascendc_host::Launch();
    launch = ascendc_host::LaunchState();
    launch.tilingKey = info->tilingKey;
    AddRegion("lse", lse, sp * rows * sizeof(float), false);
    AddRegion("go", go, sp * rows * hDim * type.bytes, false);
    AddRegion("out", out, rows * hDim * type.bytes, true);
    AddRegion("lse_out", lseOut, rows * sizeof(float), true);
    AddRegion("tiling", tiling.data(), tiling.size(), false);
    const auto gm = [](const void *address) {
        return static_cast<uint8_t *>(const_cast<void *>(address));
    };
    uint8_t *const tensors[4] = {gm(lse), gm(go), gm(out), gm(lseOut)};
    int result = kOk;
    try {
        RunCores(*info, ubBytes, tensors, tiling.data(), updateType);
        DefaultTilingData data;
        std::memcpy(static_cast<void *>(&data), tiling.data(), sizeof(data));
        const uint64_t fullTile = static_cast<uint64_t>(data.tileLength) * data.hDim * type.bytes;
        for (const uint64_t bytes : launch.gm[kOutRegion].copyBytes) {
            info->outCopies += 1;
            info->shortOutCopies += bytes < fullTile;
        }
        info->ubPeakBytes = launch.ubPeak;
    } catch (const std::exception &error) {
        lastError = error.what();
        result = kViolation;
    }
    launch = ascendc_host::LaunchState();  // no pointers into the caller's arrays outlive it
    return result;
}

}  // extern "C"
