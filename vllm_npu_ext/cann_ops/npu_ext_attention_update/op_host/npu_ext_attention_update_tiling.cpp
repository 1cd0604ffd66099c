/**
 * Tiling of NpuExtAttentionUpdate.
 *
 * sp, N (totalLength) and D come from the input shapes, lse [sp, N] and go [sp, N, D]:
 * sp is lse's dim 0, not an attribute. The rows are split over the vector cores and each
 * core's rows are walked in tiles sized to the unified buffer; both computations live in
 * op_kernel/attention_update_tiling_math.h, which the host tests compile and sweep.
 */
#include "npu_ext_attention_update_tiling.h"

#include "attention_update_tiling_math.h"
#include "npu_ext_attention_update_io.h"
#include "register/op_def_registry.h"
#include "tiling/platform/platform_ascendc.h"

namespace optiling {
namespace {

using npu_ext_au::AttentionUpdateTiling;
using npu_ext_au::ComputeTiling;
using npu_ext_au::TilingStatus;
using npu_ext_au::kGoIndex;
using npu_ext_au::kGoRank;
using npu_ext_au::kLseIndex;
using npu_ext_au::kLseRank;
using npu_ext_au::kUpdateTypeAttrIndex;

// One kernel binary per go dtype; the same literals are in op_kernel's TILING_KEY_IS.
constexpr uint64_t kTilingKeyFloat = 1;
constexpr uint64_t kTilingKeyHalf = 2;
constexpr uint64_t kTilingKeyBf16 = 3;

/** Element size and tiling key of go's dtype; false for a dtype the kernel lacks. */
bool GoDtype(ge::DataType dtype, uint32_t *elemBytes, uint64_t *tilingKey)
{
    switch (dtype) {
        case ge::DT_FLOAT:
            *elemBytes = 4;
            *tilingKey = kTilingKeyFloat;
            return true;
        case ge::DT_FLOAT16:
            *elemBytes = 2;
            *tilingKey = kTilingKeyHalf;
            return true;
        case ge::DT_BF16:
            *elemBytes = 2;
            *tilingKey = kTilingKeyBf16;
            return true;
        default:
            return false;
    }
}

/** lse [sp, N] and go [sp, N, D] with matching sp and N. */
bool ShapesAgree(const gert::Shape &lse, const gert::Shape &go)
{
    return lse.GetDimNum() == kLseRank && go.GetDimNum() == kGoRank &&
           go.GetDim(0) == lse.GetDim(0) && go.GetDim(1) == lse.GetDim(1);
}

void SaveTiling(const AttentionUpdateTiling &tiling, gert::TilingContext *context)
{
    NpuExtAttentionUpdateTilingData data;
    data.set_sp(tiling.sp);
    data.set_totalLength(tiling.totalLength);
    data.set_hDim(tiling.hDim);
    data.set_goElemBytes(tiling.goElemBytes);
    data.set_updateType(tiling.updateType);
    data.set_usedCoreNum(tiling.usedCoreNum);
    data.set_formerNum(tiling.formerNum);
    data.set_formerLength(tiling.formerLength);
    data.set_tailLength(tiling.tailLength);
    data.set_tileLength(tiling.tileLength);
    data.SaveToBuffer(context->GetRawTilingData()->GetData(),
                      context->GetRawTilingData()->GetCapacity());
    context->GetRawTilingData()->SetDataSize(data.GetDataSize());
}

}  // namespace

ge::graphStatus NpuExtAttentionUpdateTiling(gert::TilingContext *context)
{
    const gert::StorageShape *lseShape = context->GetInputShape(kLseIndex);
    const gert::StorageShape *goShape = context->GetInputShape(kGoIndex);
    const auto *goDesc = context->GetInputDesc(kGoIndex);
    const gert::RuntimeAttrs *attrs = context->GetAttrs();
    if (lseShape == nullptr || goShape == nullptr || goDesc == nullptr || attrs == nullptr) {
        return ge::GRAPH_FAILED;
    }
    const gert::Shape &lse = lseShape->GetStorageShape();
    const gert::Shape &go = goShape->GetStorageShape();
    const int64_t *updateType = attrs->GetAttrPointer<int64_t>(kUpdateTypeAttrIndex);
    uint32_t goElemBytes = 0;
    uint64_t tilingKey = 0;
    if (!ShapesAgree(lse, go) || updateType == nullptr || *updateType < 0 || *updateType > 1 ||
        !GoDtype(goDesc->GetDataType(), &goElemBytes, &tilingKey)) {
        return ge::GRAPH_FAILED;
    }

    const auto platform = platform_ascendc::PlatformAscendC(context->GetPlatformInfo());
    uint64_t ubBytes = 0;
    platform.GetCoreMemSize(platform_ascendc::CoreMemType::UB, ubBytes);
    AttentionUpdateTiling tiling{};
    // Negative dims become huge unsigned values here and are rejected, not truncated.
    const TilingStatus status = ComputeTiling(
        static_cast<uint64_t>(lse.GetDim(0)), static_cast<uint64_t>(lse.GetDim(1)),
        static_cast<uint64_t>(go.GetDim(2)), goElemBytes, static_cast<uint32_t>(*updateType),
        platform.GetCoreNumAiv(), ubBytes, &tiling);
    if (status != TilingStatus::kOk) {
        return ge::GRAPH_FAILED;
    }

    SaveTiling(tiling, context);
    context->SetTilingKey(tilingKey);
    context->SetBlockDim(tiling.usedCoreNum);
    size_t *workspaces = context->GetWorkspaceSizes(1);
    workspaces[0] = platform.GetLibApiWorkSpaceSize();  // AscendC's system workspace only
    return ge::GRAPH_SUCCESS;
}

}  // namespace optiling
