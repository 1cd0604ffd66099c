/**
 * Positions of NpuExtAttentionUpdate's inputs, outputs and attribute, in the order of the op
 * definition (npu_ext_attention_update_def.cpp), and the ranks of its inputs.
 */
#ifndef NPU_EXT_ATTENTION_UPDATE_IO_H
#define NPU_EXT_ATTENTION_UPDATE_IO_H

#include <cstddef>

namespace npu_ext_au {

constexpr size_t kLseIndex = 0;             // input lse     fp32 [sp, N]
constexpr size_t kGoIndex = 1;              // input go      [sp, N, D]
constexpr size_t kOutIndex = 0;             // output out    [N, D]
constexpr size_t kLseOutIndex = 1;          // output lse_out fp32 [N]
constexpr size_t kUpdateTypeAttrIndex = 0;  // attr update_type
constexpr size_t kLseRank = 2;
constexpr size_t kGoRank = 3;

}  // namespace npu_ext_au

#endif  // NPU_EXT_ATTENTION_UPDATE_IO_H
