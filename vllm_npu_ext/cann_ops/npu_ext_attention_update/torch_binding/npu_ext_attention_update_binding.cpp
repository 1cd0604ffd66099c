/**
 * NPU (PrivateUse1) kernel of torch.ops.npu_ext_cann.npu_ext_attention_update.
 *
 * The schema and the fake kernel are defined in Python (vllm_npu_ext/cann_ops/binding.py);
 * this file only adds the PrivateUse1 implementation, which calls our aclnn functions the
 * way torch_npu's op-plugin calls its own: phase 1 (workspace size, parameter checks) on the
 * host now, phase 2 (the launch) through OpCommand's task queue on the current NPU stream.
 *
 *   lse fp32 [sp, N], go [sp, N, D], update_type 0|1
 *   -> out [N, D] in go's dtype, lse_out fp32 [N] (written only when update_type == 1;
 *      left uninitialised otherwise, as the public op returns None for it then)
 */
#include <ATen/ATen.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <memory>
#include <tuple>

#include "aclnn_library.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"
#include "torch_npu/csrc/framework/OpCommand.h"

namespace npu_ext_cann {
namespace {

constexpr const char *kOpName = "aclnnNpuExtAttentionUpdate";

/** The aclTensors and the workspace must outlive the queued launch: the task owns them. */
struct LaunchState {
    AclTensorPtr lse;
    AclTensorPtr go;
    AclTensorPtr out;
    AclTensorPtr lseOut;
    at::Tensor workspace;
    uint64_t workspaceSize = 0;
    aclOpExecutor *executor = nullptr;
};

void Launch(const std::shared_ptr<LaunchState> &state)
{
    const AttentionUpdateApi &api = LoadAttentionUpdateApi();
    const aclrtStream stream = c10_npu::getCurrentNPUStream().stream(false);
    at_npu::native::OpCommand command;
    command.Name(kOpName);
    command.SetCustomHandler([state, stream, run = api.run]() -> int {
        void *workspace = state->workspaceSize == 0 ? nullptr : state->workspace.data_ptr();
        const aclnnStatus status = run(workspace, state->workspaceSize, state->executor, stream);
        TORCH_CHECK(status == 0, kOpName, " failed with status ", status);
        return status;
    });
    command.Run();
}

std::tuple<at::Tensor, at::Tensor> AttentionUpdateNpu(const at::Tensor &lse, const at::Tensor &go,
                                                      int64_t update_type)
{
    // The aclnn layer checks everything (shapes, dtypes, ranges); only what is needed to
    // allocate the outputs is checked here.
    TORCH_CHECK(go.dim() == 3, "go must be 3-D [sp, N, D], got ", go.sizes());
    TORCH_CHECK(update_type == 0 || update_type == 1, "update_type must be 0 or 1");
    at::Tensor out = at::empty({go.size(1), go.size(2)}, go.options());
    at::Tensor lse_out = at::empty({go.size(1)}, lse.options());
    if (go.size(1) == 0) {
        return std::make_tuple(out, lse_out);
    }

    auto state = std::make_shared<LaunchState>();
    state->lse = ToAclTensor(lse);
    state->go = ToAclTensor(go);
    state->out = ToAclTensor(out);
    state->lseOut = update_type == 1 ? ToAclTensor(lse_out) : AclTensorPtr();
    const aclnnStatus status = LoadAttentionUpdateApi().getWorkspaceSize(
        state->lse.get(), state->go.get(), update_type, state->out.get(), state->lseOut.get(),
        &state->workspaceSize, &state->executor);
    TORCH_CHECK(status == 0, kOpName, "GetWorkspaceSize failed with status ", status,
                " (see the CANN log for the parameter check that failed)");
    if (state->workspaceSize != 0) {
        state->workspace = at::empty({static_cast<int64_t>(state->workspaceSize)},
                                     lse.options().dtype(at::kByte));
    }
    Launch(state);
    return std::make_tuple(out, lse_out);
}

}  // namespace
}  // namespace npu_ext_cann

TORCH_LIBRARY_IMPL(npu_ext_cann, PrivateUse1, m)
{
    m.impl("npu_ext_attention_update", &npu_ext_cann::AttentionUpdateNpu);
}

// Importing vllm_npu_ext._cann_C runs the registration above; the module has no functions.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, module)
{
    module.doc() = "PrivateUse1 kernel of torch.ops.npu_ext_cann.npu_ext_attention_update";
}
