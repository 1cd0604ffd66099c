/**
 * Tiling data of NpuExtAttentionUpdate as CANN registers it for the kernel.
 *
 * The fields, their order and their meaning are those of
 * npu_ext_au::AttentionUpdateTiling (op_kernel/attention_update_tiling_math.h);
 * the host tests check that the two lists agree.
 */
#ifndef NPU_EXT_ATTENTION_UPDATE_TILING_H
#define NPU_EXT_ATTENTION_UPDATE_TILING_H

#include "register/tilingdata_base.h"

namespace optiling {

BEGIN_TILING_DATA_DEF(NpuExtAttentionUpdateTilingData)
TILING_DATA_FIELD_DEF(uint32_t, sp);
TILING_DATA_FIELD_DEF(uint32_t, totalLength);
TILING_DATA_FIELD_DEF(uint32_t, hDim);
TILING_DATA_FIELD_DEF(uint32_t, goElemBytes);
TILING_DATA_FIELD_DEF(uint32_t, updateType);
TILING_DATA_FIELD_DEF(uint32_t, usedCoreNum);
TILING_DATA_FIELD_DEF(uint32_t, formerNum);
TILING_DATA_FIELD_DEF(uint32_t, formerLength);
TILING_DATA_FIELD_DEF(uint32_t, tailLength);
TILING_DATA_FIELD_DEF(uint32_t, tileLength);
END_TILING_DATA_DEF;

REGISTER_TILING_DATA_CLASS(NpuExtAttentionUpdate, NpuExtAttentionUpdateTilingData)

/** Tiling of one launch: reads the shapes, the dtype, the attr and the platform (cores, UB). */
ge::graphStatus NpuExtAttentionUpdateTiling(gert::TilingContext *context);

}  // namespace optiling

#endif  // NPU_EXT_ATTENTION_UPDATE_TILING_H
