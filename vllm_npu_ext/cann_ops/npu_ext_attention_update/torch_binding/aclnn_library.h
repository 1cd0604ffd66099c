/**
 * Finding our aclnn functions at run time and wrapping torch tensors as aclTensors.
 *
 * The operator package may be installed after this extension was built and anywhere on
 * ASCEND_CUSTOM_OPP_PATH, so the two aclnn entry points are looked up with dlopen/dlsym in
 * <entry>/op_api/lib/libcust_opapi.so for each entry, first hit wins (CANN's own search
 * order). Their names are ours alone, so no other vendor's library can answer for them.
 */
#ifndef NPU_EXT_ATTENTION_UPDATE_ACLNN_LIBRARY_H
#define NPU_EXT_ATTENTION_UPDATE_ACLNN_LIBRARY_H

#include <ATen/Tensor.h>

#include <memory>

#include "aclnn/acl_meta.h"
#include "aclnn_npu_ext_attention_update.h"

namespace npu_ext_cann {

/** The two-phase aclnn API of NpuExtAttentionUpdate. */
struct AttentionUpdateApi {
    decltype(&aclnnNpuExtAttentionUpdateGetWorkspaceSize) getWorkspaceSize = nullptr;
    decltype(&aclnnNpuExtAttentionUpdate) run = nullptr;
};

/** The API from the first libcust_opapi.so on ASCEND_CUSTOM_OPP_PATH that has it; throws
 * (c10::Error naming the searched paths) when none does. Looked up once per process. */
const AttentionUpdateApi &LoadAttentionUpdateApi();

struct AclTensorDeleter {
    void operator()(aclTensor *tensor) const;
};
using AclTensorPtr = std::unique_ptr<aclTensor, AclTensorDeleter>;

/** An ND aclTensor viewing `tensor` (sizes, strides and offset kept); null if undefined. */
AclTensorPtr ToAclTensor(const at::Tensor &tensor);

}  // namespace npu_ext_cann

#endif  // NPU_EXT_ATTENTION_UPDATE_ACLNN_LIBRARY_H
