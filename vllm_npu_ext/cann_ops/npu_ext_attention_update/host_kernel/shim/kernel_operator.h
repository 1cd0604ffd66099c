/**
 * Host stand-in for AscendC's kernel_operator.h: the API subset NpuExtAttentionUpdate's kernel
 * calls, so that g++ compiles op_kernel/ unchanged and runs it on a simulated vector core.
 *
 *   ascendc_host/runtime.h       launch state: GM tensors, the core's UB, rule violations
 *   ascendc_host/types.h         half, bfloat16_t and their fp32 conversions
 *   ascendc_host/tensor.h        GlobalTensor, LocalTensor, which unit may touch a buffer
 *   ascendc_host/pipe.h          TPipe, TQue, TBuf
 *   ascendc_host/data_copy.h     DataCopyPad (GM<->UB) with DataCopyExtParams
 *   ascendc_host/vector.h        Add, Sub, Div, Max, Adds, Maxs, Exp, Ln, Axpy, Duplicate, Cast
 *   ascendc_host/kernel_entry.h  GM_ADDR, GET_TILING_DATA, TILING_KEY_IS, GetBlockIdx,
 *                                PipeBarrier, SetFlag/WaitFlag
 *
 * A call the kernel makes that is not here does not compile: the shim grows only with the
 * kernel, each call with its documented rules (see each header). The documentation followed
 * is CANN asc-devkit's API reference, docs/zh/api/SIMD-API/ (通用说明和约束; 基础API:
 * 数据搬运 DataCopyPad, 资源管理 TPipe/TQue/TBuf, Memory矢量计算, 同步控制/核内同步,
 * Kernel-Tiling GET_TILING_DATA/TILING_KEY_IS).
 */
#ifndef KERNEL_OPERATOR_H
#define KERNEL_OPERATOR_H

#include "ascendc_host/runtime.h"
#include "ascendc_host/types.h"
#include "ascendc_host/tensor.h"
#include "ascendc_host/pipe.h"
#include "ascendc_host/data_copy.h"
#include "ascendc_host/vector.h"
#include "ascendc_host/kernel_entry.h"

#endif  // KERNEL_OPERATOR_H
